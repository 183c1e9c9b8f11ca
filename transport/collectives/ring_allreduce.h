// Ring allreduce (reduce-scatter, then all-gather), chunked and pipelined: each chunk moves
// to the next ring step as soon as it has been received and reduced, so reductions overlap
// transfers. Every rank ends with bitwise the same result.
//
// With a 16-bit wire (spec.wire kBF16 or kF16, f32 buffers only) every value that leaves a
// rank is rounded to the wire type first, and ranks sum in f32: in the reduce-scatter, a
// segment's partial sum is rounded each time it is sent on (n - 1 roundings of partial
// sums); the segment's owner rounds the full sum once, keeps the rounded value itself and
// sends it round the all-gather unchanged, so every rank ends with the same bits. Half the
// bytes cross each link; the conversions run on the executor beside the transfers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "transport/collectives/collective_transport.h"
#include "transport/kernels/dtype.h"

namespace px {

struct RingAllreduceSpec {
  void* buffer = nullptr;  // in: this rank's contribution; out: the result
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // kMean is reduced as a sum: the caller divides
  uint64_t tag_base = 0;         // from make_tag(); the low kTagAlgorithmBits are ours
  uint8_t priority = 0;  // px_op_options.priority: orders this collective's sends on the link
  size_t chunk_bytes = 1 << 20;  // of the buffer's dtype (a 16-bit wire sends half)
  DType wire = DType::kF32;      // kBF16 or kF16: values travel in 16 bits (dtype kF32 only)
};

// Runs reductions of received chunks (the daemon passes its pool; tests may run inline).
using Executor = std::function<void(std::function<void()>)>;
using CollectiveDone = std::function<void(bool ok, const std::string& error)>;

// Starts the allreduce. done is called exactly once, on some thread, after every send and
// receive the algorithm posted has finished (so the buffer may then be reused).
// The group may have at most 128 ranks.
void start_ring_allreduce(CollectiveTransport& transport, const RingAllreduceSpec& spec,
                          Executor executor, CollectiveDone done);

}  // namespace px
