#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/common/reference.h"
#include "transport/kernels/half.h"
#include "transport/kernels/reduce.h"

using px::DType;
using px::ReduceOp;
using namespace pxt;

namespace {

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
std::vector<T> run_reduce(DType dtype, ReduceOp op, const std::vector<std::vector<T>>& srcs,
                          bool in_place) {
  std::vector<std::vector<T>> copy = srcs;
  std::vector<const void*> ptrs;
  for (auto& s : copy) ptrs.push_back(s.data());
  std::vector<T> out(srcs[0].size());
  void* dst = in_place ? copy[0].data() : out.data();
  px::reduce_buffers(dtype, op, dst, ptrs.data(), ptrs.size(), srcs[0].size(),
                     static_cast<unsigned>(srcs.size()));
  return in_place ? copy[0] : out;
}

template <typename T>
std::vector<T> ref_float(const std::vector<std::vector<T>>& srcs, int op) {
  std::vector<T> out = srcs[0];
  for (size_t k = 1; k < srcs.size(); ++k)
    for (size_t i = 0; i < out.size(); ++i) out[i] = ref_combine<T>(out[i], srcs[k][i], op);
  if (op == kRefMean)
    for (auto& v : out) v /= static_cast<T>(srcs.size());
  return out;
}

template <typename T>
std::vector<T> ref_int(const std::vector<std::vector<T>>& srcs, int op) {
  using U = std::make_unsigned_t<T>;
  std::vector<T> out(srcs[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (op == kRefMin || op == kRefMax) {
      T v = srcs[0][i];
      for (size_t k = 1; k < srcs.size(); ++k)
        v = op == kRefMin ? std::min(v, srcs[k][i]) : std::max(v, srcs[k][i]);
      out[i] = v;
    } else if (op == kRefSum) {
      U v = 0;
      for (auto& s : srcs) v += static_cast<U>(s[i]);
      out[i] = static_cast<T>(v);
    } else if (op == kRefProd) {  // wraps, as the sum does
      U v = 1;
      for (auto& s : srcs) v = static_cast<U>(v * static_cast<U>(s[i]));
      out[i] = static_cast<T>(v);
    } else {
      int64_t total = 0;
      for (auto& s : srcs)
        total = static_cast<int64_t>(static_cast<uint64_t>(total) +
                                     static_cast<uint64_t>(static_cast<int64_t>(s[i])));
      out[i] = static_cast<T>(total / static_cast<int64_t>(srcs.size()));
    }
  }
  return out;
}

std::vector<uint16_t> ref_half(const std::vector<std::vector<uint16_t>>& srcs, int op, bool bf16) {
  auto widen = bf16 ? ref_bf16_to_float : ref_f16_to_float;
  auto narrow = bf16 ? ref_float_to_bf16 : ref_float_to_f16;
  std::vector<uint16_t> out(srcs[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    float acc = widen(srcs[0][i]);
    for (size_t k = 1; k < srcs.size(); ++k) acc = ref_combine<float>(acc, widen(srcs[k][i]), op);
    if (op == kRefMean) acc /= static_cast<float>(srcs.size());
    out[i] = narrow(acc);
  }
  return out;
}

template <typename T>
std::vector<std::vector<T>> random_inputs(size_t nsrc, size_t count, std::mt19937_64& rng) {
  std::vector<std::vector<T>> srcs(nsrc, std::vector<T>(count));
  for (auto& s : srcs)
    for (auto& v : s) {
      if constexpr (std::is_floating_point_v<T>) {
        v = static_cast<T>(std::uniform_real_distribution<double>(-1000, 1000)(rng));
      } else {
        v = static_cast<T>(rng());  // full range: sums wrap
      }
    }
  return srcs;
}

std::vector<std::vector<uint16_t>> random_half_inputs(size_t nsrc, size_t count,
                                                      std::mt19937_64& rng, bool bf16) {
  std::vector<std::vector<uint16_t>> srcs(nsrc, std::vector<uint16_t>(count));
  for (auto& s : srcs)
    for (auto& v : s) {
      float f = static_cast<float>(std::uniform_real_distribution<double>(-300, 300)(rng));
      v = bf16 ? ref_float_to_bf16(f) : ref_float_to_f16(f);
    }
  return srcs;
}

const size_t kCounts[] = {1, 3, 1023, 1024, 1025, 4099};

}  // namespace

TEST_CASE("reduce: every dtype x op x source count x length matches the reference bitwise") {
  std::mt19937_64 rng(7);
  for (int op = 0; op < static_cast<int>(px::kReduceOpCount); ++op) {
    for (size_t nsrc = 1; nsrc <= 4; ++nsrc) {
      for (size_t count : kCounts) {
        for (bool in_place : {false, true}) {
          CAPTURE(op);
          CAPTURE(nsrc);
          CAPTURE(count);
          CAPTURE(in_place);
          ReduceOp rop = static_cast<ReduceOp>(op);
          auto f32 = random_inputs<float>(nsrc, count, rng);
          CHECK(same_bits(run_reduce(DType::kF32, rop, f32, in_place), ref_float(f32, op)));
          auto f64 = random_inputs<double>(nsrc, count, rng);
          CHECK(same_bits(run_reduce(DType::kF64, rop, f64, in_place), ref_float(f64, op)));
          auto i32 = random_inputs<int32_t>(nsrc, count, rng);
          CHECK(same_bits(run_reduce(DType::kI32, rop, i32, in_place), ref_int(i32, op)));
          auto i64 = random_inputs<int64_t>(nsrc, count, rng);
          CHECK(same_bits(run_reduce(DType::kI64, rop, i64, in_place), ref_int(i64, op)));
          auto f16 = random_half_inputs(nsrc, count, rng, false);
          CHECK(same_bits(run_reduce(DType::kF16, rop, f16, in_place), ref_half(f16, op, false)));
          auto bf16 = random_half_inputs(nsrc, count, rng, true);
          CHECK(same_bits(run_reduce(DType::kBF16, rop, bf16, in_place), ref_half(bf16, op, true)));
        }
      }
    }
  }
}

TEST_CASE("reduce: NaN in any input propagates through sum, mean, min, max and prod") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int op = 0; op < static_cast<int>(px::kReduceOpCount); ++op) {
    for (size_t nan_at = 0; nan_at < 3; ++nan_at) {
      CAPTURE(op);
      CAPTURE(nan_at);
      std::vector<std::vector<float>> f32(3, std::vector<float>{1.0f, -2.0f});
      f32[nan_at][0] = nan;
      auto out = run_reduce(DType::kF32, static_cast<ReduceOp>(op), f32, false);
      CHECK(std::isnan(out[0]));
      CHECK_FALSE(std::isnan(out[1]));
      std::vector<std::vector<double>> f64(3, std::vector<double>{1.0, -2.0});
      f64[nan_at][0] = std::numeric_limits<double>::quiet_NaN();
      auto out64 = run_reduce(DType::kF64, static_cast<ReduceOp>(op), f64, false);
      CHECK(std::isnan(out64[0]));
      for (bool bf16 : {false, true}) {
        std::vector<std::vector<uint16_t>> h(
            3, std::vector<uint16_t>{bf16 ? ref_float_to_bf16(1) : ref_float_to_f16(1)});
        h[nan_at][0] = bf16 ? 0x7fc0 : 0x7e00;
        auto outh =
            run_reduce(bf16 ? DType::kBF16 : DType::kF16, static_cast<ReduceOp>(op), h, false);
        CHECK(std::isnan(bf16 ? ref_bf16_to_float(outh[0]) : ref_f16_to_float(outh[0])));
      }
    }
  }
}

TEST_CASE("half: f16 conversions agree with the compiler's _Float16 everywhere") {
  for (uint32_t u = 0; u < 65536; ++u) {
    float want = ref_f16_to_float(static_cast<uint16_t>(u));
    float got = px::f16_to_float(static_cast<uint16_t>(u));
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(std::memcmp(&want, &got, 4) == 0);
    }
  }
  std::mt19937 rng(1);
  size_t mismatches = 0;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = rng();
    if (i % 2)
      bits = (bits & 0x807fffffu) | ((100u + rng() % 60u) << 23);  // mostly near f16's range
    float f;
    std::memcpy(&f, &bits, 4);
    uint16_t want = ref_float_to_f16(f), got = px::float_to_f16(f);
    if (std::isnan(f)) {
      mismatches += (got & 0x7c00) != 0x7c00 || (got & 0x3ff) == 0;
    } else {
      mismatches += want != got;
    }
  }
  CHECK(mismatches == 0);
  // Ties round to even, overflow goes to infinity.
  CHECK(px::float_to_f16(65504.0f) == 0x7bff);
  CHECK(px::float_to_f16(65520.0f) == 0x7c00);
  CHECK(px::float_to_f16(1.0f + 1.0f / 2048) == 0x3c00);
  CHECK(px::float_to_f16(1.0f + 3.0f / 2048) == 0x3c02);
}

TEST_CASE("half: bf16 rounding agrees with a nearest-value reference") {
  std::mt19937 rng(2);
  size_t mismatches = 0;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = rng();
    if (i % 4 == 0) bits &= 0xffff8000u | (rng() & 1);  // many exact ties
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) {
      mismatches += !std::isnan(px::bf16_to_float(px::float_to_bf16(f)));
    } else {
      mismatches += px::float_to_bf16(f) != ref_float_to_bf16(f);
    }
  }
  CHECK(mismatches == 0);
}
