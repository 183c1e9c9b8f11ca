// ReplicatedExchange driven alone (no fabric): a push step is handed back at once as this
// node's rows, keeping the pushed memory alive; a replicated ShardOwner applies the
// exchanged steps in step order.
#include <doctest/doctest.h>

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "daemon/common/thread_pool.h"
#include "daemon/sparse/replicated_exchange.h"
#include "daemon/sparse/shard_owner.h"

namespace px {

TEST_CASE("replicated exchange without a fabric hands this node's rows back, kept alive") {
  ThreadPool pool{1};
  std::deque<std::function<void()>> posted;
  PostToLoop post = [&posted](std::function<void()> fn) { posted.push_back(std::move(fn)); };
  for (Route route : {Route::kAllgatherv, Route::kAllreduce}) {
    uint64_t got_step = 0;
    std::vector<ShardRequest> got;
    ReplicatedExchange exchange("test", route, 0, 2, 2, 10, pool, post,
                                std::make_shared<SerialQueue>(pool, post),
                                [&](uint64_t step, std::vector<ShardRequest> batches) {
                                  got_step = step;
                                  got = std::move(batches);
                                });
    auto memory = std::make_shared<std::pair<std::vector<int64_t>, std::vector<float>>>(
        std::vector<int64_t>{3, 7}, std::vector<float>{1, 2, 3, 4});
    ShardRequest mine;
    mine.op = SparseOp::kPush;
    mine.step = 5;
    mine.count = 2;
    mine.rows = memory->first.data();
    mine.values = memory->second.data();
    mine.keep_alive = memory;
    std::weak_ptr<void> alive = memory;
    memory.reset();
    exchange.exchange(std::move(mine));
    CHECK(posted.empty());
    CHECK(got_step == 5);
    REQUIRE(got.size() == 1);
    REQUIRE(got[0].count == 2);
    CHECK(got[0].rows[1] == 7);
    CHECK(got[0].values[3] == 4);
    CHECK_FALSE(alive.expired());
    got.clear();
    CHECK(alive.expired());
    CHECK(exchange.bytes_sent() == 0);
  }
}

TEST_CASE("replicated owner applies each pushed step, then serves the next step's pulls") {
  ThreadPool pool{1};
  std::deque<std::function<void()>> posted;
  SparseOptions options;
  options.route = Route::kAllgatherv;
  options.learning_rate = 1.0;
  ShardOwner owner("test", PartitionMap(8, 1, 1), 0, 1, options, 1, pool,
                   [&posted](std::function<void()> fn) { posted.push_back(std::move(fn)); });
  auto drain = [&] {
    while (!posted.empty()) {
      auto fn = std::move(posted.front());
      posted.pop_front();
      fn();
    }
  };
  REQUIRE(owner.replicated());
  std::vector<int64_t> rows = {2, 5};
  std::vector<float> grads = {1, 3};
  for (uint64_t step = 0; step < 2; ++step) {
    ShardRequest push;
    push.op = SparseOp::kPush;
    push.step = step;
    push.count = rows.size();
    push.rows = rows.data();
    push.values = grads.data();
    owner.handle(std::move(push));
  }
  std::vector<float> out(2, -999.0f);
  bool done = false;
  ShardRequest pull;
  pull.op = SparseOp::kPull;
  pull.step = 2;
  pull.count = rows.size();
  pull.rows = rows.data();
  pull.out = out.data();
  pull.done = [&done](px_status status, const std::string&) { done = status == PX_OK; };
  owner.handle(std::move(pull));
  drain();
  REQUIRE(done);
  CHECK(out == std::vector<float>{-2, -6});
  CHECK(owner.rows_applied() == 4);
}

}  // namespace px
