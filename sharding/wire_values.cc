#include "sharding/wire_values.h"

#include <algorithm>

#include "transport/kernels/half.h"

namespace px {
namespace {

constexpr float kF16Max = 65504.0f;

inline float saturate_f16(float v) {
  return std::clamp(v, -kF16Max, kF16Max);  // NaN passes: every comparison is false
}

}  // namespace

void round_to_wire(WireDtype wire, float* values, size_t n) {
  switch (wire) {
    case WireDtype::kF32:
      return;
    case WireDtype::kBf16:
      for (size_t i = 0; i < n; ++i) values[i] = bf16_to_float(float_to_bf16(values[i]));
      return;
    case WireDtype::kF16:
      for (size_t i = 0; i < n; ++i)
        values[i] = f16_to_float(float_to_f16(saturate_f16(values[i])));
      return;
  }
}

void pack_wire(WireDtype wire, const float* values, size_t n, uint16_t* out) {
  if (wire == WireDtype::kBf16) {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(values[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_f16(saturate_f16(values[i]));
  }
}

void unpack_wire(WireDtype wire, const uint16_t* in, size_t n, float* out) {
  if (wire == WireDtype::kBf16) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = f16_to_float(in[i]);
  }
}

}  // namespace px
