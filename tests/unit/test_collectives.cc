#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "tests/unit/collective_test_util.h"
#include "transport/collectives/chain_broadcast.h"
#include "transport/collectives/inproc_transport.h"
#include "transport/collectives/pairwise_exchange.h"
#include "transport/collectives/ring_allgatherv.h"
#include "transport/collectives/ring_reduce_scatter.h"

using namespace px;
using namespace pxt;

namespace {

unsigned char byte_of(int rank, uint64_t i) {
  return static_cast<unsigned char>((rank * 31 + i * 7 + i / 251) & 0xff);
}

void check_allgatherv(std::vector<CollectiveTransport*> group, std::vector<uint64_t> sizes,
                      size_t chunk, int salt) {
  int n = static_cast<int>(group.size());
  uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  std::vector<unsigned char> want(total);
  std::vector<std::vector<unsigned char>> buffers(static_cast<size_t>(n),
                                                  std::vector<unsigned char>(total, 0xee));
  uint64_t offset = 0;
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < sizes[static_cast<size_t>(r)]; ++i) {
      want[offset + i] = byte_of(r + salt, i);
      buffers[static_cast<size_t>(r)][offset + i] = want[offset + i];
    }
    offset += sizes[static_cast<size_t>(r)];
  }
  Completion done;
  for (int r = 0; r < n; ++r) {
    AllgathervSpec spec;
    spec.buffer = buffers[static_cast<size_t>(r)].data();
    spec.block_bytes = sizes;
    spec.tag_base = make_tag(TagKind::kAllgatherv, 3, static_cast<uint64_t>(salt));
    spec.chunk_bytes = chunk;
    start_ring_allgatherv(*group[static_cast<size_t>(r)], spec, done.callback());
  }
  REQUIRE(done.wait_for(n));
  CHECK(done.errors.empty());
  for (int r = 0; r < n; ++r) CHECK(buffers[static_cast<size_t>(r)] == want);
}

void check_broadcast(std::vector<CollectiveTransport*> group, uint64_t bytes, int root,
                     size_t chunk, int salt) {
  int n = static_cast<int>(group.size());
  std::vector<std::vector<unsigned char>> buffers(static_cast<size_t>(n),
                                                  std::vector<unsigned char>(bytes, 0));
  for (uint64_t i = 0; i < bytes; ++i) buffers[static_cast<size_t>(root)][i] = byte_of(salt, i);
  std::vector<unsigned char> want = buffers[static_cast<size_t>(root)];
  Completion done;
  for (int r = 0; r < n; ++r) {
    BroadcastSpec spec;
    spec.buffer = buffers[static_cast<size_t>(r)].data();
    spec.bytes = bytes;
    spec.root = root;
    spec.tag_base = make_tag(TagKind::kBroadcast, 4, static_cast<uint64_t>(salt));
    spec.chunk_bytes = chunk;
    start_chain_broadcast(*group[static_cast<size_t>(r)], spec, done.callback());
  }
  REQUIRE(done.wait_for(n));
  CHECK(done.errors.empty());
  for (int r = 0; r < n; ++r) CHECK(buffers[static_cast<size_t>(r)] == want);
}

}  // namespace

TEST_CASE(
    "allgatherv and broadcast over the in-process transport: 1-5 ranks, uneven and empty blocks") {
  for (int n = 1; n <= 5; ++n) {
    InProcGroup group(n);
    std::vector<CollectiveTransport*> members;
    for (int r = 0; r < n; ++r) members.push_back(&group.member(r));
    int salt = 0;
    for (size_t chunk : {size_t{16}, size_t{4096}, size_t{1} << 20}) {
      CAPTURE(n);
      CAPTURE(chunk);
      std::vector<uint64_t> uneven, with_empty;
      for (int r = 0; r < n; ++r) {
        uneven.push_back(1000 + static_cast<uint64_t>(r) * 3001);
        with_empty.push_back(r % 2 ? 0 : 777);
      }
      check_allgatherv(members, uneven, chunk, ++salt);
      check_allgatherv(members, with_empty, chunk, ++salt);
      for (int root = 0; root < n; ++root) check_broadcast(members, 100003, root, chunk, ++salt);
      check_broadcast(members, 0, 0, chunk, ++salt);
    }
  }
}

TEST_CASE("allgatherv and broadcast over real libfabric endpoints") {
  for (int n : {2, 4}) {
    auto eps = open_endpoints(n);
    std::vector<CollectiveTransport*> members;
    for (auto& ep : eps) members.push_back(ep.get());
    std::vector<uint64_t> sizes;
    for (int r = 0; r < n; ++r) sizes.push_back((1u << 20) + static_cast<uint64_t>(r) * 12345);
    check_allgatherv(members, sizes, 64 * 1024, 1);
    check_broadcast(members, 3u << 20, n - 1, 256 * 1024, 2);
  }
}

namespace {

// Each rank's segment after a ring reduce-scatter of every rank's small-integer input
// against the reduction in rank order (exact: small integers, and for products -1..1).
template <typename T>
void check_reduce_scatter(std::vector<CollectiveTransport*> group, std::vector<size_t> segments,
                          DType dtype, ReduceOp op, size_t chunk, int salt) {
  int n = static_cast<int>(group.size());
  size_t total = std::accumulate(segments.begin(), segments.end(), size_t{0});
  auto inputs = small_integer_inputs<T>(n, total, salt);
  if (op == ReduceOp::kProd)
    for (auto& in : inputs)
      for (T& v : in) v = static_cast<T>(static_cast<int>(v) % 2);
  std::vector<T> want = reference_reduction(inputs, op == ReduceOp::kMean ? ReduceOp::kSum : op);
  Completion done;
  for (int r = 0; r < n; ++r) {
    RingReduceScatterSpec spec;
    spec.buffer = inputs[static_cast<size_t>(r)].data();
    spec.segment_count = segments;
    spec.dtype = dtype;
    spec.op = op;
    spec.tag_base = make_tag(TagKind::kReduceScatter, 5, static_cast<uint64_t>(salt));
    spec.chunk_bytes = chunk;
    start_ring_reduce_scatter(*group[static_cast<size_t>(r)], spec, nullptr, done.callback());
  }
  REQUIRE(done.wait_for(n));
  CHECK(done.errors.empty());
  size_t begin = 0;
  for (int r = 0; r < n; ++r) {
    size_t count = segments[static_cast<size_t>(r)];
    const std::vector<T>& got = inputs[static_cast<size_t>(r)];
    CHECK(std::equal(got.begin() + static_cast<ptrdiff_t>(begin),
                     got.begin() + static_cast<ptrdiff_t>(begin + count),
                     want.begin() + static_cast<ptrdiff_t>(begin)));
    begin += count;
  }
}

// Every pair of ranks exchanges a header (its payload's size) and a payload of a size only
// the header tells the receiver; a rank's payload for each peer is checked byte for byte.
void check_pairwise(std::vector<CollectiveTransport*> group, size_t chunk, int salt) {
  int n = static_cast<int>(group.size());
  auto size_of = [&](int from, int to) -> uint64_t {
    return (from + to + salt) % 3 == 0 ? 0
                                       : 1000 + static_cast<uint64_t>(from * 7919 + to * 104729);
  };
  std::vector<std::vector<uint64_t>> headers(static_cast<size_t>(n)),
      got_headers(static_cast<size_t>(n));
  std::vector<std::vector<std::vector<unsigned char>>> payloads(static_cast<size_t>(n)),
      received(static_cast<size_t>(n));
  Completion done;
  for (int r = 0; r < n; ++r) {
    headers[static_cast<size_t>(r)].resize(static_cast<size_t>(n));
    got_headers[static_cast<size_t>(r)].assign(static_cast<size_t>(n), 0);
    payloads[static_cast<size_t>(r)].resize(static_cast<size_t>(n));
    received[static_cast<size_t>(r)].resize(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) {
      uint64_t bytes = size_of(r, p);
      headers[static_cast<size_t>(r)][static_cast<size_t>(p)] = bytes;
      auto& payload = payloads[static_cast<size_t>(r)][static_cast<size_t>(p)];
      for (uint64_t i = 0; i < bytes; ++i) payload.push_back(byte_of(r * 5 + p + salt, i));
    }
  }
  for (int r = 0; r < n; ++r) {
    PairwiseExchangeSpec spec;
    spec.peers.resize(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) {
      ExchangeWithPeer& peer = spec.peers[static_cast<size_t>(p)];
      peer.header = &headers[static_cast<size_t>(r)][static_cast<size_t>(p)];
      peer.header_bytes = sizeof(uint64_t);
      peer.payload = payloads[static_cast<size_t>(r)][static_cast<size_t>(p)].data();
      peer.payload_bytes = payloads[static_cast<size_t>(r)][static_cast<size_t>(p)].size();
      peer.recv_header = &got_headers[static_cast<size_t>(r)][static_cast<size_t>(p)];
      peer.recv_header_bytes = sizeof(uint64_t);
    }
    spec.receiver_payload = [&, r](int p) -> std::pair<void*, size_t> {
      auto& into = received[static_cast<size_t>(r)][static_cast<size_t>(p)];
      into.resize(got_headers[static_cast<size_t>(r)][static_cast<size_t>(p)]);
      return {into.data(), into.size()};
    };
    spec.tag_base = make_tag(TagKind::kAlltoall, 6, static_cast<uint64_t>(salt));
    spec.chunk_bytes = chunk;
    start_pairwise_exchange(*group[static_cast<size_t>(r)], spec, done.callback());
  }
  REQUIRE(done.wait_for(n));
  CHECK(done.errors.empty());
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p)
      if (p != r)
        CHECK(received[static_cast<size_t>(r)][static_cast<size_t>(p)] ==
              payloads[static_cast<size_t>(p)][static_cast<size_t>(r)]);
}

}  // namespace

TEST_CASE(
    "ring reduce-scatter over the in-process transport: 1-5 ranks, uneven and empty segments, "
    "every op") {
  for (int n = 1; n <= 5; ++n) {
    InProcGroup group(n);
    std::vector<CollectiveTransport*> members;
    for (int r = 0; r < n; ++r) members.push_back(&group.member(r));
    int salt = 0;
    for (size_t chunk : {size_t{16}, size_t{4096}, size_t{1} << 20}) {
      CAPTURE(n);
      CAPTURE(chunk);
      std::vector<size_t> uneven, with_empty;
      for (int r = 0; r < n; ++r) {
        uneven.push_back(1000 + static_cast<size_t>(r) * 3001);
        with_empty.push_back(r % 2 ? 0 : 777);
      }
      for (uint32_t o = 0; o < kReduceOpCount; ++o) {
        auto op = static_cast<ReduceOp>(o);
        CAPTURE(reduce_op_name(op));
        check_reduce_scatter<int64_t>(members, uneven, DType::kI64, op, chunk, ++salt);
        check_reduce_scatter<float>(members, with_empty, DType::kF32, op, chunk, ++salt);
      }
    }
  }
}

TEST_CASE("pairwise exchange over the in-process transport: 1-5 ranks, empty and uneven payloads") {
  for (int n = 1; n <= 5; ++n) {
    InProcGroup group(n);
    std::vector<CollectiveTransport*> members;
    for (int r = 0; r < n; ++r) members.push_back(&group.member(r));
    int salt = 0;
    for (size_t chunk : {size_t{100}, size_t{4096}, size_t{1} << 20})
      check_pairwise(members, chunk, ++salt);
  }
}

TEST_CASE("ring reduce-scatter and pairwise exchange over real libfabric endpoints") {
  for (int n : {2, 4}) {
    auto eps = open_endpoints(n);
    std::vector<CollectiveTransport*> members;
    for (auto& ep : eps) members.push_back(ep.get());
    std::vector<size_t> segments;
    for (int r = 0; r < n; ++r)
      segments.push_back((size_t{1} << 18) + static_cast<size_t>(r) * 12345);
    check_reduce_scatter<float>(members, segments, DType::kF32, ReduceOp::kSum, 64 * 1024, 1);
    check_pairwise(members, 64 * 1024, 2);
  }
}
