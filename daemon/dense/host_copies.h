// The host copies of the steps that move bytes rather than reduce them (broadcast,
// allgather(v), alltoall(v)): a batch of memcpys, on the loop when small, on the pool
// otherwise.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "daemon/common/offload.h"

namespace px {

// Copies of at most this many bytes in all run on the loop thread: a pool hop costs more.
constexpr uint64_t kInlineCopyBytes = 64 * 1024;

// One memcpy of a batch (host memory; copy_step.cc takes device pointers through the GPU
// backend in the same shape).
struct HostCopy {
  char* to;
  const char* from;
  uint64_t bytes;
};

// Every copy (a copy onto itself or of no bytes is skipped), then `then` on the loop.
inline void run_host_copies(const Offload& offload, std::vector<HostCopy> copies,
                            std::function<void()> then) {
  uint64_t total = 0;
  for (const HostCopy& c : copies) total += c.bytes;
  auto work = [copies = std::move(copies)] {
    for (const HostCopy& c : copies)
      if (c.to != c.from && c.bytes > 0) std::memcpy(c.to, c.from, c.bytes);
  };
  offload.run(total > kInlineCopyBytes, std::move(work), std::move(then));
}

}  // namespace px
