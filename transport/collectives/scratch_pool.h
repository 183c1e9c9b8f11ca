// Receive buffers for the collectives, kept between operations. A ring step receives a
// whole segment (16 MiB of a 64 MiB allreduce across 4 nodes); allocating and zeroing it per
// operation cost page faults and a memset on every step, about 15% of a daemon's CPU on
// loopback.
#pragma once

#include <cstddef>
#include <memory>

namespace px {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(ScratchBuffer&& other) noexcept;
  ScratchBuffer& operator=(ScratchBuffer&& other) noexcept;
  ~ScratchBuffer();  // back to the pool

  // At least the size asked for; contents are whatever the last user left.
  char* data() const { return data_.get(); }
  size_t size() const { return size_; }

  // A buffer of at least bytes: the smallest idle one that fits, else a new one.
  static ScratchBuffer take(size_t bytes);
  // Idle bytes the pool holds; every scratch byte held (idle and in use); freeing the idle
  // ones (the daemon, once no job is left; tests).
  static size_t idle_bytes();
  static size_t held_bytes();
  static void free_idle();

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
};

}  // namespace px
