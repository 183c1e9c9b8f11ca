// Ring reduce-scatter with a segment per rank of any size, chunked and pipelined: rank r ends
// with segment r reduced over every rank (the reduce-scatter half of a ring allreduce, with
// ownership turned by one so each rank keeps its own segment, and segments that may differ,
// as nodes hold different numbers of workers). Each rank sends (n - 1)/n of the buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/collectives/collective_transport.h"
#include "transport/collectives/ring_allreduce.h"  // Executor, CollectiveDone
#include "transport/kernels/dtype.h"

namespace px {

struct RingReduceScatterSpec {
  // In: this rank's contribution to every segment, one after another in rank order. Out:
  // this rank's segment holds the reduction (the others hold partial sums).
  void* buffer = nullptr;
  std::vector<size_t> segment_count;  // elements of each rank's segment, one per rank
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // kMean is reduced as a sum: the caller divides
  uint64_t tag_base = 0;         // from make_tag(); the low kTagAlgorithmBits are ours
  uint8_t priority = 0;
  size_t chunk_bytes = 1 << 20;
};

// Starts the reduce-scatter; done is called exactly once, after every transfer it posted
// finished. At most 128 ranks.
void start_ring_reduce_scatter(CollectiveTransport& transport, const RingReduceScatterSpec& spec,
                               Executor executor, CollectiveDone done);

}  // namespace px
