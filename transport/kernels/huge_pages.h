// Large buffers on 2 MiB pages where the kernel allows it (transparent huge pages in
// "madvise" mode, Debian's default). Each first touch of a 4 KiB page is a page fault, and
// on a virtual machine a costly one: on the development VM 400 MB first touched took
// 1.1-1.8 s on 4 KiB pages and 0.04-0.05 s on huge pages (README: Benchmarks, what a move
// costs). Shard stores, checkpoint images and a moving table's exchange are hundreds of
// megabytes, touched once.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace px {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Asks for huge pages over the whole pages inside [data, data + bytes): a no-op below
// kHugePageBytes, and a hint the kernel may ignore (THP "never": 4 KiB pages as before).
inline void advise_huge_pages(void* data, size_t bytes) {
  if (bytes < kHugePageBytes) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// v.reserve(n), new storage advised before anything touches it.
template <typename T, typename A>
void reserve_on_huge_pages(std::vector<T, A>& v, size_t n) {
  if (n <= v.capacity()) return;
  v.reserve(n);
  advise_huge_pages(v.data(), n * sizeof(T));
}

// v.resize(n), new storage advised before the resize fills it.
template <typename T, typename A>
void resize_on_huge_pages(std::vector<T, A>& v, size_t n) {
  reserve_on_huge_pages(v, n);
  v.resize(n);
}

}  // namespace px
