// Sparse rows and gradients on the wire in 16 bits (px_sparse_options.wire_dtype): a pull's
// rows and a push's summed gradients are rounded once where they are made (the owner's
// gather, the router's sum) and travel as bf16 or f16; the shards keep f32. Rounding where
// the values are made, not where they are packed, gives the same numbers whether a request
// crosses the fabric or stays on its node, so results do not depend on which node owns a row.
// Packing rounded values is then exact.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sharding/sparse_spec.h"

namespace px {

// Bytes of one value on the wire.
inline size_t wire_value_bytes(WireDtype wire) {
  return wire == WireDtype::kF32 ? sizeof(float) : sizeof(uint16_t);
}

// Rounds values to the nearest value of the wire dtype (ties to even), in place. f16
// saturates at +-65504 rather than overflowing to infinity: a large gradient stays large
// instead of writing Inf into the table. NaN stays NaN. No-op for f32.
void round_to_wire(WireDtype wire, float* values, size_t n);

// 16-bit wire dtypes only: values (already rounded) to n wire values, and back.
void pack_wire(WireDtype wire, const float* values, size_t n, uint16_t* out);
void unpack_wire(WireDtype wire, const uint16_t* in, size_t n, float* out);

}  // namespace px
