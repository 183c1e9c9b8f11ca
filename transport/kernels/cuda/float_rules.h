// The floating-point steps the GPU kernels share with the host path, giving the host's
// results to the bit. Compiled by nvcc for the device and by the host compiler for the
// host emulation of the kernels (the unit tests), so both run this very code.
//
// IEEE add, multiply, divide and compare round alike on an NVIDIA GPU and on x86-64 with nvcc's
// defaults (-prec-div=true, no flush to zero) and --fmad=false, which the kernels are built
// with so no add is fused with a multiply. What differs is which NaN a NaN result is: a GPU
// returns the canonical NaN (0x7fffffff), x86-64 SSE (the host build) the first NaN operand,
// quieted, or for an invalid operation (inf - inf) its "default" NaN, sign set (0xffc00000).
// host_add/host_mul/host_div give the x86 result, so NaN bits match as well, except where two NaN
// operands meet (the host's own result then depends on how its compiler ordered the
// operands of the commutative add or multiply; both are NaN).
#pragma once

#include <cstdint>

#include "transport/kernels/half.h"  // PX_HOST_DEVICE, float_bits, bits_float

namespace px::gpu {

PX_HOST_DEVICE inline uint64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
#endif
}

PX_HOST_DEVICE inline double bits_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

PX_HOST_DEVICE inline float quiet_nan(float a) {
  return bits_float(float_bits(a) | 0x00400000u);
}
PX_HOST_DEVICE inline double quiet_nan(double a) {
  return bits_double(double_bits(a) | 0x0008000000000000ull);
}
PX_HOST_DEVICE inline float default_nan(float) {
  return bits_float(0xffc00000u);
}
PX_HOST_DEVICE inline double default_nan(double) {
  return bits_double(0xfff8000000000000ull);
}

// The NaN x86-64 returns for an operation on a and b whose result is NaN.
template <typename F>
PX_HOST_DEVICE inline F host_nan(F a, F b) {
  if (a != a) return quiet_nan(a);
  if (b != b) return quiet_nan(b);
  return default_nan(a);
}

template <typename F>
PX_HOST_DEVICE inline F host_add(F a, F b) {
  F r = a + b;
  return r != r ? host_nan(a, b) : r;
}

template <typename F>
PX_HOST_DEVICE inline F host_mul(F a, F b) {
  F r = a * b;
  return r != r ? host_nan(a, b) : r;
}

template <typename F>
PX_HOST_DEVICE inline F host_div(F a, F b) {
  F r = a / b;
  return r != r ? host_nan(a, b) : r;
}

}  // namespace px::gpu
