// Replays files through a fuzz target's LLVMFuzzerTestOneInput without libFuzzer, so the gcc
// builds (Release and ASan) run every committed regression input and every seed as a plain
// test: a broken contract or a sanitizer report aborts with the file's name printed first.
// Usage: px_fuzz_replay_<target> DIR|FILE... (a missing directory holds nothing).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    fs::path p = argv[i];
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else if (fs::is_directory(p, ec)) {
      for (auto& entry : fs::recursive_directory_iterator(p))
        if (entry.is_regular_file() && entry.path().filename().string()[0] != '.')
          files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    fprintf(stderr, "replaying %s\n", file.c_str());
    std::ifstream in(file, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    // A copy of exactly the input's size, as libFuzzer passes it: ASan sees a read past it.
    std::vector<uint8_t> exact(bytes);
    LLVMFuzzerTestOneInput(exact.empty() ? nullptr : exact.data(), exact.size());
  }
  printf("replayed %zu inputs\n", files.size());
  if (files.empty()) {
    fprintf(stderr, "no inputs found\n");
    return 1;
  }
  return 0;
}
