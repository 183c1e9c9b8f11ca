#include "sharding/checkpoint_generations.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "sharding/checkpoint.h"

namespace px {
namespace {

namespace fs = std::filesystem;
constexpr const char* kPartial = ".partial";
constexpr int kDigits = 10;

std::string number(uint64_t n) {
  char text[32];
  snprintf(text, sizeof text, "%0*llu", kDigits, static_cast<unsigned long long>(n));
  return text;
}

// n if name is a generation's folder name (all digits, optionally ".partial"), else 0.
uint64_t parse(const std::string& name, bool* partial) {
  std::string digits = name;
  *partial = digits.size() > strlen(kPartial) &&
             digits.compare(digits.size() - strlen(kPartial), std::string::npos, kPartial) == 0;
  if (*partial) digits.resize(digits.size() - strlen(kPartial));
  if (digits.empty() || digits.size() > 19) return 0;
  uint64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  return n;
}

struct Listing {
  std::vector<uint64_t> complete, partial;  // unordered
};

Listing list(const std::string& dir, const std::string& job) {
  Listing out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(generations_dir(dir, job), ec)) {
    bool partial = false;
    uint64_t n = parse(e.path().filename().string(), &partial);
    if (n == 0 || !e.is_directory(ec)) continue;
    (partial ? out.partial : out.complete).push_back(n);
  }
  return out;
}

void fsync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string generations_dir(const std::string& dir, const std::string& job) {
  return dir + "/" + safe_name(job);
}

std::string partial_generation_dir(const std::string& dir, const std::string& job, uint64_t n) {
  return generations_dir(dir, job) + "/" + number(n) + kPartial;
}

std::string generation_dir(const std::string& dir, const std::string& job, uint64_t n) {
  return generations_dir(dir, job) + "/" + number(n);
}

uint64_t next_generation(const std::string& dir, const std::string& job) {
  Listing l = list(dir, job);
  uint64_t top = 0;
  for (uint64_t n : l.complete) top = std::max(top, n);
  for (uint64_t n : l.partial) top = std::max(top, n);
  return top + 1;
}

uint64_t newest_generation(const std::string& dir, const std::string& job) {
  uint64_t top = 0;
  for (uint64_t n : list(dir, job).complete) top = std::max(top, n);
  return top;
}

bool begin_generation(const std::string& dir, const std::string& job, uint64_t n,
                      std::string* error) {
  std::error_code ec;
  std::string path = partial_generation_dir(dir, job, n);
  fs::create_directories(path, ec);
  if (ec) {
    *error = "cannot create " + path + ": " + ec.message();
    return false;
  }
  return true;
}

bool commit_generation(const std::string& dir, const std::string& job, uint64_t n,
                       std::string* error) {
  std::string from = partial_generation_dir(dir, job, n), to = generation_dir(dir, job, n);
  if (::rename(from.c_str(), to.c_str()) != 0) {
    *error = "cannot rename " + from + " to " + to + ": " + strerror(errno);
    return false;
  }
  fsync_dir(generations_dir(dir, job));
  return true;
}

void discard_generation(const std::string& dir, const std::string& job, uint64_t n) {
  std::error_code ec;
  fs::remove_all(partial_generation_dir(dir, job, n), ec);
}

int prune_generations(const std::string& dir, const std::string& job, int keep) {
  Listing l = list(dir, job);
  std::sort(l.complete.begin(), l.complete.end());
  uint64_t newest = l.complete.empty() ? 0 : l.complete.back();
  int removed = 0;
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keep) < l.complete.size(); ++i)
    if (fs::remove_all(generation_dir(dir, job, l.complete[i]), ec) > 0) ++removed;
  for (uint64_t n : l.partial)
    if (n < newest && fs::remove_all(partial_generation_dir(dir, job, n), ec) > 0) ++removed;
  return removed;
}

std::string restore_manifest(const std::string& dir, const std::string& job,
                             const std::string& variable) {
  std::vector<std::string> candidates = {checkpoint_stem(dir, job, variable) + ".manifest"};
  if (uint64_t n = newest_generation(dir, job))
    candidates.push_back(checkpoint_stem(generation_dir(dir, job, n), job, variable) + ".manifest");
  std::string best;
  fs::file_time_type best_time{};
  for (const std::string& path : candidates) {
    std::error_code ec;
    fs::file_time_type t = fs::last_write_time(path, ec);
    if (ec) continue;
    if (best.empty() || t > best_time) {
      best = path;
      best_time = t;
    }
  }
  return best;
}

}  // namespace px
