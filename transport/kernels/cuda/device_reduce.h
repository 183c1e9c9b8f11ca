// The GPU local reduction: a node's workers' device buffers (mapped into the daemon with
// CUDA IPC) reduced element-wise into one, stream-ordered. Plain C++: no CUDA type crosses
// this header (a stream is a void*), so the daemon includes it without nvcc.
//
// The result is reduce_buffers()'s (transport/kernels/reduce.h) for the same sources in the
// same order, bit for bit: every dtype and op of the host path, f16/bf16 accumulated in f32
// and rounded once, i32 means in i64, integer sums wrapping, NaN winning min/max. NaN bits
// match as well, except where two NaNs meet in a sum or mean (see float_rules.h).
#pragma once

#include <cstddef>
#include <string>

#include "transport/kernels/dtype.h"

namespace px::gpu {

// A cudaStream_t; nullptr is the legacy default stream.
using Stream = void*;

// Sources one reduction takes at most: the daemon's largest local size (workers on a node).
constexpr size_t kMaxReduceSources = 4096;

struct DeviceReduceArgs {
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  void* dst = nullptr;                // device memory, count elements; may be srcs[0]
  const void* const* srcs = nullptr;  // host array of nsrc device pointers, count elements each
  size_t nsrc = 0;                    // 1..kMaxReduceSources
  size_t count = 0;
  unsigned mean_divisor = 0;  // kMean divides the total by it; 0 is taken as 1 (as the host)
  // Device memory the passes carry f32/i64 running values in, when more than 32 sources
  // need it: reduce_scratch_bytes() says how much (0 for most reductions).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  Stream stream = nullptr;
};

// Scratch bytes device_reduce needs for these arguments' dtype, op, nsrc and count; false
// with why if they are invalid.
bool reduce_scratch_bytes(const DeviceReduceArgs& args, size_t* bytes, std::string* why);

// Enqueues the reduction on args.stream and returns; the result is in dst once the stream
// reaches that point. The srcs array may go once this returns (the pointers travel in the
// launches); the buffers and the scratch must live until the stream has passed it. False with why
// if the arguments are invalid or a launch fails (no device, no driver, a build without CUDA).
// Invalid arguments are refused before anything is enqueued.
bool device_reduce(const DeviceReduceArgs& args, std::string* why);

// The same passes, checks and per-element code as device_reduce, run on the host over host
// memory (dst, srcs and scratch are host pointers; stream is ignored): how the unit tests
// check the kernel's arithmetic and pass sequence without a GPU.
bool emulate_device_reduce(const DeviceReduceArgs& args, std::string* why);

}  // namespace px::gpu
