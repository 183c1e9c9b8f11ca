// What every fuzz target shares: the contract check (a broken contract aborts, which
// libFuzzer and the replay driver both report with the input that did it) and a memfd
// file for decoders that read a path.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

// Not assert(): the Release builds that replay the regression inputs define NDEBUG.
#define PX_FUZZ_CHECK(condition)                                                              \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      fprintf(stderr, "fuzz contract broken at %s:%d: %s\n", __FILE__, __LINE__, #condition); \
      abort();                                                                                \
    }                                                                                         \
  } while (0)

namespace px::fuzz {

// The input as an anonymous in-memory file, for decoders that open a path: no disk I/O,
// nothing left behind, the same bytes at offset 0 for every open of path().
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("px-fuzz-input", MFD_CLOEXEC);
    PX_FUZZ_CHECK(fd_ >= 0);
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::write(fd_, data + done, size - done);
      PX_FUZZ_CHECK(n > 0);
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

// Where targets put what they read, so that the reads are not optimised away.
inline volatile uint64_t sink = 0;

// Reads every byte of [data, data + n): under ASan an out-of-bounds view is reported here,
// where the target claims it is readable, not later or never.
inline uint64_t touch(const void* data, size_t n) {
  const auto* p = static_cast<const volatile uint8_t*>(data);
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i];
  return sum;
}

}  // namespace px::fuzz
