#include "sharding/wire_values.h"

#include <algorithm>

#include "transport/kernels/wire16.h"

namespace px {
namespace {

// WireDtype's values are px_dtype's, as DType's are.
DType wire_type(WireDtype wire) {
  return static_cast<DType>(wire);
}
static_assert(static_cast<DType>(WireDtype::kBf16) == DType::kBF16 &&
              static_cast<DType>(WireDtype::kF16) == DType::kF16);

}  // namespace

void round_to_wire(WireDtype wire, float* values, size_t n) {
  if (wire == WireDtype::kF32) return;
  constexpr size_t kBlock = 4096;
  uint16_t packed[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    size_t m = std::min(kBlock, n - at);
    pack_and_round_wire16(wire_type(wire), values + at, m, packed);
  }
}

void pack_wire(WireDtype wire, const float* values, size_t n, uint16_t* out) {
  pack_wire16(wire_type(wire), values, n, out);
}

void unpack_wire(WireDtype wire, const uint16_t* in, size_t n, float* out) {
  unpack_wire16(wire_type(wire), in, n, out);
}

}  // namespace px
