#include <doctest/doctest.h>

#include <random>
#include <set>
#include <vector>

#include "transport/ipc/arena_allocator.h"

TEST_CASE("allocator: aligned, disjoint blocks inside the heap") {
  px::ArenaAllocator a(4096, 1 << 20);
  auto x = a.allocate(1);
  auto y = a.allocate(100);
  auto z = a.allocate(64);
  REQUIRE(x);
  REQUIRE(y);
  REQUIRE(z);
  CHECK(*x % 64 == 0);
  CHECK(*y % 64 == 0);
  CHECK(*x >= 4096);
  CHECK(*y >= *x + 64);
  CHECK(*z >= *y + 128);
  CHECK(a.block_size(*y) == 128);
  CHECK(a.bytes_in_use() == 64 + 128 + 64);
}

TEST_CASE("allocator: exhaustion, bad frees, and coalescing back to one block") {
  px::ArenaAllocator a(0, 4096);
  auto x = a.allocate(1024);
  auto y = a.allocate(1024);
  auto z = a.allocate(2048);
  REQUIRE(x);
  REQUIRE(y);
  REQUIRE(z);
  CHECK_FALSE(a.allocate(1));
  CHECK_FALSE(a.release(*x + 64));  // not a block start
  CHECK(a.release(*y));
  CHECK_FALSE(a.release(*y));  // double free
  CHECK(a.largest_free_block() == 1024);
  CHECK(a.release(*x));
  CHECK(a.release(*z));
  CHECK(a.free_block_count() == 1);
  CHECK(a.largest_free_block() == 4096);
  CHECK(a.bytes_in_use() == 0);
  CHECK_FALSE(a.allocate(UINT64_MAX));
}

TEST_CASE("allocator: random alloc/free keeps blocks disjoint and frees everything") {
  px::ArenaAllocator a(64, 1 << 22);
  std::mt19937_64 rng(42);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      uint64_t size = 1 + rng() % 20000;
      if (auto off = a.allocate(size)) live.push_back({*off, size});
    } else {
      size_t k = rng() % live.size();
      REQUIRE(a.release(live[k].first));
      live[k] = live.back();
      live.pop_back();
    }
  }
  std::set<std::pair<uint64_t, uint64_t>> sorted(live.begin(), live.end());
  uint64_t end = 0;
  for (auto [off, size] : sorted) {
    CHECK(off >= end);
    end = off + size;
  }
  CHECK(end <= 64 + (1 << 22));
  for (auto [off, size] : live) CHECK(a.release(off));
  CHECK(a.free_block_count() == 1);
  CHECK(a.bytes_in_use() == 0);
}
