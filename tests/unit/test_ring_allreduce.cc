#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "tests/unit/collective_test_util.h"
#include "transport/collectives/inproc_transport.h"
#include "transport/collectives/ring_allreduce.h"
#include "transport/fabric/fabric_endpoint.h"
#include "transport/kernels/wire16.h"

using namespace px;
using namespace pxt;

namespace {

template <typename T>
void check_group(std::vector<CollectiveTransport*> group, DType dtype, ReduceOp op, size_t count,
                 size_t chunk_bytes, int salt) {
  int n = static_cast<int>(group.size());
  auto data = small_integer_inputs<T>(n, count, salt);
  auto want = reference_reduction(data, op);
  Completion done;
  for (int r = 0; r < n; ++r) {
    RingAllreduceSpec spec;
    spec.buffer = data[static_cast<size_t>(r)].data();
    spec.count = count;
    spec.dtype = dtype;
    spec.op = op;
    spec.tag_base = make_tag(TagKind::kAllreduce, 5, static_cast<uint64_t>(salt));
    spec.chunk_bytes = chunk_bytes;
    start_ring_allreduce(*group[static_cast<size_t>(r)], spec, nullptr, done.callback());
  }
  REQUIRE(done.wait_for(n));
  CHECK(done.errors.empty());
  for (int r = 0; r < n && count > 0; ++r)
    CHECK(std::memcmp(data[static_cast<size_t>(r)].data(), want.data(), count * sizeof(T)) == 0);
}

float wire_round(DType wire, float v) {
  uint16_t packed;
  pack_wire16(wire, &v, 1, &packed);
  unpack_wire16(wire, &packed, 1, &v);
  return v;
}

// The 16-bit wire's rule, simulated (ring_allreduce.h): segment s starts at rank s and
// travels the ring; each rank adds its own f32 value to the rounded partial sum it received;
// the owner (rank s - 1) rounds the full sum once.
std::vector<float> simulate_wire_ring(const std::vector<std::vector<float>>& in, DType wire,
                                      ReduceOp op) {
  size_t n = in.size(), count = in[0].size();
  std::vector<float> out(count);
  for (size_t s = 0; s < n; ++s) {
    for (size_t i = count * s / n; i < count * (s + 1) / n; ++i) {
      float partial = in[s][i];
      for (size_t k = 1; k < n; ++k) {
        float mine = in[(s + k) % n][i], received = wire_round(wire, partial);
        partial = op == ReduceOp::kMax ? std::max(mine, received) : mine + received;
      }
      out[i] = n == 1 ? partial : wire_round(wire, partial);
    }
  }
  return out;
}

void check_wire_group(std::vector<CollectiveTransport*> group, DType wire, ReduceOp op,
                      size_t count, size_t chunk_bytes, int salt) {
  int n = static_cast<int>(group.size());
  std::mt19937 random(static_cast<uint32_t>(salt));
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(count));
  for (auto& rank : data)
    for (float& v : rank) v = value(random);
  auto want = simulate_wire_ring(data, wire, op);
  Completion done;
  for (int r = 0; r < n; ++r) {
    RingAllreduceSpec spec;
    spec.buffer = data[static_cast<size_t>(r)].data();
    spec.count = count;
    spec.op = op;
    spec.wire = wire;
    spec.tag_base = make_tag(TagKind::kAllreduce, 6, static_cast<uint64_t>(salt));
    spec.chunk_bytes = chunk_bytes;
    start_ring_allreduce(*group[static_cast<size_t>(r)], spec, nullptr, done.callback());
  }
  REQUIRE(done.wait_for(n));
  CHECK(done.errors.empty());
  // Bitwise the simulation's on every rank.
  for (int r = 0; r < n && count > 0; ++r)
    CHECK(std::memcmp(data[static_cast<size_t>(r)].data(), want.data(), count * 4) == 0);
}

}  // namespace

TEST_CASE("ring allreduce on a 16-bit wire: bitwise the simulated rounding rule on every rank") {
  for (int n = 1; n <= 5; ++n) {
    InProcGroup group(n);
    std::vector<CollectiveTransport*> members;
    for (int r = 0; r < n; ++r) members.push_back(&group.member(r));
    int salt = 1000;
    for (size_t count : {size_t{1}, size_t{3}, size_t{1000}, size_t{100003}}) {
      for (size_t chunk : {size_t{64}, size_t{1} << 20}) {
        CAPTURE(n);
        CAPTURE(count);
        CAPTURE(chunk);
        check_wire_group(members, DType::kBF16, ReduceOp::kSum, count, chunk, ++salt);
        check_wire_group(members, DType::kF16, ReduceOp::kSum, count, chunk, ++salt);
        check_wire_group(members, DType::kBF16, ReduceOp::kMax, count, chunk, ++salt);
      }
    }
  }
  // Over real endpoints, with the executor a thread pool would be: each conversion off the
  // transport's thread.
  for (int n : {2, 4}) {
    auto eps = open_endpoints(n);
    std::vector<CollectiveTransport*> members;
    for (auto& ep : eps) members.push_back(ep.get());
    CAPTURE(n);
    check_wire_group(members, DType::kBF16, ReduceOp::kSum, size_t{1} << 20, 64 * 1024, 77);
  }
}

TEST_CASE("ring allreduce over the in-process transport: 1-5 ranks, dtypes, ops, chunking") {
  for (int n = 1; n <= 5; ++n) {
    InProcGroup group(n);
    std::vector<CollectiveTransport*> members;
    for (int r = 0; r < n; ++r) members.push_back(&group.member(r));
    int salt = 0;
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, size_t{100003}}) {
      for (size_t chunk : {size_t{64}, size_t{4096}, size_t{1} << 20}) {
        CAPTURE(n);
        CAPTURE(count);
        CAPTURE(chunk);
        check_group<float>(members, DType::kF32, ReduceOp::kSum, count, chunk, ++salt);
        check_group<double>(members, DType::kF64, ReduceOp::kMax, count, chunk, ++salt);
        check_group<int32_t>(members, DType::kI32, ReduceOp::kMin, count, chunk, ++salt);
        check_group<int64_t>(members, DType::kI64, ReduceOp::kSum, count, chunk, ++salt);
      }
    }
  }
}

TEST_CASE("ring allreduce over real libfabric endpoints: tcp and ofi_rxm on loopback") {
  for (int n : {2, 3, 4}) {
    auto eps = open_endpoints(n);
    std::vector<CollectiveTransport*> members;
    for (auto& ep : eps) members.push_back(ep.get());
    int salt = 100;
    for (size_t count : {size_t{1}, size_t{4097}, size_t{1} << 20}) {
      CAPTURE(n);
      CAPTURE(count);
      check_group<float>(members, DType::kF32, ReduceOp::kSum, count, 64 * 1024, ++salt);
      check_group<int64_t>(members, DType::kI64, ReduceOp::kMax, count, 1 << 20, ++salt);
    }
  }
}

TEST_CASE("ring allreduce: concurrent operations with different tags do not mix") {
  auto eps = open_endpoints(3);
  const size_t count = 200000;
  std::vector<std::vector<std::vector<float>>> data;
  Completion done;
  for (int op = 0; op < 6; ++op) {
    data.push_back(small_integer_inputs<float>(3, count, op));
  }
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 6; ++i) {
      int op = (i + r * 2) % 6;  // every rank starts the operations in another order
      RingAllreduceSpec spec;
      spec.buffer = data[static_cast<size_t>(op)][static_cast<size_t>(r)].data();
      spec.count = count;
      spec.tag_base = make_tag(TagKind::kAllreduce, static_cast<uint32_t>(op + 1), 0);
      spec.chunk_bytes = 32 * 1024;
      start_ring_allreduce(*eps[static_cast<size_t>(r)], spec, nullptr, done.callback());
    }
  }
  REQUIRE(done.wait_for(18));
  CHECK(done.errors.empty());
  for (int op = 0; op < 6; ++op) {
    auto want = reference_reduction(small_integer_inputs<float>(3, count, op), ReduceOp::kSum);
    for (int r = 0; r < 3; ++r)
      CHECK(std::memcmp(data[static_cast<size_t>(op)][static_cast<size_t>(r)].data(), want.data(),
                        count * 4) == 0);
  }
}

TEST_CASE("ring allreduce: a lost node fails the operation on the survivors, no hang") {
  auto eps = open_endpoints(3);
  const size_t count = 100000;
  auto data = small_integer_inputs<float>(3, count, 1);
  Completion done;
  for (int r = 0; r < 2; ++r) {  // rank 2 never takes part
    RingAllreduceSpec spec;
    spec.buffer = data[static_cast<size_t>(r)].data();
    spec.count = count;
    spec.tag_base = make_tag(TagKind::kAllreduce, 9, 0);
    spec.chunk_bytes = 16 * 1024;
    start_ring_allreduce(*eps[static_cast<size_t>(r)], spec, nullptr, done.callback());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(done.count() == 0);
  eps[2].reset();  // node 2 dies
  for (int r = 0; r < 2; ++r) eps[static_cast<size_t>(r)]->fail_all("node 2 lost (test)");
  REQUIRE(done.wait_for(2, 10));
  REQUIRE(done.errors.size() == 2);
  // Each survivor names node 2: from fail_all, or from the provider if it saw the
  // connection drop first.
  for (auto& error : done.errors) CHECK_MESSAGE(error.find("node 2") != std::string::npos, error);
}

TEST_CASE("ring allreduce: a broken job's variables fail on live peers, others go on") {
  auto eps = open_endpoints(3);
  const size_t count = 100000;
  auto broken = small_integer_inputs<float>(3, count, 2);
  auto healthy = small_integer_inputs<float>(3, count, 3);
  Completion failed, fine;
  auto start = [&](std::vector<std::vector<float>>& data, uint32_t var, int r, Completion& c) {
    RingAllreduceSpec spec;
    spec.buffer = data[static_cast<size_t>(r)].data();
    spec.count = count;
    spec.tag_base = make_tag(TagKind::kAllreduce, var, 0);
    spec.chunk_bytes = 16 * 1024;
    start_ring_allreduce(*eps[static_cast<size_t>(r)], spec, nullptr, c.callback());
  };
  for (int r = 0; r < 2; ++r) start(broken, 11, r, failed);  // rank 2 never joins var 11
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(failed.count() == 0);
  // Every peer stays alive: only variable 11's transfers are failed, with the reason.
  for (int r = 0; r < 3; ++r)
    eps[static_cast<size_t>(r)]->fail_variables({11}, "job 'j' broke on node 2 (test)");
  REQUIRE(failed.wait_for(2, 10));
  REQUIRE(failed.errors.size() == 2);
  for (auto& error : failed.errors)
    CHECK_MESSAGE(error.find("job 'j' broke") != std::string::npos, error);
  // A later operation of that variable fails at once; another variable is unaffected.
  Completion late;
  start(broken, 11, 0, late);
  REQUIRE(late.wait_for(1, 5));
  CHECK(late.errors.size() == 1);
  for (int r = 0; r < 3; ++r) start(healthy, 12, r, fine);
  REQUIRE(fine.wait_for(3, 10));
  CHECK(fine.errors.empty());
  auto want = reference_reduction(small_integer_inputs<float>(3, count, 3), ReduceOp::kSum);
  for (int r = 0; r < 3; ++r)
    CHECK(std::memcmp(healthy[static_cast<size_t>(r)].data(), want.data(), count * 4) == 0);
}
