#include "transport/collectives/scratch_pool.h"

#include <mutex>
#include <utility>
#include <vector>

namespace px {
namespace {

// Idle buffers beyond this are freed: enough for a few large allreduces in flight.
constexpr size_t kMaxIdleBytes = size_t{256} << 20;

struct Idle {
  std::unique_ptr<char[]> data;
  size_t size = 0;
};

struct Pool {
  std::mutex mutex;
  std::vector<Idle> idle;
  size_t idle_bytes = 0;
  size_t in_use_bytes = 0;  // buffers taken and not yet back
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: buffers may come back during exit
  return *p;
}

}  // namespace

ScratchBuffer ScratchBuffer::take(size_t bytes) {
  ScratchBuffer b;
  {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    size_t best = p.idle.size();
    for (size_t i = 0; i < p.idle.size(); ++i)
      if (p.idle[i].size >= bytes && (best == p.idle.size() || p.idle[i].size < p.idle[best].size))
        best = i;
    if (best < p.idle.size()) {
      b.data_ = std::move(p.idle[best].data);
      b.size_ = p.idle[best].size;
      p.idle_bytes -= b.size_;
      p.in_use_bytes += b.size_;
      p.idle[best] = std::move(p.idle.back());
      p.idle.pop_back();
      return b;
    }
    p.in_use_bytes += bytes;
  }
  b.data_.reset(new char[bytes > 0 ? bytes : 1]);  // not zeroed: it is written before read
  b.size_ = bytes;
  return b;
}

size_t ScratchBuffer::held_bytes() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().idle_bytes + pool().in_use_bytes;
}

size_t ScratchBuffer::idle_bytes() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().idle_bytes;
}

void ScratchBuffer::free_idle() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  pool().idle.clear();
  pool().idle_bytes = 0;
}

ScratchBuffer::ScratchBuffer(ScratchBuffer&& other) noexcept
    : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}

ScratchBuffer& ScratchBuffer::operator=(ScratchBuffer&& other) noexcept {
  if (this != &other) {
    ScratchBuffer old(std::move(*this));
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ScratchBuffer::~ScratchBuffer() {
  if (!data_) return;
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.in_use_bytes -= size_;
  if (size_ > kMaxIdleBytes) return;
  // The largest buffers are the ones worth keeping; a smaller one makes room if it must.
  while (p.idle_bytes + size_ > kMaxIdleBytes && !p.idle.empty()) {
    size_t smallest = 0;
    for (size_t i = 1; i < p.idle.size(); ++i)
      if (p.idle[i].size < p.idle[smallest].size) smallest = i;
    if (p.idle[smallest].size >= size_) return;  // this one is the one to drop
    p.idle_bytes -= p.idle[smallest].size;
    p.idle[smallest] = std::move(p.idle.back());
    p.idle.pop_back();
  }
  if (p.idle_bytes + size_ > kMaxIdleBytes) return;
  p.idle_bytes += size_;
  p.idle.push_back(Idle{std::move(data_), size_});
}

}  // namespace px
