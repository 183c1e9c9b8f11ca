// Software prefetch of one row. Sparse work touches rows scattered over large buffers (a
// shard, the workers' gradients), where the hardware prefetcher cannot guess the next one;
// asking for a row a few entries ahead hides most of the cache misses.
#pragma once

#include <cstddef>

namespace px {

constexpr size_t kPrefetchAhead = 6;  // entries ahead

inline void prefetch_bytes(const void* p, size_t bytes) {
  const char* at = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(at + i);
}

inline void prefetch_bytes_for_write(void* p, size_t bytes) {
  char* at = static_cast<char*>(p);
  for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(at + i, 1);
}

}  // namespace px
