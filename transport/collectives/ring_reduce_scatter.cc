#include "transport/collectives/ring_reduce_scatter.h"

#include <algorithm>
#include <memory>

#include "transport/collectives/collective_state.h"
#include "transport/collectives/scratch_pool.h"
#include "transport/kernels/reduce.h"

namespace px {
namespace {

class RingReduceScatter : public std::enable_shared_from_this<RingReduceScatter> {
 public:
  static constexpr size_t kMaxChunks = 4096;  // 12 tag bits, below the step's

  RingReduceScatter(CollectiveTransport& t, const RingReduceScatterSpec& spec, Executor executor,
                    CollectiveDone done)
      : t_(t), spec_(spec), executor_(std::move(executor)), done_(std::move(done)) {
    n_ = t.size();
    rank_ = t.rank();
    elem_ = dtype_size(spec.dtype);
    begin_.assign(1, 0);
    size_t largest = 0;
    for (size_t count : spec.segment_count) {
      begin_.push_back(begin_.back() + count);
      largest = std::max(largest, count);
    }
    chunk_elems_ = std::max<size_t>(1, spec.chunk_bytes / elem_);
    chunks_ = std::max<size_t>(1, (largest + chunk_elems_ - 1) / chunk_elems_);
    if (chunks_ > kMaxChunks) {
      chunk_elems_ = (largest + kMaxChunks - 1) / kMaxChunks;
      chunks_ = (largest + chunk_elems_ - 1) / chunk_elems_;
    }
    steps_ = n_ - 1;
    if (n_ > 1) scratch_ = ScratchBuffer::take(chunks_ * chunk_elems_ * elem_);
  }

  void start() {
    if (n_ == 1 || begin_.back() == 0) return done_(true, "");
    counter_ = std::make_unique<TransferCounter>(chunks_ * static_cast<size_t>(steps_) * 2,
                                                 std::move(done_));
    for (size_t c = 0; c < chunks_; ++c) post_step(c, 0);
  }

 private:
  int mod(int v) const { return ((v % n_) + n_) % n_; }
  // Step k sends the segment it reduced at step k - 1 (its own contribution at step 0) and
  // receives the one its predecessor reduced; after n - 1 steps it has received, and reduced,
  // its own.
  int send_segment(int step) const { return mod(rank_ - step - 1); }
  int recv_segment(int step) const { return mod(rank_ - step - 2); }
  std::pair<size_t, size_t> chunk_range(int s, size_t c) const {
    size_t begin = begin_[static_cast<size_t>(s)], end = begin_[static_cast<size_t>(s) + 1];
    size_t lo = std::min(end, begin + c * chunk_elems_);
    return {lo, std::min(end, lo + chunk_elems_)};
  }
  char* at(size_t element) const { return static_cast<char*>(spec_.buffer) + element * elem_; }
  char* scratch(size_t c) const { return scratch_.data() + c * chunk_elems_ * elem_; }
  uint64_t tag(int step, size_t c) const {
    return spec_.tag_base | (static_cast<uint64_t>(step) << 12) | c;
  }

  void post_step(size_t c, int step) {
    auto self = shared_from_this();
    auto [rlo, rhi] = chunk_range(recv_segment(step), c);
    t_.recv(mod(rank_ - 1), tag(step, c), scratch(c), (rhi - rlo) * elem_,
            [self, c, step](bool ok, const std::string& error) {
              self->on_received(c, step, ok, error);
            });
    auto [slo, shi] = chunk_range(send_segment(step), c);
    t_.send(mod(rank_ + 1), tag(step, c), at(slo), (shi - slo) * elem_, spec_.priority,
            [self](bool ok, const std::string& error) { self->counter_->finished(ok, error); });
  }

  void on_received(size_t c, int step, bool ok, const std::string& error) {
    if (!ok || counter_->failed())  // this chunk stops: its later steps are never posted
      return counter_->finished(ok, error, static_cast<size_t>(steps_ - step - 1) * 2);
    auto self = shared_from_this();
    executor_([self, c, step] {
      auto [lo, hi] = self->chunk_range(self->recv_segment(step), c);
      const void* sources[2] = {self->at(lo), self->scratch(c)};
      ReduceOp op = self->spec_.op == ReduceOp::kMean ? ReduceOp::kSum : self->spec_.op;
      reduce_buffers(self->spec_.dtype, op, self->at(lo), sources, 2, hi - lo, 1);
      if (step + 1 < self->steps_ && !self->counter_->failed()) {
        self->post_step(c, step + 1);
        return self->counter_->finished(true, "");
      }
      self->counter_->finished(true, "", static_cast<size_t>(self->steps_ - step - 1) * 2);
    });
  }

  CollectiveTransport& t_;
  RingReduceScatterSpec spec_;
  Executor executor_;
  CollectiveDone done_;
  int n_ = 1, rank_ = 0, steps_ = 0;
  size_t elem_ = 4, chunk_elems_ = 1, chunks_ = 1;
  std::vector<size_t> begin_;  // where each segment starts; begin_[n] is the total
  ScratchBuffer scratch_;      // a chunk's incoming data, to reduce into the buffer
  std::unique_ptr<TransferCounter> counter_;
};

}  // namespace

void start_ring_reduce_scatter(CollectiveTransport& transport, const RingReduceScatterSpec& spec,
                               Executor executor, CollectiveDone done) {
  if (!executor) executor = [](std::function<void()> fn) { fn(); };
  std::make_shared<RingReduceScatter>(transport, spec, std::move(executor), std::move(done))
      ->start();
}

}  // namespace px
