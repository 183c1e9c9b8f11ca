#include "transport/kernels/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "transport/kernels/half.h"

namespace px {
namespace {

// Elements per block: a few KiB so the accumulator stays in L1 across all sources.
constexpr size_t kBlock = 1024;

template <typename T>
struct Sum {
  static T apply(T a, T b) { return a + b; }
};
template <typename T>
struct Min {
  static T apply(T a, T b) { return a != a ? a : (a < b ? a : b); }  // a != a: NaN wins
};
template <typename T>
struct Max {
  static T apply(T a, T b) { return a != a ? a : (a > b ? a : b); }
};
template <typename T>
struct Prod {
  static T apply(T a, T b) { return a * b; }
};
// Integer sums and products wrap (two's complement) instead of overflowing into undefined
// behaviour; the unsigned type is at least int's width, so its arithmetic does not promote.
template <typename T>
using WrapUnsigned =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
template <typename T>
struct WrapSum {
  using U = WrapUnsigned<T>;
  static T apply(T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }
};
template <typename T>
struct WrapProd {
  using U = WrapUnsigned<T>;
  static T apply(T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); }
};

template <typename Acc, typename Op>
void combine_into(Acc* acc, const Acc* src, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Op::apply(acc[i], src[i]);
}

// Same-type reduction (f32, f64, i32, i64): accumulate straight into dst, block by block.
template <typename T, typename Op>
void reduce_native(T* dst, const void* const* srcs, size_t nsrc, size_t count) {
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = std::min(kBlock, count - base);
    T* out = dst + base;
    const T* first = static_cast<const T*>(srcs[0]) + base;
    if (out != first) std::memcpy(out, first, n * sizeof(T));
    for (size_t k = 1; k < nsrc; ++k)
      combine_into<T, Op>(out, static_cast<const T*>(srcs[k]) + base, n);
  }
}

template <typename T>
void divide_float(T* dst, size_t count, unsigned divisor) {
  T d = static_cast<T>(divisor);
  for (size_t i = 0; i < count; ++i) dst[i] /= d;
}

// Integer mean: accumulate in int64 (i32) so the division sees the true total.
template <typename T>
void mean_int(T* dst, const void* const* srcs, size_t nsrc, size_t count, unsigned divisor) {
  int64_t acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = std::min(kBlock, count - base);
    for (size_t i = 0; i < n; ++i) acc[i] = static_cast<const T*>(srcs[0])[base + i];
    for (size_t k = 1; k < nsrc; ++k) {
      const T* s = static_cast<const T*>(srcs[k]) + base;
      for (size_t i = 0; i < n; ++i)
        acc[i] = static_cast<int64_t>(static_cast<uint64_t>(acc[i]) + static_cast<uint64_t>(s[i]));
    }
    for (size_t i = 0; i < n; ++i)
      dst[base + i] = static_cast<T>(acc[i] / static_cast<int64_t>(divisor));
  }
}

// 16-bit floats: widen to f32, reduce, round once.
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float), typename Op>
void reduce_half(uint16_t* dst, const void* const* srcs, size_t nsrc, size_t count, bool mean,
                 unsigned divisor) {
  float acc[kBlock];
  float other[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = std::min(kBlock, count - base);
    const uint16_t* first = static_cast<const uint16_t*>(srcs[0]) + base;
    for (size_t i = 0; i < n; ++i) acc[i] = Widen(first[i]);
    for (size_t k = 1; k < nsrc; ++k) {
      const uint16_t* s = static_cast<const uint16_t*>(srcs[k]) + base;
      for (size_t i = 0; i < n; ++i) other[i] = Widen(s[i]);
      combine_into<float, Op>(acc, other, n);
    }
    if (mean) divide_float(acc, n, divisor);
    for (size_t i = 0; i < n; ++i) dst[base + i] = Narrow(acc[i]);
  }
}

template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void dispatch_half(ReduceOp op, void* dst, const void* const* srcs, size_t nsrc, size_t count,
                   unsigned divisor) {
  auto* d = static_cast<uint16_t*>(dst);
  switch (op) {
    case ReduceOp::kSum:
      return reduce_half<Widen, Narrow, Sum<float>>(d, srcs, nsrc, count, false, 1);
    case ReduceOp::kMean:
      return reduce_half<Widen, Narrow, Sum<float>>(d, srcs, nsrc, count, true, divisor);
    case ReduceOp::kMin:
      return reduce_half<Widen, Narrow, Min<float>>(d, srcs, nsrc, count, false, 1);
    case ReduceOp::kMax:
      return reduce_half<Widen, Narrow, Max<float>>(d, srcs, nsrc, count, false, 1);
    case ReduceOp::kProd:
      return reduce_half<Widen, Narrow, Prod<float>>(d, srcs, nsrc, count, false, 1);
  }
}

template <typename T>
void dispatch_float(ReduceOp op, void* dst, const void* const* srcs, size_t nsrc, size_t count,
                    unsigned divisor) {
  T* d = static_cast<T*>(dst);
  switch (op) {
    case ReduceOp::kSum:
      return reduce_native<T, Sum<T>>(d, srcs, nsrc, count);
    case ReduceOp::kMean:
      reduce_native<T, Sum<T>>(d, srcs, nsrc, count);
      return divide_float(d, count, divisor);
    case ReduceOp::kMin:
      return reduce_native<T, Min<T>>(d, srcs, nsrc, count);
    case ReduceOp::kMax:
      return reduce_native<T, Max<T>>(d, srcs, nsrc, count);
    case ReduceOp::kProd:
      return reduce_native<T, Prod<T>>(d, srcs, nsrc, count);
  }
}

template <typename T>
void dispatch_int(ReduceOp op, void* dst, const void* const* srcs, size_t nsrc, size_t count,
                  unsigned divisor) {
  T* d = static_cast<T*>(dst);
  switch (op) {
    case ReduceOp::kSum:
      return reduce_native<T, WrapSum<T>>(d, srcs, nsrc, count);
    case ReduceOp::kMean:
      return mean_int<T>(d, srcs, nsrc, count, divisor);
    case ReduceOp::kMin:
      return reduce_native<T, Min<T>>(d, srcs, nsrc, count);
    case ReduceOp::kMax:
      return reduce_native<T, Max<T>>(d, srcs, nsrc, count);
    case ReduceOp::kProd:
      return reduce_native<T, WrapProd<T>>(d, srcs, nsrc, count);
  }
}

}  // namespace

void reduce_buffers(DType dtype, ReduceOp op, void* dst, const void* const* srcs, size_t nsrc,
                    size_t count, unsigned mean_divisor) {
  if (nsrc == 0 || count == 0) return;
  if (mean_divisor == 0) mean_divisor = 1;
  switch (dtype) {
    case DType::kF32:
      return dispatch_float<float>(op, dst, srcs, nsrc, count, mean_divisor);
    case DType::kF64:
      return dispatch_float<double>(op, dst, srcs, nsrc, count, mean_divisor);
    case DType::kF16:
      return dispatch_half<f16_to_float, float_to_f16>(op, dst, srcs, nsrc, count, mean_divisor);
    case DType::kBF16:
      return dispatch_half<bf16_to_float, float_to_bf16>(op, dst, srcs, nsrc, count, mean_divisor);
    case DType::kI32:
      return dispatch_int<int32_t>(op, dst, srcs, nsrc, count, mean_divisor);
    case DType::kI64:
      return dispatch_int<int64_t>(op, dst, srcs, nsrc, count, mean_divisor);
  }
}

}  // namespace px
