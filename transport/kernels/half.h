// IEEE binary16 and bfloat16 <-> float conversions, round to nearest even, NaN kept NaN.
// Written with integer operations only, so they need no F16C and auto-vectorise. The CUDA
// kernels (transport/kernels/cuda) compile these same functions for the device, so a GPU
// reduction rounds exactly as the host's does.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PX_HOST_DEVICE __host__ __device__
#else
#define PX_HOST_DEVICE
#endif

namespace px {

PX_HOST_DEVICE inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
PX_HOST_DEVICE inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

PX_HOST_DEVICE inline float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

PX_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

PX_HOST_DEVICE inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  // Subnormal or zero: mant * 2^-24, exact in float.
  float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

PX_HOST_DEVICE inline uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): scale so the f16 subnormal step (2^-24) is 1.0 and let
    // the float->int conversion in round-to-nearest-even mode do the rounding.
    float scaled = bits_float(abs) * 16777216.0f;  // exact: power-of-two scale
    // nearbyint-like rounding to even without libm: add and subtract 2^23.
    float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return sign | static_cast<uint16_t>(rounded);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((abs - 0x38000000u + rounding) >> 13);
}

}  // namespace px
