// The small-message allreduce (transport/collectives/recursive_doubling_allreduce.h):
// results against a reference, bitwise the same on every rank, over the in-process
// transport and real libfabric endpoints, and failures without a hang.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tests/unit/collective_test_util.h"
#include "transport/collectives/inproc_transport.h"
#include "transport/collectives/recursive_doubling_allreduce.h"
#include "transport/kernels/wire16.h"

using namespace px;
using namespace pxt;

namespace {

// Runs the allreduce on every member of group over data (one buffer per rank, bytes each).
void run(std::vector<CollectiveTransport*> group, std::vector<std::vector<char>>& data, DType dtype,
         ReduceOp op, size_t count, uint64_t tag, Completion& done) {
  for (size_t r = 0; r < group.size(); ++r) {
    RecursiveDoublingSpec spec;
    spec.buffer = data[r].data();
    spec.count = count;
    spec.dtype = dtype;
    spec.op = op;
    spec.tag_base = tag;
    start_recursive_doubling_allreduce(*group[r], spec, done.callback());
  }
}

template <typename T>
void check_exact(std::vector<CollectiveTransport*> group, DType dtype, ReduceOp op, size_t count,
                 int salt) {
  int n = static_cast<int>(group.size());
  auto in = small_integer_inputs<T>(n, count, salt);
  auto want = reference_reduction(in, op);
  std::vector<std::vector<char>> data;
  for (auto& v : in)
    data.emplace_back(reinterpret_cast<char*>(v.data()),
                      reinterpret_cast<char*>(v.data()) + count * sizeof(T));
  Completion done;
  run(group, data, dtype, op, count, make_tag(TagKind::kAllreduce, 3, uint64_t(salt)), done);
  REQUIRE(done.wait_for(n));
  CHECK(done.errors.empty());
  for (int r = 0; r < n && count > 0; ++r)
    CHECK(std::memcmp(data[size_t(r)].data(), want.data(), count * sizeof(T)) == 0);
}

std::vector<CollectiveTransport*> members_of(InProcGroup& group, int n) {
  std::vector<CollectiveTransport*> members;
  for (int r = 0; r < n; ++r) members.push_back(&group.member(r));
  return members;
}

}  // namespace

TEST_CASE("recursive doubling: 1-9 ranks (folding the non-powers of two), dtypes, ops") {
  for (int n = 1; n <= 9; ++n) {
    InProcGroup group(n);
    auto members = members_of(group, n);
    int salt = 0;
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, size_t{8192}}) {
      CAPTURE(n);
      CAPTURE(count);
      check_exact<float>(members, DType::kF32, ReduceOp::kSum, count, ++salt);
      check_exact<double>(members, DType::kF64, ReduceOp::kMax, count, ++salt);
      check_exact<int32_t>(members, DType::kI32, ReduceOp::kMin, count, ++salt);
      check_exact<int64_t>(members, DType::kI64, ReduceOp::kSum, count, ++salt);
    }
  }
}

TEST_CASE("recursive doubling: inexact sums are bitwise the same on every rank") {
  // Random floats: the result depends on the summation order, so every rank must use the
  // same one; f16 and bf16 round after each exchange, the same on every rank too.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int n : {2, 3, 5, 6, 8}) {
    InProcGroup group(n);
    auto members = members_of(group, n);
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      CAPTURE(n);
      CAPTURE(dtype_name(dtype));
      const size_t count = 999;
      size_t bytes = count * dtype_size(dtype);
      std::vector<std::vector<char>> data(static_cast<size_t>(n), std::vector<char>(bytes));
      for (auto& buffer : data) {
        std::vector<float> f(count);
        for (auto& x : f) x = value(rng);
        if (dtype == DType::kF32) {
          std::memcpy(buffer.data(), f.data(), bytes);
        } else {  // a float's top half is a valid bf16, and small floats' bits a valid f16
          for (size_t i = 0; i < count; ++i) {
            uint32_t bits;
            std::memcpy(&bits, &f[i], 4);
            uint16_t half =
                static_cast<uint16_t>(dtype == DType::kBF16 ? bits >> 16 : (bits >> 16) & 0x3bff);
            std::memcpy(buffer.data() + 2 * i, &half, 2);
          }
        }
      }
      Completion done;
      run(members, data, dtype, ReduceOp::kSum, count, make_tag(TagKind::kAllreduce, 4, 0), done);
      REQUIRE(done.wait_for(n));
      CHECK(done.errors.empty());
      for (int r = 1; r < n; ++r) CHECK(data[size_t(r)] == data[0]);
    }
  }
}

TEST_CASE("recursive doubling over real libfabric endpoints, 2-4 ranks") {
  for (int n : {2, 3, 4}) {
    auto eps = open_endpoints(n);
    std::vector<CollectiveTransport*> members;
    for (auto& ep : eps) members.push_back(ep.get());
    int salt = 100;
    for (size_t count : {size_t{1}, size_t{1024}, kRecursiveDoublingMaxBytes / 4}) {
      CAPTURE(n);
      CAPTURE(count);
      check_exact<float>(members, DType::kF32, ReduceOp::kSum, count, ++salt);
      check_exact<int64_t>(members, DType::kI64, ReduceOp::kMax, count, ++salt);
    }
  }
}

TEST_CASE("recursive doubling: a lost node fails the operation on the survivors, no hang") {
  for (int n : {3, 4}) {
    CAPTURE(n);
    auto eps = open_endpoints(n);
    std::vector<std::vector<char>> data(static_cast<size_t>(n), std::vector<char>(4096));
    Completion done;
    for (int r = 0; r < n - 1; ++r) {  // the last rank never takes part
      RecursiveDoublingSpec spec;
      spec.buffer = data[size_t(r)].data();
      spec.count = 1024;
      spec.tag_base = make_tag(TagKind::kAllreduce, 9, 0);
      start_recursive_doubling_allreduce(*eps[size_t(r)], spec, done.callback());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    eps[size_t(n - 1)].reset();
    for (int r = 0; r < n - 1; ++r) eps[size_t(r)]->fail_all("node lost (test)");
    REQUIRE(done.wait_for(n - 1, 10));
    CHECK(done.errors.size() == size_t(n - 1));
  }
}

TEST_CASE("recursive doubling on a 16-bit wire: one wire value, the same on every rank") {
  for (DType wire : {DType::kBF16, DType::kF16}) {
    for (int n = 2; n <= 7; ++n) {
      CAPTURE(n);
      CAPTURE(dtype_name(wire));
      InProcGroup group(n);
      const size_t count = 1000;
      std::mt19937 random(static_cast<uint32_t>(n));
      std::uniform_real_distribution<float> value(-3.0f, 3.0f);
      std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(count));
      std::vector<double> exact(count, 0.0);
      for (auto& rank : data)
        for (size_t i = 0; i < count; ++i) exact[i] += rank[i] = value(random);
      Completion done;
      for (int r = 0; r < n; ++r) {
        RecursiveDoublingSpec spec;
        spec.buffer = data[size_t(r)].data();
        spec.count = count;
        spec.wire = wire;
        spec.tag_base = make_tag(TagKind::kAllreduce, 4, uint64_t(n));
        start_recursive_doubling_allreduce(group.member(r), spec, done.callback());
      }
      REQUIRE(done.wait_for(n));
      CHECK(done.errors.empty());
      // Each rank's operands were rounded before every exchange: a few ulps of the wire
      // type per level (bf16 keeps 8 significant bits, f16 11).
      double ulp = wire == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
      for (size_t i = 0; i < count; ++i) {
        float got = data[0][i];
        uint16_t packed;
        pack_wire16(wire, &got, 1, &packed);
        float again;
        unpack_wire16(wire, &packed, 1, &again);
        CHECK(again == got);  // a wire value
        CHECK(std::abs(got - exact[i]) <= 3.0 * n * ulp * 3.0);
        for (int r = 1; r < n; ++r) CHECK(std::memcmp(&data[size_t(r)][i], &got, 4) == 0);
      }
    }
  }
}
