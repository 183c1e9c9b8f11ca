// The 16-bit wire dtypes of sparse rows and gradients (sharding/wire_values.h).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "sharding/sparse_spec.h"
#include "sharding/wire_values.h"

using namespace px;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST_CASE("wire values: bf16 and f16 round to nearest even, f16 saturates, NaN stays NaN") {
  // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (even: 1);
  // 1 + 3 * 2^-9 is nearer 1 + 2^-7.
  std::vector<float> v = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-9f,
                          -3.0f,          1e30f,
                          0.0f,           std::numeric_limits<float>::quiet_NaN()};
  round_to_wire(WireDtype::kBf16, v.data(), v.size());
  CHECK(v[0] == 1.0f);
  CHECK(v[1] == 1.0f + 0x1p-7f);
  CHECK(v[2] == -3.0f);
  CHECK(bits(v[3]) == (bits(1e30f) + 0x8000u) >> 16 << 16);  // bf16 has f32's range
  CHECK(v[4] == 0.0f);
  CHECK(std::isnan(v[5]));

  // f16 keeps 11: 1 + 2^-11 ties to 1; 65504 is the largest value, 1e6 saturates to it.
  std::vector<float> h = {1.0f + 0x1p-11f,
                          1.0f + 3 * 0x1p-12f,
                          1e6f,
                          -1e6f,
                          1e-8f,
                          std::numeric_limits<float>::quiet_NaN()};
  round_to_wire(WireDtype::kF16, h.data(), h.size());
  CHECK(h[0] == 1.0f);
  CHECK(h[1] == 1.0f + 0x1p-10f);
  CHECK(h[2] == 65504.0f);
  CHECK(h[3] == -65504.0f);
  CHECK(h[4] == 0.0f);  // below half the smallest subnormal (2^-25)
  CHECK(std::isnan(h[5]));

  std::vector<float> f = {1.0f + 0x1p-20f};
  round_to_wire(WireDtype::kF32, f.data(), 1);
  CHECK(f[0] == 1.0f + 0x1p-20f);
}

TEST_CASE("wire values: packing rounded values and unpacking them gives them back bitwise") {
  for (WireDtype wire : {WireDtype::kBf16, WireDtype::kF16}) {
    CAPTURE(wire_dtype_name(wire));
    std::vector<float> v;
    for (int i = -500; i < 500; ++i) v.push_back(float(i) * 0.37f + float(i * i) * 1e-3f);
    round_to_wire(wire, v.data(), v.size());
    std::vector<uint16_t> packed(v.size());
    pack_wire(wire, v.data(), v.size(), packed.data());
    std::vector<float> back(v.size());
    unpack_wire(wire, packed.data(), packed.size(), back.data());
    CHECK(std::memcmp(back.data(), v.data(), v.size() * 4) == 0);
    CHECK(wire_value_bytes(wire) == 2);
  }
  CHECK(wire_value_bytes(WireDtype::kF32) == 4);
}

TEST_CASE(
    "wire values: the options name a 16-bit wire, and only ps, hybrid and alltoall take one") {
  SparseOptions o;
  std::string error;
  CHECK(o.canonical().find("wire") == std::string::npos);  // f32: older strings unchanged
  o.wire = WireDtype::kBf16;
  CHECK(o.validate(&error));
  CHECK(o.canonical().find(" wire=bf16") != std::string::npos);
  o.route = Route::kAllgatherv;
  CHECK_FALSE(o.validate(&error));
  CHECK(error ==
        "wire_dtype bf16 needs the ps, hybrid or alltoall route (the allgatherv route sends f32 "
        "only)");
  o.route = Route::kPs;
  o.wire = static_cast<WireDtype>(4);
  CHECK_FALSE(o.validate(&error));
  CHECK(error == "wire_dtype must be PX_F32, PX_F16 or PX_BF16");
}
