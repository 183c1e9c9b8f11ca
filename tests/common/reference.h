// Reference arithmetic for tests, written independently of transport/reduce.cc:
// f16 via the compiler's _Float16, bf16 by choosing the nearest representable value.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace pxt {

inline uint16_t ref_float_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

inline float ref_f16_to_float(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

inline float ref_bf16_to_float(uint16_t u) {
  uint32_t bits = static_cast<uint32_t>(u) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t ref_float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t down = static_cast<uint16_t>(bits >> 16);
  if ((bits & 0xffff) == 0) return down;
  uint16_t up = static_cast<uint16_t>(down + 1);  // next magnitude (sign kept by the bit pattern)
  double d_down = ref_bf16_to_float(down), d_up = ref_bf16_to_float(up);
  // Past the largest finite value IEEE rounds as if the exponent range went on: 2^128.
  if ((up & 0x7fff) == 0x7f80) d_up = std::copysign(std::ldexp(1.0, 128), f);
  double err_down = std::fabs(static_cast<double>(f) - d_down);
  double err_up = std::fabs(static_cast<double>(f) - d_up);
  if (err_down < err_up) return down;
  if (err_up < err_down) return up;
  return (down & 1) ? up : down;
}

// Reduction of per-rank values, in rank order, in the accumulation type the ABI documents.
enum RefOp { kRefSum = 0, kRefMean = 1, kRefMin = 2, kRefMax = 3, kRefProd = 4 };

template <typename T>
T ref_combine(T a, T b, int op) {
  switch (op) {
    case kRefMin:
      return (std::isnan(static_cast<double>(a)) || std::isnan(static_cast<double>(b)))
                 ? (std::isnan(static_cast<double>(a)) ? a : b)
                 : (b < a ? b : a);
    case kRefMax:
      return (std::isnan(static_cast<double>(a)) || std::isnan(static_cast<double>(b)))
                 ? (std::isnan(static_cast<double>(a)) ? a : b)
                 : (b > a ? b : a);
    case kRefProd:
      return a * b;
    default:
      return a + b;
  }
}

}  // namespace pxt
