// Deterministic per-rank inputs and their reference reduction, shared by the test worker
// and px-bench's checks. Uses tests/common/reference.h, never the library's kernels.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "parallax_c.h"
#include "tests/common/reference.h"

namespace pxt {

inline size_t element_size(px_dtype t) {
  switch (t) {
    case PX_DTYPE_FORCE_32BIT:  // pins the enum to 32 bits; not a dtype
      break;
    case PX_F32:
    case PX_I32:
      return 4;
    case PX_F64:
    case PX_I64:
      return 8;
    case PX_F16:
    case PX_BF16:
      return 2;
  }
  return 0;
}

inline int64_t raw_value(int rank, uint64_t step, uint64_t i, uint64_t seed) {
  return static_cast<int64_t>((static_cast<uint64_t>(rank) * 131 + i * 31 + step * 17 + seed * 7) %
                              2001) -
         1000;
}

// Exact mode: small integers, whose sums are exact in every dtype, so any summation order
// (a cluster's ring) gives bitwise the reference result.
inline bool& exact_inputs() {
  static bool exact = false;
  return exact;
}

// Fills one rank's input for (step, seed).
inline void fill_input(px_dtype t, int rank, uint64_t step, uint64_t seed, uint64_t count,
                       void* out) {
  for (uint64_t i = 0; i < count; ++i) {
    int64_t r = raw_value(rank, step, i, seed);
    if (exact_inputs()) r %= 32;
    // Otherwise not dyadic: sums need rounding.
    double x = exact_inputs() ? static_cast<double>(r) : static_cast<double>(r) / 3.0;
    switch (t) {
      case PX_DTYPE_FORCE_32BIT:  // pins the enum to 32 bits; not a dtype
        break;
      case PX_F32:
        static_cast<float*>(out)[i] = static_cast<float>(x);
        break;
      case PX_F64:
        static_cast<double*>(out)[i] = x;
        break;
      case PX_F16:
        static_cast<uint16_t*>(out)[i] =
            ref_float_to_f16(exact_inputs() ? static_cast<float>(x) : static_cast<float>(x) / 8);
        break;
      case PX_BF16:
        static_cast<uint16_t*>(out)[i] = ref_float_to_bf16(static_cast<float>(x));
        break;
      case PX_I32:
        static_cast<int32_t*>(out)[i] = static_cast<int32_t>(r * 1000003);
        break;
      case PX_I64:
        static_cast<int64_t*>(out)[i] = r * 1000000007LL;
        break;
    }
  }
}

// One rank's input for a reduction with op: fill_input's values, or for products -1, 0 and
// 1, whose products are exact in every dtype and every order (a cluster's ring).
inline void fill_input_for(px_dtype t, px_reduce_op op, int rank, uint64_t step, uint64_t seed,
                           uint64_t count, void* out) {
  if (op != PX_PROD) return fill_input(t, rank, step, seed, count, out);
  for (uint64_t i = 0; i < count; ++i) {
    int64_t r = raw_value(rank, step, i, seed) % 2;
    switch (t) {
      case PX_DTYPE_FORCE_32BIT:  // pins the enum to 32 bits; not a dtype
        break;
      case PX_F32:
        static_cast<float*>(out)[i] = static_cast<float>(r);
        break;
      case PX_F64:
        static_cast<double*>(out)[i] = static_cast<double>(r);
        break;
      case PX_F16:
        static_cast<uint16_t*>(out)[i] = ref_float_to_f16(static_cast<float>(r));
        break;
      case PX_BF16:
        static_cast<uint16_t*>(out)[i] = ref_float_to_bf16(static_cast<float>(r));
        break;
      case PX_I32:
        static_cast<int32_t*>(out)[i] = static_cast<int32_t>(r);
        break;
      case PX_I64:
        static_cast<int64_t*>(out)[i] = r;
        break;
    }
  }
}

// The result every rank must see: ranks combined in rank order, as the ABI documents.
inline std::vector<unsigned char> expected_result(px_dtype t, px_reduce_op op, int world,
                                                  uint64_t step, uint64_t seed, uint64_t count) {
  size_t es = element_size(t);
  std::vector<std::vector<unsigned char>> inputs(static_cast<size_t>(world),
                                                 std::vector<unsigned char>(count * es));
  for (int r = 0; r < world; ++r)
    fill_input_for(t, op, r, step, seed, count, inputs[static_cast<size_t>(r)].data());
  std::vector<unsigned char> out(count * es);
  for (uint64_t i = 0; i < count; ++i) {
    auto at = [&](int r) { return inputs[static_cast<size_t>(r)].data() + i * es; };
    switch (t) {
      case PX_DTYPE_FORCE_32BIT:  // pins the enum to 32 bits; not a dtype
        break;
      case PX_F32:
      case PX_F64:
      case PX_F16:
      case PX_BF16: {
        auto widen = [&](const unsigned char* p) -> double {
          if (t == PX_F32) {
            float f;
            std::memcpy(&f, p, 4);
            return f;
          }
          if (t == PX_F64) {
            double d;
            std::memcpy(&d, p, 8);
            return d;
          }
          uint16_t h;
          std::memcpy(&h, p, 2);
          return t == PX_F16 ? ref_f16_to_float(h) : ref_bf16_to_float(h);
        };
        if (t == PX_F64) {
          double acc = widen(at(0));
          for (int r = 1; r < world; ++r) acc = ref_combine<double>(acc, widen(at(r)), op);
          if (op == PX_MEAN) acc /= world;
          std::memcpy(out.data() + i * es, &acc, 8);
        } else {
          float acc = static_cast<float>(widen(at(0)));
          for (int r = 1; r < world; ++r)
            acc = ref_combine<float>(acc, static_cast<float>(widen(at(r))), op);
          if (op == PX_MEAN) acc /= static_cast<float>(world);
          if (t == PX_F32) {
            std::memcpy(out.data() + i * es, &acc, 4);
          } else {
            uint16_t h = t == PX_F16 ? ref_float_to_f16(acc) : ref_float_to_bf16(acc);
            std::memcpy(out.data() + i * es, &h, 2);
          }
        }
        break;
      }
      case PX_I32:
      case PX_I64: {
        auto get = [&](int r) -> int64_t {
          if (t == PX_I32) {
            int32_t v;
            std::memcpy(&v, at(r), 4);
            return v;
          }
          int64_t v;
          std::memcpy(&v, at(r), 8);
          return v;
        };
        int64_t acc = get(0);
        for (int r = 1; r < world; ++r) {
          int64_t v = get(r);
          if (op == PX_MIN)
            acc = std::min(acc, v);
          else if (op == PX_MAX)
            acc = std::max(acc, v);
          else if (op == PX_PROD)
            acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v));
          else
            acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v));
        }
        if (op == PX_MEAN) acc /= world;
        if (t == PX_I32) {
          int32_t v = static_cast<int32_t>(acc);  // low 32 bits: the same as a wrapping sum
          std::memcpy(out.data() + i * es, &v, 4);
        } else {
          std::memcpy(out.data() + i * es, &acc, 8);
        }
        break;
      }
    }
  }
  return out;
}

}  // namespace pxt
