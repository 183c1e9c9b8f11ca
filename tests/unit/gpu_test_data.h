// Inputs the GPU kernels' tests share (host emulation and device runs): reduction sources
// of every dtype with special values, and a Zipf-skewed sparse push.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "sharding/coalesce.h"
#include "transport/kernels/dtype.h"
#include "transport/kernels/half.h"
#include "transport/kernels/reduce.h"

namespace pxt::gpu {

using Bytes = std::vector<uint8_t>;

template <typename T>
void put(Bytes& b, size_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}

// One special value of a float type, by number: NaN (quiet and signalling), infinities,
// signed zeros, subnormals, values whose sums overflow.
template <typename F>
F special_float(size_t which) {
  using L = std::numeric_limits<F>;
  switch (which % 9) {
    case 0:
      return L::quiet_NaN();
    case 1:
      return L::signaling_NaN();
    case 2:
      return L::infinity();
    case 3:
      return -L::infinity();
    case 4:
      return static_cast<F>(-0.0);
    case 5:
      return L::denorm_min();
    case 6:
      return -L::denorm_min() * 3;
    case 7:
      return L::max();
    default:
      return -L::max();
  }
}

// nsrc sources of count elements of dtype. Element i of source k holds a special value
// when i % 97 == k (so at most one source has one there), and elements i % 101 == 0 hold
// +inf in source 0 and -inf in source 1 (an invalid sum: the default NaN), nothing else
// special there: two NaNs never meet, where the host's NaN bits depend on its compiler.
inline std::vector<Bytes> make_sources(px::DType dtype, size_t nsrc, size_t count,
                                       std::mt19937_64& rng) {
  size_t elem = px::dtype_size(dtype);
  std::vector<Bytes> srcs(nsrc, Bytes(count * elem));
  std::uniform_real_distribution<double> value(-1000, 1000);
  for (size_t k = 0; k < nsrc; ++k) {
    Bytes& s = srcs[k];
    for (size_t i = 0; i < count; ++i) {
      bool opposed = i % 101 == 0 && k < 2;
      bool special = i % 101 != 0 && i % 97 == k;
      double v = value(rng);
      switch (dtype) {
        case px::DType::kF32: {
          float f = static_cast<float>(v);
          if (opposed) f = k == 0 ? INFINITY : -INFINITY;
          if (special) f = special_float<float>(i / 97 + k);
          put(s, i, f);
          break;
        }
        case px::DType::kF64: {
          double d = v * 1e-3;
          if (opposed) d = k == 0 ? INFINITY : -INFINITY;
          if (special) d = special_float<double>(i / 97 + k);
          put(s, i, d);
          break;
        }
        case px::DType::kF16:
        case px::DType::kBF16: {
          bool bf = dtype == px::DType::kBF16;
          float f = static_cast<float>(v * (i % 7 == 0 ? 60.0 : 0.3));  // some sums overflow f16
          if (opposed) f = k == 0 ? INFINITY : -INFINITY;
          if (special) f = special_float<float>(i / 97 + k);
          uint16_t h = bf ? px::float_to_bf16(f) : px::float_to_f16(f);
          if (special && (i / 97 + k) % 9 == 1) h = bf ? 0x7f81 : 0x7c01;  // signalling NaN bits
          put(s, i, h);
          break;
        }
        case px::DType::kI32:
          put(s, i, static_cast<int32_t>(rng()));
          break;
        case px::DType::kI64:
          put(s, i, static_cast<int64_t>(rng()));
          break;
      }
    }
  }
  return srcs;
}

// reduce_buffers over copies of srcs (in place into source 0's copy, or into a new buffer).
inline Bytes host_reduce(px::DType dtype, px::ReduceOp op, const std::vector<Bytes>& srcs,
                         size_t count, unsigned divisor, bool in_place) {
  std::vector<Bytes> copy = srcs;
  std::vector<const void*> ptrs;
  for (const Bytes& s : copy) ptrs.push_back(s.data());
  Bytes out(count * px::dtype_size(dtype));
  void* dst = in_place ? copy[0].data() : out.data();
  px::reduce_buffers(dtype, op, dst, ptrs.data(), ptrs.size(), count, divisor);
  return in_place ? copy[0] : out;
}

// A push of n indices drawn Zipf(s)-skewed from [0, rows) (rank 0 most frequent, ranks
// scattered over the rows), and n x dim gradients.
struct Push {
  std::vector<int64_t> indices;
  std::vector<float> grads;
  size_t dim = 0;
};

inline Push zipf_push(size_t n, size_t dim, uint64_t rows, double s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> cdf(rows);
  double total = 0;
  for (uint64_t r = 0; r < rows; ++r) cdf[r] = total += 1.0 / std::pow(double(r + 1), s);
  std::uniform_real_distribution<double> u(0, total);
  std::normal_distribution<float> g(0.0f, 1.0f);
  Push p;
  p.dim = dim;
  for (size_t i = 0; i < n; ++i) {
    uint64_t rank =
        static_cast<uint64_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
    if (rank >= rows) rank = rows - 1;
    p.indices.push_back(static_cast<int64_t>(rank * 7919 % rows));  // scatter the head
  }
  p.grads.resize(n * dim);
  for (float& v : p.grads) v = g(rng);
  return p;
}

}  // namespace pxt::gpu
