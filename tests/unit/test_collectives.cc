#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "tests/unit/collective_test_util.h"
#include "transport/collectives/chain_broadcast.h"
#include "transport/collectives/inproc_transport.h"
#include "transport/collectives/ring_allgatherv.h"

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
