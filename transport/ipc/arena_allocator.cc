#include "transport/ipc/arena_allocator.h"

#include <algorithm>
#include <iterator>

namespace px {

ArenaAllocator::ArenaAllocator(uint64_t heap_offset, uint64_t heap_bytes) {
  uint64_t start = (heap_offset + kAlignment - 1) / kAlignment * kAlignment;
  uint64_t end = heap_offset + heap_bytes;
  if (end > start) free_[start] = (end - start) / kAlignment * kAlignment;
}

std::optional<uint64_t> ArenaAllocator::allocate(uint64_t bytes) {
  if (bytes > (UINT64_MAX >> 1)) return std::nullopt;
  uint64_t size = std::max<uint64_t>(bytes, 1);
  size = (size + kAlignment - 1) / kAlignment * kAlignment;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    uint64_t offset = it->first;
    uint64_t remaining = it->second - size;
    free_.erase(it);
    if (remaining > 0) free_[offset + size] = remaining;
    used_[offset] = size;
    in_use_ += size;
    return offset;
  }
  return std::nullopt;
}

bool ArenaAllocator::release(uint64_t offset) {
  auto used = used_.find(offset);
  if (used == used_.end()) return false;
  uint64_t size = used->second;
  used_.erase(used);
  in_use_ -= size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return true;
    }
  }
  free_[offset] = size;
  return true;
}

uint64_t ArenaAllocator::block_size(uint64_t offset) const {
  auto it = used_.find(offset);
  return it == used_.end() ? 0 : it->second;
}

uint64_t ArenaAllocator::largest_free_block() const {
  uint64_t best = 0;
  for (const auto& [offset, size] : free_) best = std::max(best, size);
  return best;
}

}  // namespace px
