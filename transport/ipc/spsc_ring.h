// A single-producer single-consumer ring of fixed-size POD entries living in shared memory.
// Producer and consumer are different processes: the header holds only offsets-free data
// (indices and capacity), never pointers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace px {

struct alignas(64) RingIndices {
  alignas(64) std::atomic<uint64_t> head;  // next entry to consume; written by the consumer
  alignas(64) std::atomic<uint64_t> tail;  // next entry to produce; written by the producer
  // Set by a consumer about to sleep; the producer rings the doorbell only when it is set.
  alignas(64) std::atomic<uint32_t> consumer_armed;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "rings need lock-free 64-bit atomics");

template <typename Entry>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<Entry>, "ring entries are raw bytes in shared memory");

 public:
  static size_t bytes_for(uint32_t capacity) {
    return sizeof(RingIndices) + capacity * sizeof(Entry);
  }

  // Lays out a fresh ring at memory (done once, by the daemon, before sharing it).
  static void format(void* memory) {
    auto* idx = new (memory) RingIndices();
    idx->head.store(0, std::memory_order_relaxed);
    idx->tail.store(0, std::memory_order_relaxed);
    // A new consumer is asleep until its first wake-up, so the first push must ring.
    idx->consumer_armed.store(1, std::memory_order_relaxed);
  }

  SpscRing() = default;
  // capacity must be a power of two; the caller has validated that memory spans bytes_for().
  SpscRing(void* memory, uint32_t capacity)
      : idx_(static_cast<RingIndices*>(memory)),
        entries_(reinterpret_cast<Entry*>(static_cast<char*>(memory) + sizeof(RingIndices))),
        mask_(capacity - 1) {}

  uint32_t capacity() const { return mask_ + 1; }

  // Producer side. Returns false when full.
  bool try_push(const Entry& e) {
    uint64_t tail = idx_->tail.load(std::memory_order_relaxed);
    uint64_t head = idx_->head.load(std::memory_order_acquire);
    if (tail - head > mask_) return false;
    entries_[tail & mask_] = e;
    idx_->tail.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Producer side, after one or more pushes: true if the consumer asked to be woken (the
  // flag is consumed, so a burst of pushes rings the doorbell once).
  bool consumer_needs_wakeup() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (idx_->consumer_armed.load(std::memory_order_relaxed) == 0) return false;
    return idx_->consumer_armed.exchange(0, std::memory_order_acq_rel) != 0;
  }

  // Consumer side. Returns false when empty. The peer process is not trusted: the consumer
  // sees head..tail as given and checks entries itself; a bogus tail only yields garbage
  // entries, which the consumer validates, never out-of-bounds accesses (index is masked).
  bool try_pop(Entry* out) {
    uint64_t head = idx_->head.load(std::memory_order_relaxed);
    uint64_t tail = idx_->tail.load(std::memory_order_acquire);
    if (head == tail) return false;
    *out = entries_[head & mask_];
    idx_->head.store(head + 1, std::memory_order_release);
    return true;
  }

  bool empty() const {
    return idx_->head.load(std::memory_order_relaxed) == idx_->tail.load(std::memory_order_acquire);
  }

  // Consumer side, before sleeping on the doorbell: arms the wakeup flag and reports whether
  // the ring is still empty. If it is not, the consumer must drain instead of sleeping.
  bool arm_and_check_empty() {
    idx_->consumer_armed.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return empty();
  }

 private:
  RingIndices* idx_ = nullptr;
  Entry* entries_ = nullptr;
  uint32_t mask_ = 0;
};

}  // namespace px
