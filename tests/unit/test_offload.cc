// Offload (daemon/common/offload.h): light work inline on the caller (the loop), heavy work
// on the pool with its `then` posted back to the loop; sliced work covers its range once.
// The loop-thread check (daemon/common/loop_thread.h).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/common/loop_thread.h"
#include "daemon/common/offload.h"
#include "daemon/common/thread_pool.h"
#include "tests/unit/manual_loop.h"

using namespace px;

TEST_CASE("offload: light work and its then run inline, in order, on the caller") {
  ManualLoop loop;
  ThreadPool pool(2);
  Offload offload(pool, loop.poster());
  std::vector<int> order;
  std::thread::id worked_on;
  offload.run(
      false,
      [&] {
        worked_on = std::this_thread::get_id();
        order.push_back(1);
      },
      [&] { order.push_back(2); });
  CHECK(order == std::vector<int>{1, 2});
  CHECK(worked_on == std::this_thread::get_id());
}

TEST_CASE("offload: heavy work runs on the pool, its then on the loop afterwards") {
  ManualLoop loop;
  ThreadPool pool(2);
  Offload offload(pool, loop.poster());
  std::atomic<bool> worked{false};
  std::thread::id worked_on, then_on;
  bool then_ran = false;
  offload.run(
      true,
      [&] {
        worked_on = std::this_thread::get_id();
        worked = true;
      },
      [&] {
        CHECK(worked.load());
        then_on = std::this_thread::get_id();
        then_ran = true;
      });
  CHECK(!then_ran);  // only the loop runs it
  REQUIRE(loop.run_until([&] { return then_ran; }));
  CHECK(worked_on != std::this_thread::get_id());
  CHECK(then_on == std::this_thread::get_id());
}

TEST_CASE("offload: sliced work covers the range once, in aligned slices, then one then") {
  ManualLoop loop;
  ThreadPool pool(4);
  Offload offload(pool, loop.poster());
  for (size_t count : {size_t{1}, size_t{17}, size_t{1000}, size_t{65536 + 3}}) {
    for (size_t slices : {size_t{0}, size_t{1}, size_t{3}, size_t{64}}) {
      std::vector<std::atomic<int>> hits(count);
      std::atomic<int> pieces{0};
      std::atomic<bool> misaligned{false};
      int thens = 0;
      offload.run_sliced(
          true, count, slices, 16,
          [&](size_t begin, size_t end) {
            if (begin < end && begin % 16 != 0) misaligned = true;  // empty tails may not be
            for (size_t i = begin; i < end; ++i) ++hits[i];
            ++pieces;
          },
          [&] { ++thens; });
      REQUIRE(loop.run_until([&] { return thens > 0; }));
      CHECK(thens == 1);
      CHECK(!misaligned.load());
      CHECK(pieces.load() == static_cast<int>(std::max<size_t>(1, std::min<size_t>(4, slices))));
      for (size_t i = 0; i < count; ++i) REQUIRE(hits[i].load() == 1);
    }
  }
  // Light: one piece, inline.
  size_t got_begin = 1, got_end = 0;
  bool then_ran = false;
  offload.run_sliced(
      false, 100, 8, 16,
      [&](size_t begin, size_t end) {
        got_begin = begin;
        got_end = end;
      },
      [&] { then_ran = true; });
  CHECK(got_begin == 0);
  CHECK(got_end == 100);
  CHECK(then_ran);
}

TEST_CASE("loop thread: recorded while a LoopThreadScope lives; other threads are not it") {
  CHECK(on_loop_thread());  // nothing recorded: every thread passes
  {
    LoopThreadScope scope;
    CHECK(on_loop_thread());
    bool elsewhere = true;
    std::thread([&] { elsewhere = on_loop_thread(); }).join();
    CHECK(!elsewhere);
    PX_ASSERT_LOOP_THREAD();  // passes here
  }
  bool after = false;
  std::thread([&] { after = on_loop_thread(); }).join();
  CHECK(after);
}
