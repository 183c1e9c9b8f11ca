#include "transport/collectives/pairwise_exchange.h"

#include <algorithm>
#include <memory>

#include "transport/collectives/collective_state.h"

namespace px {
namespace {

size_t chunks_of(size_t bytes, size_t chunk) {
  return bytes == 0 ? 0 : (bytes + chunk - 1) / chunk;
}

class PairwiseExchange : public std::enable_shared_from_this<PairwiseExchange> {
 public:
  static constexpr size_t kMaxChunks = (size_t{1} << kTagAlgorithmBits) - 2;  // tag 0: header

  PairwiseExchange(CollectiveTransport& t, const PairwiseExchangeSpec& spec, CollectiveDone done)
      : t_(t), spec_(spec), done_(std::move(done)) {}

  void start() {
    int n = t_.size(), self_rank = t_.rank();
    if (n == 1) return done_(true, "");
    // Both sides cut a payload into chunks of chunk_bytes (the daemons' common setting).
    chunk_ = std::max<size_t>(1, spec_.chunk_bytes);
    // Sends and header receives are known now; payload receives once their header is in.
    size_t known = 0;
    for (int p = 0; p < n; ++p) {
      if (p == self_rank) continue;
      known += 2 + chunks_of(spec_.peers[static_cast<size_t>(p)].payload_bytes, chunk_);
    }
    // Each peer's payload receives are added to the count when its header arrives: hold one
    // extra per peer until then, so the count cannot reach zero early.
    counter_ =
        std::make_unique<TransferCounter>(known + static_cast<size_t>(n - 1), std::move(done_));
    auto self = shared_from_this();
    for (int p = 0; p < n; ++p) {
      if (p == self_rank) continue;
      const ExchangeWithPeer& peer = spec_.peers[static_cast<size_t>(p)];
      t_.recv(p, spec_.tag_base, peer.recv_header, peer.recv_header_bytes,
              [self, p](bool ok, const std::string& error) { self->on_header(p, ok, error); });
      t_.send(p, spec_.tag_base, peer.header, peer.header_bytes, spec_.priority,
              [self](bool ok, const std::string& error) { self->counter_->finished(ok, error); });
      const char* payload = static_cast<const char*>(peer.payload);
      size_t chunks = chunks_of(peer.payload_bytes, chunk_);
      if (chunks > kMaxChunks) {
        counter_->finished(false,
                           "a payload of " + std::to_string(peer.payload_bytes) +
                               " bytes is more than the exchange's chunks can carry",
                           chunks);
        continue;
      }
      for (size_t c = 0; c < chunks; ++c) {
        size_t lo = c * chunk_, len = std::min(chunk_, peer.payload_bytes - lo);
        t_.send(p, spec_.tag_base | (c + 1), payload + lo, len, spec_.priority,
                [self](bool ok, const std::string& error) { self->counter_->finished(ok, error); });
      }
    }
  }

 private:
  void on_header(int p, bool ok, const std::string& error) {
    if (!ok) {
      counter_->finished(false, error);         // the header's receive
      return counter_->finished(false, error);  // the payload's placeholder
    }
    auto [target, bytes] = spec_.receiver_payload(p);
    size_t chunks = chunks_of(bytes, chunk_);
    if (chunks > kMaxChunks) {
      counter_->finished(false, "node " + std::to_string(p) + " announced a payload of " +
                                    std::to_string(bytes) + " bytes, more than it can send");
      return counter_->finished(false, "");
    }
    // The placeholder becomes the payload's chunk receives (none for an empty one).
    counter_->finished(true, "", 0);                       // the header
    if (chunks == 0) return counter_->finished(true, "");  // the placeholder
    counter_->add(chunks - 1);
    auto self = shared_from_this();
    char* at = static_cast<char*>(target);
    for (size_t c = 0; c < chunks; ++c) {
      size_t lo = c * chunk_, len = std::min(chunk_, bytes - lo);
      t_.recv(p, spec_.tag_base | (c + 1), at + lo, len,
              [self](bool ok, const std::string& error) { self->counter_->finished(ok, error); });
    }
  }

  CollectiveTransport& t_;
  PairwiseExchangeSpec spec_;
  CollectiveDone done_;
  size_t chunk_ = 1 << 20;
  std::unique_ptr<TransferCounter> counter_;
};

}  // namespace

void start_pairwise_exchange(CollectiveTransport& transport, const PairwiseExchangeSpec& spec,
                             CollectiveDone done) {
  std::make_shared<PairwiseExchange>(transport, spec, std::move(done))->start();
}

}  // namespace px
