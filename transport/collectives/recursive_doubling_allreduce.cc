#include "transport/collectives/recursive_doubling_allreduce.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "transport/kernels/reduce.h"
#include "transport/kernels/wire16.h"

namespace px {
namespace {

// Tag stages (the low algorithm bits): the fold, one per doubling level, the hand-back.
constexpr uint64_t kFoldStage = 0;
constexpr uint64_t kHandBackStage = 15;

class RecursiveDoubling : public std::enable_shared_from_this<RecursiveDoubling> {
 public:
  RecursiveDoubling(CollectiveTransport& t, const RecursiveDoublingSpec& spec, CollectiveDone done)
      : t_(t), spec_(spec), done_(std::move(done)) {
    n_ = t.size();
    rank_ = t.rank();
    bytes_ = spec.count * dtype_size(spec.dtype);
    while (pof2_ * 2 <= n_) pof2_ *= 2;
    rest_ = n_ - pof2_;
    incoming_.resize(bytes_);
    packed_ = spec.dtype == DType::kF32 && is_wire16(spec.wire);
    if (packed_) {
      outgoing16_.resize(spec.count);
      incoming16_.resize(spec.count);
    }
  }

  void start() {
    if (n_ == 1 || spec_.count == 0) return done_(true, "");
    if (rank_ < 2 * rest_ && rank_ % 2 == 0) {
      // Folded away: hand the buffer to the odd neighbour, get the result back.
      return exchange(rank_ + 1, kFoldStage, true, kHandBackStage, true,
                      [self = shared_from_this()] {
                        std::memcpy(self->spec_.buffer, self->incoming_.data(), self->bytes_);
                        self->finish();
                      });
    }
    if (rank_ < 2 * rest_) {
      // Takes the even neighbour's buffer in (lower rank first), then doubles.
      return exchange(rank_ - 1, kFoldStage, false, kFoldStage, true, [self = shared_from_this()] {
        self->reduce_with(self->rank_ - 1);
        self->level(0);
      });
    }
    level(0);
  }

 private:
  int vrank() const { return rank_ < 2 * rest_ ? rank_ / 2 : rank_ - rest_; }
  int real_rank(int v) const { return v < rest_ ? 2 * v + 1 : v + rest_; }

  // Level k: swap buffers with the partner 2^k away (in virtual ranks) and reduce.
  void level(int k) {
    if ((1 << k) >= pof2_) return hand_back();
    int partner = real_rank(vrank() ^ (1 << k));
    uint64_t stage = static_cast<uint64_t>(k) + 1;
    exchange(partner, stage, true, stage, true, [self = shared_from_this(), partner, k] {
      self->reduce_with(partner);
      self->level(k + 1);
    });
  }

  void hand_back() {
    if (packed_) round_buffer();  // the result, like every value sent, is a wire value
    if (rank_ < 2 * rest_)        // odd: the even neighbour waits for the result
      return exchange(rank_ - 1, kHandBackStage, true, kHandBackStage, false,
                      [self = shared_from_this()] { self->finish(); });
    finish();
  }

  // buffer = op(lower rank's data, higher rank's data), whichever of them is this rank
  // (reduce_buffers writes over its first source only, so a lower partner's sum is made in
  // incoming_ and copied).
  void reduce_with(int other) {
    ReduceOp op = spec_.op == ReduceOp::kMean ? ReduceOp::kSum : spec_.op;
    if (other > rank_) {
      const void* sources[2] = {spec_.buffer, incoming_.data()};
      reduce_buffers(spec_.dtype, op, spec_.buffer, sources, 2, spec_.count, 1);
      return;
    }
    const void* sources[2] = {incoming_.data(), spec_.buffer};
    reduce_buffers(spec_.dtype, op, incoming_.data(), sources, 2, spec_.count, 1);
    std::memcpy(spec_.buffer, incoming_.data(), bytes_);
  }

  // Sends the buffer (send) and/or receives into incoming_ (recv), then runs next once both
  // are done (so the buffer may be written again), or ends with the first error. Packed:
  // the buffer is rounded to the wire type before it is sent, and this rank keeps the
  // rounded value too, so both partners combine the same operands.
  void exchange(int peer, uint64_t send_stage, bool send, uint64_t recv_stage, bool recv,
                std::function<void()> next) {
    auto self = shared_from_this();
    if (packed_ && recv)
      next = [self, next = std::move(next)] {
        unpack_wire16(self->spec_.wire, self->incoming16_.data(), self->spec_.count,
                      reinterpret_cast<float*>(self->incoming_.data()));
        next();
      };
    struct Pair {
      std::mutex mutex;
      int left = 0;
      bool ok = true;
      std::string error;
      std::function<void()> next;
    };
    auto pair = std::make_shared<Pair>();
    pair->left = (send ? 1 : 0) + (recv ? 1 : 0);
    pair->next = std::move(next);
    auto finished = [self, pair](bool ok, const std::string& error) {
      std::unique_lock<std::mutex> lock(pair->mutex);
      if (!ok && pair->ok) {
        pair->ok = false;
        pair->error = error;
      }
      if (--pair->left > 0) return;
      lock.unlock();
      if (!pair->ok) return self->fail(pair->error);
      pair->next();
    };
    if (!packed_) {
      if (recv) t_.recv(peer, spec_.tag_base | recv_stage, incoming_.data(), bytes_, finished);
      if (send)
        t_.send(peer, spec_.tag_base | send_stage, spec_.buffer, bytes_, spec_.priority, finished);
      return;
    }
    size_t wire_bytes = spec_.count * sizeof(uint16_t);
    if (recv) t_.recv(peer, spec_.tag_base | recv_stage, incoming16_.data(), wire_bytes, finished);
    if (send) {
      round_buffer();
      t_.send(peer, spec_.tag_base | send_stage, outgoing16_.data(), wire_bytes, spec_.priority,
              finished);
    }
  }

  // Packed: the buffer to the wire type, into outgoing16_, and the rounded values back.
  void round_buffer() {
    pack_and_round_wire16(spec_.wire, static_cast<float*>(spec_.buffer), spec_.count,
                          outgoing16_.data());
  }

  void finish() { done_(true, ""); }
  void fail(const std::string& error) { done_(false, error); }

  CollectiveTransport& t_;
  RecursiveDoublingSpec spec_;
  CollectiveDone done_;
  int n_ = 1, rank_ = 0, pof2_ = 1, rest_ = 0;
  size_t bytes_ = 0;
  std::vector<char> incoming_;
  bool packed_ = false;  // f32 values on a 16-bit wire
  std::vector<uint16_t> outgoing16_, incoming16_;
};

}  // namespace

void start_recursive_doubling_allreduce(CollectiveTransport& transport,
                                        const RecursiveDoublingSpec& spec, CollectiveDone done) {
  std::make_shared<RecursiveDoubling>(transport, spec, std::move(done))->start();
}

}  // namespace px
