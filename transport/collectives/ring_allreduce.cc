#include "transport/collectives/ring_allreduce.h"

#include <algorithm>
#include <vector>

#include "transport/collectives/collective_state.h"
#include "transport/collectives/scratch_pool.h"
#include "transport/kernels/reduce.h"
#include "transport/kernels/wire16.h"

namespace px {
namespace {

class RingAllreduce : public std::enable_shared_from_this<RingAllreduce> {
 public:
  static constexpr size_t kMaxChunks = 4096;  // 12 tag bits

  RingAllreduce(CollectiveTransport& t, const RingAllreduceSpec& spec, Executor executor,
                CollectiveDone done)
      : t_(t), spec_(spec), executor_(std::move(executor)), done_(std::move(done)) {
    n_ = t.size();
    rank_ = t.rank();
    elem_ = dtype_size(spec.dtype);
    size_t max_segment = (spec.count + static_cast<size_t>(n_) - 1) / static_cast<size_t>(n_);
    chunk_elems_ = std::max<size_t>(1, spec.chunk_bytes / elem_);
    chunks_ = std::max<size_t>(1, (max_segment + chunk_elems_ - 1) / chunk_elems_);
    if (chunks_ > kMaxChunks) {
      chunk_elems_ = (max_segment + kMaxChunks - 1) / kMaxChunks;
      chunks_ = (max_segment + chunk_elems_ - 1) / chunk_elems_;
    }
    steps_ = 2 * (n_ - 1);
    packed_ = spec.dtype == DType::kF32 && is_wire16(spec.wire);
    wire_elem_ = packed_ ? sizeof(uint16_t) : elem_;
    if (n_ > 1) {
      scratch_ = ScratchBuffer::take(chunks_ * chunk_elems_ * wire_elem_);
      if (packed_) wire_ = ScratchBuffer::take(spec.count * sizeof(uint16_t));
    }
  }

  void start() {
    if (n_ == 1 || spec_.count == 0) return done_(true, "");
    // Every chunk's first send and receive; the rest follow completions. A packed first
    // send converts its chunk, which is work for the executor, not the caller's thread.
    counter_ = std::make_unique<TransferCounter>(chunks_ * static_cast<size_t>(steps_) * 2,
                                                 std::move(done_));
    auto self = shared_from_this();
    for (size_t c = 0; c < chunks_; ++c) {
      if (packed_)
        executor_([self, c] { self->post_step(c, 0); });
      else
        post_step(c, 0);
    }
  }

 private:
  int mod(int v) const { return ((v % n_) + n_) % n_; }
  int send_segment(int step) const {
    return step < n_ - 1 ? mod(rank_ - step) : mod(rank_ + 1 - (step - (n_ - 1)));
  }
  int recv_segment(int step) const {
    return step < n_ - 1 ? mod(rank_ - step - 1) : mod(rank_ - (step - (n_ - 1)));
  }
  size_t segment_begin(int s) const {
    return spec_.count * static_cast<size_t>(s) / static_cast<size_t>(n_);
  }

  // Element range of chunk c of segment s (possibly empty).
  std::pair<size_t, size_t> chunk_range(int s, size_t c) const {
    size_t begin = segment_begin(s), end = segment_begin(s + 1);
    size_t lo = std::min(end, begin + c * chunk_elems_);
    return {lo, std::min(end, lo + chunk_elems_)};
  }
  char* at(size_t element) const { return static_cast<char*>(spec_.buffer) + element * elem_; }
  float* values_at(size_t element) const { return reinterpret_cast<float*>(at(element)); }
  // A packed ring's 16-bit copy of the buffer: what this rank sends, and what the
  // all-gather receives and passes on.
  uint16_t* wire_at(size_t element) const {
    return reinterpret_cast<uint16_t*>(wire_.data()) + element;
  }
  char* scratch_at(size_t c) const { return scratch_.data() + c * chunk_elems_ * wire_elem_; }
  uint64_t tag(int step, size_t c) const {
    return spec_.tag_base | (static_cast<uint64_t>(step) << 12) | c;
  }
  int next() const { return mod(rank_ + 1); }
  int prev() const { return mod(rank_ - 1); }

  void post_step(size_t c, int step) {
    auto self = shared_from_this();
    auto [rlo, rhi] = chunk_range(recv_segment(step), c);
    bool reducing = step < n_ - 1;
    void* target = reducing ? scratch_at(c) : packed_ ? static_cast<void*>(wire_at(rlo)) : at(rlo);
    t_.recv(prev(), tag(step, c), target, (rhi - rlo) * wire_elem_,
            [self, c, step](bool ok, const std::string& error) {
              self->on_received(c, step, ok, error);
            });
    auto [slo, shi] = chunk_range(send_segment(step), c);
    t_.send(next(), tag(step, c), send_source(step, slo, shi), (shi - slo) * wire_elem_,
            spec_.priority,
            [self](bool ok, const std::string& error) { self->counter_->finished(ok, error); });
  }

  // What step sends of elements [lo, hi). Packed: the reduce-scatter's partial sums are
  // rounded into the wire copy; at the first all-gather step the owner rounds its full sum
  // and keeps the rounded value too; later steps pass on what they received. The wire copy
  // of a segment is sent from in the reduce-scatter and received into in the all-gather;
  // the receive comes after the send reached the next rank (the sum it completes went
  // round the ring through it), so the region is never in use twice at once.
  const void* send_source(int step, size_t lo, size_t hi) const {
    if (!packed_) return at(lo);
    if (step < n_ - 1) pack_wire16(spec_.wire, values_at(lo), hi - lo, wire_at(lo));
    if (step == n_ - 1) pack_and_round_wire16(spec_.wire, values_at(lo), hi - lo, wire_at(lo));
    return wire_at(lo);
  }

  void on_received(size_t c, int step, bool ok, const std::string& error) {
    if (!ok || counter_->failed()) {
      // This chunk stops here: its later steps are never posted.
      return counter_->finished(ok, error, static_cast<size_t>(steps_ - step - 1) * 2);
    }
    if (step < n_ - 1) {
      auto self = shared_from_this();
      executor_([self, c, step] {
        auto [lo, hi] = self->chunk_range(self->recv_segment(step), c);
        ReduceOp op = self->spec_.op == ReduceOp::kMean ? ReduceOp::kSum : self->spec_.op;
        if (self->packed_) {
          accumulate_wire16(self->spec_.wire, op, self->values_at(lo),
                            reinterpret_cast<const uint16_t*>(self->scratch_at(c)), hi - lo);
        } else {
          const void* sources[2] = {self->at(lo), self->scratch_at(c)};
          reduce_buffers(self->spec_.dtype, op, self->at(lo), sources, 2, hi - lo, 1);
        }
        self->advance(c, step);
      });
      return;
    }
    if (packed_) {  // the all-gather's 16-bit values, widened into the buffer
      auto self = shared_from_this();
      executor_([self, c, step] {
        auto [lo, hi] = self->chunk_range(self->recv_segment(step), c);
        unpack_wire16(self->spec_.wire, self->wire_at(lo), hi - lo, self->values_at(lo));
        self->advance(c, step);
      });
      return;
    }
    advance(c, step);
  }

  void advance(size_t c, int step) {
    if (step + 1 < steps_ && !counter_->failed()) {
      post_step(c, step + 1);
      return counter_->finished(true, "");
    }
    // Last step, or failed: the remaining steps of this chunk are never posted.
    counter_->finished(true, "", static_cast<size_t>(steps_ - step - 1) * 2);
  }

  CollectiveTransport& t_;
  RingAllreduceSpec spec_;
  Executor executor_;
  CollectiveDone done_;
  int n_ = 1, rank_ = 0, steps_ = 0;
  size_t elem_ = 4, chunk_elems_ = 1, chunks_ = 1;
  bool packed_ = false;    // f32 values on a 16-bit wire
  size_t wire_elem_ = 4;   // bytes of a value on the wire
  ScratchBuffer scratch_;  // a chunk's incoming data, to reduce into the buffer
  ScratchBuffer wire_;     // packed: the buffer in 16 bits (wire_at)
  std::unique_ptr<TransferCounter> counter_;
};

}  // namespace

void start_ring_allreduce(CollectiveTransport& transport, const RingAllreduceSpec& spec,
                          Executor executor, CollectiveDone done) {
  if (!executor) executor = [](std::function<void()> fn) { fn(); };
  std::make_shared<RingAllreduce>(transport, spec, std::move(executor), std::move(done))->start();
}

}  // namespace px
