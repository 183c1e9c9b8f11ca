#include "transport/kernels/wire16.h"

#include <algorithm>

#include "transport/kernels/half.h"
#include "transport/kernels/reduce.h"

namespace px {
namespace {

constexpr float kF16Max = 65504.0f;

inline float saturate_f16(float v) {
  return std::clamp(v, -kF16Max, kF16Max);  // NaN passes: every comparison is false
}

}  // namespace

void pack_wire16(DType wire, const float* values, size_t n, uint16_t* out) {
  if (wire == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(values[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_f16(saturate_f16(values[i]));
  }
}

void unpack_wire16(DType wire, const uint16_t* in, size_t n, float* out) {
  if (wire == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = f16_to_float(in[i]);
  }
}

void pack_and_round_wire16(DType wire, float* values, size_t n, uint16_t* out) {
  pack_wire16(wire, values, n, out);
  unpack_wire16(wire, out, n, values);
}

void accumulate_wire16(DType wire, ReduceOp op, float* dst, const uint16_t* in, size_t n) {
  // Widened a block at a time into a small buffer that stays in cache, then reduced by the
  // f32 kernel, so every op rounds as an f32 reduction does.
  constexpr size_t kBlock = 4096;
  float widened[kBlock];
  ReduceOp combine = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  for (size_t at = 0; at < n; at += kBlock) {
    size_t m = std::min(kBlock, n - at);
    unpack_wire16(wire, in + at, m, widened);
    const void* sources[2] = {dst + at, widened};
    reduce_buffers(DType::kF32, combine, dst + at, sources, 2, m, 1);
  }
}

}  // namespace px
