// f32 values carried in 16 bits (bf16 or IEEE f16) between nodes: the sparse rows' wire
// (px_sparse_options.wire_dtype) and the dense allreduce's (px_dense_options.wire_dtype).
// Rounding is to nearest, ties to even (half.h). f16 saturates at +-65504 instead of
// overflowing to infinity, so a large value stays large rather than becoming Inf; bf16 has
// f32's range. NaN stays NaN.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/kernels/dtype.h"

namespace px {

// True for the two 16-bit float types an f32 value may travel as.
inline bool is_wire16(DType wire) {
  return wire == DType::kBF16 || wire == DType::kF16;
}

// values -> n wire values (rounded), and back (exact). wire must be is_wire16.
void pack_wire16(DType wire, const float* values, size_t n, uint16_t* out);
void unpack_wire16(DType wire, const uint16_t* in, size_t n, float* out);

// Packs values into out and keeps the rounded values in values too: what a sender does when
// it must hold exactly what its peers receive.
void pack_and_round_wire16(DType wire, float* values, size_t n, uint16_t* out);

// dst[i] = dst[i] (op) unpack(in[i]) in f32 (kMean is summed: the caller divides).
void accumulate_wire16(DType wire, ReduceOp op, float* dst, const uint16_t* in, size_t n);

}  // namespace px
