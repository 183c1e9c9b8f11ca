// First-fit allocator over the heap of a shared arena, with coalescing of freed neighbours.
// Offsets only: the same allocator logic serves any mapping. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace px {

class ArenaAllocator {
 public:
  static constexpr uint64_t kAlignment = 64;

  ArenaAllocator() = default;
  ArenaAllocator(uint64_t heap_offset, uint64_t heap_bytes);

  // A block of at least bytes (0 counts as 1), kAlignment-aligned relative to the heap start.
  std::optional<uint64_t> allocate(uint64_t bytes);
  // Frees a block returned by allocate(); false if offset is not the start of one.
  bool release(uint64_t offset);
  // Size of the block starting at offset, or 0.
  uint64_t block_size(uint64_t offset) const;

  uint64_t bytes_in_use() const { return in_use_; }
  uint64_t largest_free_block() const;
  size_t free_block_count() const { return free_.size(); }

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> size, disjoint and never adjacent
  std::map<uint64_t, uint64_t> used_;  // offset -> size
  uint64_t in_use_ = 0;
};

}  // namespace px
