#include "transport/collectives/chain_broadcast.h"

#include <algorithm>
#include <memory>

#include "transport/collectives/collective_state.h"

namespace px {
namespace {

class ChainBroadcast : public std::enable_shared_from_this<ChainBroadcast> {
 public:
  static constexpr uint64_t kMaxChunks = 1 << 20;  // 20 tag bits

  ChainBroadcast(CollectiveTransport& t, const BroadcastSpec& spec, CollectiveDone done)
      : t_(t), spec_(spec), n_(t.size()), rank_(t.rank()) {
    chunk_ = std::max<uint64_t>(std::max<uint64_t>(1, spec.chunk_bytes),
                                (spec.bytes + kMaxChunks - 1) / kMaxChunks);
    chunks_ = std::max<uint64_t>(1, (spec.bytes + chunk_ - 1) / chunk_);
    // Position along the chain from the root: the last rank only receives, the root only sends.
    position_ = ((rank_ - spec.root) % n_ + n_) % n_;
    size_t per_chunk = (position_ > 0 ? 1 : 0) + (position_ < n_ - 1 ? 1 : 0);
    counter_ = std::make_unique<TransferCounter>(static_cast<size_t>(chunks_) * per_chunk,
                                                 std::move(done));
  }

  void start() {
    auto self = shared_from_this();
    for (uint64_t c = 0; c < chunks_; ++c) {
      if (position_ == 0) {
        forward(c);
        continue;
      }
      auto [off, len] = range(c);
      t_.recv((rank_ - 1 + n_) % n_, spec_.tag_base | c, at(off), len,
              [self, c](bool ok, const std::string& error) {
                bool forwards = self->position_ < self->n_ - 1;
                if (ok && forwards && !self->counter_->failed()) {
                  self->forward(c);
                  self->counter_->finished(true, "");
                } else {
                  self->counter_->finished(ok, error, forwards ? 1 : 0);
                }
              });
    }
  }

 private:
  std::pair<uint64_t, uint64_t> range(uint64_t c) const {
    uint64_t lo = std::min(spec_.bytes, c * chunk_);
    return {lo, std::min(spec_.bytes, lo + chunk_) - lo};
  }
  char* at(uint64_t offset) const { return static_cast<char*>(spec_.buffer) + offset; }

  void forward(uint64_t c) {
    auto self = shared_from_this();
    auto [off, len] = range(c);
    t_.send((rank_ + 1) % n_, spec_.tag_base | c, at(off), len, spec_.priority,
            [self](bool ok, const std::string& error) { self->counter_->finished(ok, error); });
  }

  CollectiveTransport& t_;
  BroadcastSpec spec_;
  int n_, rank_, position_ = 0;
  uint64_t chunk_ = 1, chunks_ = 1;
  std::unique_ptr<TransferCounter> counter_;
};

}  // namespace

void start_chain_broadcast(CollectiveTransport& transport, const BroadcastSpec& spec,
                           CollectiveDone done) {
  if (transport.size() == 1) return done(true, "");
  std::make_shared<ChainBroadcast>(transport, spec, std::move(done))->start();
}

}  // namespace px
