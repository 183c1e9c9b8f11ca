// Every rank sends every other rank a header and a payload (the cross-node stage of an
// alltoall): all pairs at once, payloads chunked. A header has a size both sides know in
// advance and tells the receiver how large the payload is (receiver_payload), so a payload of
// a size the receiver did not expect is still received, whole, and the receiver fails the
// step itself: no rank waits for bytes that never come, or leaves a sender waiting.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "transport/collectives/collective_transport.h"
#include "transport/collectives/ring_allreduce.h"  // CollectiveDone

namespace px {

struct ExchangeWithPeer {
  const void* header = nullptr;  // to send
  size_t header_bytes = 0;
  const void* payload = nullptr;  // to send
  size_t payload_bytes = 0;
  void* recv_header = nullptr;  // the peer's header lands here
  size_t recv_header_bytes = 0;
};

struct PairwiseExchangeSpec {
  std::vector<ExchangeWithPeer> peers;  // one per rank; this rank's own is ignored
  // Once peer's header arrived (on a transport thread): where its payload goes, and how
  // many bytes the header announced.
  std::function<std::pair<void*, size_t>(int peer)> receiver_payload;
  uint64_t tag_base = 0;  // from make_tag(); the low kTagAlgorithmBits are ours
  uint8_t priority = 0;
  size_t chunk_bytes = 1 << 20;
};

// done is called once, after every transfer posted has finished. A payload may have up to
// 2^20 - 2 chunks.
void start_pairwise_exchange(CollectiveTransport& transport, const PairwiseExchangeSpec& spec,
                             CollectiveDone done);

}  // namespace px
