// Pipelined chain broadcast along the ring from a root: each chunk is forwarded to the next
// rank as soon as it arrives, so a large buffer costs about one buffer's transfer time.
#pragma once

#include <cstdint>

#include "transport/collectives/collective_transport.h"
#include "transport/collectives/ring_allreduce.h"

namespace px {

struct BroadcastSpec {
  void* buffer = nullptr;  // the root's data; filled on every other rank
  uint64_t bytes = 0;
  int root = 0;
  uint64_t tag_base = 0;
  uint8_t priority = 0;  // px_op_options.priority: orders this collective's sends on the link
  size_t chunk_bytes = 1 << 20;
};

void start_chain_broadcast(CollectiveTransport& transport, const BroadcastSpec& spec,
                           CollectiveDone done);

}  // namespace px
