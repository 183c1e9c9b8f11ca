// Recursive-doubling allreduce for small buffers: log2(N) exchanges of the whole buffer
// with a partner (rank XOR 2^k) instead of the ring's 2(N-1) steps, so a small allreduce
// costs a few message latencies, not 2(N-1). A group that is not a power of two folds its
// first 2r ranks in pairs before (the even rank hands its buffer to the odd one) and hands
// the result back after (MPICH's and Open MPI's scheme). Every exchange is reduced with the
// lower rank's data first, so every rank computes the same operations in the same order and
// ends with bitwise the same result. Reductions run inline on the transport's completion
// thread: meant for buffers of at most kRecursiveDoublingMaxBytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/collectives/collective_transport.h"
#include "transport/collectives/ring_allreduce.h"  // CollectiveDone

namespace px {

// The largest buffer the daemon sends this way (below it latency dominates: N = 4 sends two
// messages of the whole buffer instead of six of a quarter).
constexpr size_t kRecursiveDoublingMaxBytes = 32 << 10;

struct RecursiveDoublingSpec {
  void* buffer = nullptr;  // in: this rank's contribution; out: the result
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // kMean is reduced as a sum: the caller divides
  uint64_t tag_base = 0;         // from make_tag(); the low kTagAlgorithmBits are ours
  uint8_t priority = 0;  // px_op_options.priority: orders this collective's sends on the link
  // kBF16 or kF16 (dtype kF32 only): every exchange sends the buffer rounded to 16 bits, and
  // the sender keeps the rounded value, so both partners sum the same operands in f32.
  DType wire = DType::kF32;
};

// Starts the allreduce; done is called exactly once, on some thread, after every send and
// receive it posted has finished. The group may have at most 128 ranks.
void start_recursive_doubling_allreduce(CollectiveTransport& transport,
                                        const RecursiveDoublingSpec& spec, CollectiveDone done);

}  // namespace px
