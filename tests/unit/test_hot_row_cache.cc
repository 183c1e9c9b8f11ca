// The hot-row cache's rule on its own (daemon/sparse/hot_row_cache.h): what it keeps, when a
// copy serves, when a held sum leaves, and eviction with a held sum; every gradient once.
// (sparse/hot-row cache, cache_scenarios.cc, checks the rule on real daemons.)
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "daemon/sparse/hot_row_cache.h"

namespace px {
namespace {

// Asks for rows in pull `step`: the positions that missed (their owner's value: the step).
std::vector<size_t> pull(HotRowCache& cache, std::vector<int64_t> rows, uint64_t step) {
  std::vector<float> out(rows.size(), -1.0f);
  std::vector<size_t> misses;
  cache.lookup(rows.data(), rows.size(), step, out.data(), &misses);
  std::vector<int64_t> asked;
  std::vector<float> values;
  for (size_t i : misses) {
    asked.push_back(rows[i]);
    values.push_back(float(step));
  }
  cache.fetched(asked.data(), asked.size(), step, values.data());
  return misses;
}

// Push `step` of gradient 1 per row: the rows that leave and what each carries.
std::vector<std::pair<int64_t, float>> push(HotRowCache& cache, std::vector<int64_t> rows,
                                            uint64_t step) {
  std::vector<std::pair<int64_t, float>> sent;
  std::vector<HeldRow> due;
  cache.take_due(
      step,
      [&](int64_t r) {
        for (int64_t x : rows)
          if (x == r) return true;
        return false;
      },
      &due);
  for (HeldRow& h : due) sent.push_back({h.row, h.sum[0]});
  for (int64_t r : rows) {
    float g = 1.0f;
    bool added = false;
    if (!cache.hold(r, step, &g, &added)) sent.push_back({r, g});
  }
  cache.pushed(step);
  return sent;
}

}  // namespace

TEST_CASE("hot-row cache: kept on a second ask, served s steps, held sums leave before refresh") {
  HotRowCache cache(1, 8, 2, 12);
  CHECK(pull(cache, {1, 2}, 0).size() == 2);  // first asks: nothing kept
  CHECK(push(cache, {1, 2}, 0).size() == 2);  // nothing held
  CHECK(pull(cache, {1, 2}, 1).size() == 2);  // second asks: both kept, fetched by step 1
  CHECK(push(cache, {1, 2}, 1).empty());      // the copies serve pull 2: held
  CHECK(pull(cache, {1, 2}, 2).empty());      // served from the copies
  CHECK(push(cache, {1}, 2).empty());         // row 1 held again; row 2 not pushed
  CHECK(cache.serves(3));
  CHECK(pull(cache, {1}, 3).empty());  // copy of step 1 serves step 3 (3 - 1 = 2)
  // Push 3: the copies do not serve pull 4, so every held sum leaves now: row 1 with its
  // gradients of pushes 1, 2 and 3, row 2 (not in this push) with push 1's.
  auto sent = push(cache, {1}, 3);
  REQUIRE(sent.size() == 2);
  CHECK(sent[0] == std::pair<int64_t, float>{2, 1.0f});
  CHECK(sent[1] == std::pair<int64_t, float>{1, 3.0f});
  CHECK(pull(cache, {1, 2}, 4).size() == 2);  // refreshed: fetched by step 4
  HotRowCounters c = cache.counters();
  CHECK(c.hits == 3);
  CHECK(c.rows == 2);
  CHECK(c.rows_flushed == 2);
  CHECK(!cache.serves(6));  // push 4 and 5 not decided
}

TEST_CASE("hot-row cache: an evicted row's held sum leaves with the next push; a flush takes all") {
  HotRowCache cache(1, 1, 3, 12);  // room for one row
  pull(cache, {5}, 0);
  pull(cache, {5}, 1);  // row 5 kept
  CHECK(push(cache, {5}, 1).empty());
  pull(cache, {6}, 2);
  pull(cache, {6}, 3);  // row 6 kept: row 5 evicted with its held sum
  CHECK(cache.counters().rows == 1);
  auto sent = push(cache, {6}, 3);  // row 5 leaves (not pushed), row 6 is held
  REQUIRE(sent.size() == 1);
  CHECK(sent[0] == std::pair<int64_t, float>{5, 1.0f});
  std::vector<HeldRow> all;
  cache.take_all(&all);
  REQUIRE(all.size() == 1);
  CHECK(all[0].row == 6);
  CHECK(all[0].sum[0] == 1.0f);
  all.clear();
  cache.take_all(&all);
  CHECK(all.empty());  // once
}

}  // namespace px
