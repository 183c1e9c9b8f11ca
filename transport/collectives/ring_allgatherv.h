// Ring allgatherv: every rank contributes a block of its own size (sizes known to all);
// every rank ends with all blocks, concatenated in rank order. N-1 ring steps, each block
// cut into chunks that move on as soon as they arrive.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/collectives/collective_transport.h"
#include "transport/collectives/ring_allreduce.h"

namespace px {

struct AllgathervSpec {
  // All blocks, in rank order; this rank's block must already be in place at its offset.
  void* buffer = nullptr;
  std::vector<uint64_t> block_bytes;  // by rank
  uint64_t tag_base = 0;              // from make_tag(); the low kTagAlgorithmBits are ours
  uint8_t priority = 0;  // px_op_options.priority: orders this collective's sends on the link
  size_t chunk_bytes = 1 << 20;
};

// done is called once, after every transfer posted has finished.
void start_ring_allgatherv(CollectiveTransport& transport, const AllgathervSpec& spec,
                           CollectiveDone done);

}  // namespace px
