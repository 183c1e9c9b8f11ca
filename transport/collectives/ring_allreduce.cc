#include "transport/collectives/ring_allreduce.h"

#include <algorithm>
#include <vector>

#include "transport/collectives/collective_state.h"
#include "transport/collectives/scratch_pool.h"
#include "transport/kernels/reduce.h"

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
    if (n_ > 1) scratch_ = ScratchBuffer::take(chunks_ * chunk_elems_ * elem_);
  }

  void start() {
    if (n_ == 1 || spec_.count == 0) return done_(true, "");
    // Every chunk's first send and receive; the rest follow completions.
    counter_ = std::make_unique<TransferCounter>(chunks_ * static_cast<size_t>(steps_) * 2,
                                                 std::move(done_));
    for (size_t c = 0; c < chunks_; ++c) post_step(c, 0);
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
  uint64_t tag(int step, size_t c) const {
    return spec_.tag_base | (static_cast<uint64_t>(step) << 12) | c;
  }
  int next() const { return mod(rank_ + 1); }
  int prev() const { return mod(rank_ - 1); }

  void post_step(size_t c, int step) {
    auto self = shared_from_this();
    auto [rlo, rhi] = chunk_range(recv_segment(step), c);
    bool reducing = step < n_ - 1;
    void* target = reducing ? scratch_.data() + c * chunk_elems_ * elem_ : at(rlo);
    t_.recv(prev(), tag(step, c), target, (rhi - rlo) * elem_,
            [self, c, step](bool ok, const std::string& error) {
              self->on_received(c, step, ok, error);
            });
    auto [slo, shi] = chunk_range(send_segment(step), c);
    t_.send(next(), tag(step, c), at(slo), (shi - slo) * elem_, spec_.priority,
            [self](bool ok, const std::string& error) { self->counter_->finished(ok, error); });
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
        const void* sources[2] = {self->at(lo),
                                  self->scratch_.data() + c * self->chunk_elems_ * self->elem_};
        ReduceOp op = self->spec_.op == ReduceOp::kMean ? ReduceOp::kSum : self->spec_.op;
        reduce_buffers(self->spec_.dtype, op, self->at(lo), sources, 2, hi - lo, 1);
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
  ScratchBuffer scratch_;  // a chunk's incoming data, to reduce into the buffer
  std::unique_ptr<TransferCounter> counter_;
};

}  // namespace

void start_ring_allreduce(CollectiveTransport& transport, const RingAllreduceSpec& spec,
                          Executor executor, CollectiveDone done) {
  if (!executor) executor = [](std::function<void()> fn) { fn(); };
  std::make_shared<RingAllreduce>(transport, spec, std::move(executor), std::move(done))->start();
}

}  // namespace px
