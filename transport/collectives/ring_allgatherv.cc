#include "transport/collectives/ring_allgatherv.h"

#include <algorithm>
#include <memory>

#include "transport/collectives/collective_state.h"

namespace px {
namespace {

class RingAllgatherv : public std::enable_shared_from_this<RingAllgatherv> {
 public:
  static constexpr size_t kMaxChunks = 4096;

  RingAllgatherv(CollectiveTransport& t, const AllgathervSpec& spec, CollectiveDone done)
      : t_(t), spec_(spec), n_(t.size()), rank_(t.rank()) {
    uint64_t offset = 0, largest = 0;
    for (uint64_t b : spec.block_bytes) {
      offsets_.push_back(offset);
      offset += b;
      largest = std::max(largest, b);
    }
    chunk_ = std::max<uint64_t>(1, spec.chunk_bytes);
    chunks_ = std::max<uint64_t>(1, (largest + chunk_ - 1) / chunk_);
    if (chunks_ > kMaxChunks) {
      chunk_ = (largest + kMaxChunks - 1) / kMaxChunks;
      chunks_ = (largest + chunk_ - 1) / chunk_;
    }
    counter_ = std::make_unique<TransferCounter>(
        static_cast<size_t>(chunks_ * static_cast<uint64_t>(n_ - 1) * 2), std::move(done));
  }

  void start() {
    for (uint64_t c = 0; c < chunks_; ++c) post_step(c, 0);
  }

 private:
  int mod(int v) const { return ((v % n_) + n_) % n_; }
  std::pair<uint64_t, uint64_t> range(int block, uint64_t c) const {  // offset, bytes
    uint64_t size = spec_.block_bytes[static_cast<size_t>(block)];
    uint64_t lo = std::min(size, c * chunk_);
    return {offsets_[static_cast<size_t>(block)] + lo, std::min(size, lo + chunk_) - lo};
  }
  char* at(uint64_t offset) const { return static_cast<char*>(spec_.buffer) + offset; }

  void post_step(uint64_t c, int step) {
    auto self = shared_from_this();
    uint64_t tag = spec_.tag_base | (static_cast<uint64_t>(step) << 12) | c;
    auto [roff, rbytes] = range(mod(rank_ - step - 1), c);
    t_.recv(mod(rank_ - 1), tag, at(roff), rbytes,
            [self, c, step](bool ok, const std::string& error) {
              bool more = step + 2 < self->n_;
              if (ok && more && !self->counter_->failed()) {
                self->post_step(c, step + 1);
                self->counter_->finished(true, "");
              } else {
                self->counter_->finished(ok, error,
                                         more ? static_cast<size_t>(self->n_ - 2 - step) * 2 : 0);
              }
            });
    auto [soff, sbytes] = range(mod(rank_ - step), c);
    t_.send(mod(rank_ + 1), tag, at(soff), sbytes, spec_.priority,
            [self](bool ok, const std::string& error) { self->counter_->finished(ok, error); });
  }

  CollectiveTransport& t_;
  AllgathervSpec spec_;
  int n_, rank_;
  std::vector<uint64_t> offsets_;
  uint64_t chunk_ = 1, chunks_ = 1;
  std::unique_ptr<TransferCounter> counter_;
};

}  // namespace

void start_ring_allgatherv(CollectiveTransport& transport, const AllgathervSpec& spec,
                           CollectiveDone done) {
  if (transport.size() == 1) return done(true, "");
  std::make_shared<RingAllgatherv>(transport, spec, std::move(done))->start();
}

}  // namespace px
