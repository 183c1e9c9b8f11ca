// ShardOwner's step bookkeeping per partition, driven directly (no fabric): a partition's
// push step is applied once every node pushed it, and pulls of the next step for that
// partition are answered then, whatever the other partitions are waiting for.
#include <doctest/doctest.h>

#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/common/thread_pool.h"
#include "daemon/sparse/shard_owner.h"
#include "tests/unit/temp_dir.h"

namespace px {
namespace {

struct Harness {
  ThreadPool pool{1};
  std::deque<std::function<void()>> posted;
  SparseOptions options;
  PartitionMap map{40, 4, 2};  // node 0 holds partitions 0 and 2 (rows = 0, 2 mod 4)
  std::unique_ptr<ShardOwner> owner;

  explicit Harness(int node = 0) {
    options.learning_rate = 1.0;
    owner = std::make_unique<ShardOwner>(
        "test", map, node, 2, options, 4, pool,
        [this](std::function<void()> fn) { posted.push_back(std::move(fn)); });
  }
  void drain() {
    while (!posted.empty()) {
      auto fn = std::move(posted.front());
      posted.pop_front();
      fn();
    }
  }
};

// What the owner hands over (its export runs on the pool: waited for here).
std::vector<HandoverUnit> handed_units(Harness& h) {
  std::vector<HandoverUnit> units;
  bool done = false;
  h.owner->hand_over([&](std::vector<HandoverUnit> u) {
    units = std::move(u);
    done = true;
  });
  for (int i = 0; i < 2000 && !done; ++i) {
    h.drain();
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(done);
  return units;
}

struct Outcome {
  bool done = false;
  px_status status = PX_OK;
  std::string error;
};

ShardRequest make(SparseOp op, int from, uint32_t partition, uint64_t step,
                  const std::vector<int64_t>& rows, const std::vector<float>& values,
                  std::vector<float>* out, Outcome* outcome) {
  auto rows_copy = std::make_shared<std::vector<int64_t>>(rows);
  auto values_copy = std::make_shared<std::vector<float>>(values);
  ShardRequest r;
  r.from_node = from;
  r.op = op;
  r.partition = partition;
  r.step = step;
  r.count = rows.size();
  r.rows = rows_copy->data();
  r.values = values_copy->empty() ? nullptr : values_copy->data();
  if (out) {
    out->assign(rows.size() * 2, -999.0f);
    r.out = out->data();
  }
  r.keep_alive = std::make_shared<std::pair<decltype(rows_copy), decltype(values_copy)>>(
      rows_copy, values_copy);
  if (outcome)
    r.done = [outcome](px_status status, const std::string& error) {
      outcome->done = true;
      outcome->status = status;
      outcome->error = error;
    };
  return r;
}

}  // namespace

TEST_CASE("sync: each partition applies a step once every node pushed it, and answers pulls then") {
  Harness h;
  // Step 0: partition 0 gets both nodes' pushes, partition 2 only node 0's so far.
  h.owner->handle(make(SparseOp::kPush, 0, 0, 0, {0, 4}, {1, 1, 2, 2}, nullptr, nullptr));
  h.owner->handle(make(SparseOp::kPush, 1, 0, 0, {4}, {10, 10}, nullptr, nullptr));
  h.owner->handle(make(SparseOp::kPush, 0, 2, 0, {2}, {3, 3}, nullptr, nullptr));
  h.drain();

  std::vector<float> p0, p2;
  Outcome o0, o2;
  h.owner->handle(make(SparseOp::kPull, 1, 0, 1, {0, 4}, {}, &p0, &o0));
  h.owner->handle(make(SparseOp::kPull, 1, 2, 1, {2}, {}, &p2, &o2));
  h.drain();
  REQUIRE(o0.done);  // partition 0 is through step 0 although partition 2 is not
  CHECK(o0.status == PX_OK);
  CHECK(p0 == std::vector<float>{-1, -1, -12, -12});
  CHECK_FALSE(o2.done);

  // Node 1's (empty) push of partition 2 completes its step 0.
  h.owner->handle(make(SparseOp::kPush, 1, 2, 0, {}, {}, nullptr, nullptr));
  h.drain();
  REQUIRE(o2.done);
  CHECK(o2.status == PX_OK);
  CHECK(p2 == std::vector<float>{-3, -3});
}

TEST_CASE("sync: a read sees the push steps its node sent before it, once they are applied") {
  // Node 1 pushed step 0 and reads: its read says so (step 1), and arrives while node 0's
  // part of step 0 has not (a table read right after training, state_dict).
  Harness h;
  h.owner->handle(make(SparseOp::kPush, 1, 0, 0, {4}, {10, 10}, nullptr, nullptr));
  h.owner->handle(make(SparseOp::kPush, 1, 2, 0, {}, {}, nullptr, nullptr));
  h.drain();
  std::vector<float> before, after;
  Outcome read_before, read_after;
  h.owner->handle(make(SparseOp::kRead, 0, 0, 0, {4}, {}, &before, &read_before));
  h.owner->handle(make(SparseOp::kRead, 1, 0, 1, {4}, {}, &after, &read_after));
  h.drain();
  REQUIRE(read_before.done);  // a read after no push: what is there
  CHECK(before == std::vector<float>{0, 0});
  CHECK_FALSE(read_after.done);
  h.owner->handle(make(SparseOp::kPush, 0, 0, 0, {4}, {2, 2}, nullptr, nullptr));
  h.owner->handle(make(SparseOp::kPush, 0, 2, 0, {}, {}, nullptr, nullptr));
  h.drain();
  REQUIRE(read_after.done);
  CHECK(read_after.status == PX_OK);
  CHECK(after == std::vector<float>{-12, -12});
}

TEST_CASE("requests for a partition this node does not hold, or rows outside it, are refused") {
  Harness h;
  std::vector<float> out;
  Outcome wrong_partition, wrong_row, no_partition;
  h.owner->handle(make(SparseOp::kPull, 1, 1, 0, {1}, {}, &out, &wrong_partition));
  h.owner->handle(make(SparseOp::kPush, 0, 0, 0, {0, 2}, {1, 1, 1, 1}, nullptr, &wrong_row));
  h.owner->handle(make(SparseOp::kPull, 1, kAllPartitions, 0, {0}, {}, &out, &no_partition));
  h.drain();
  REQUIRE(wrong_partition.done);
  CHECK(wrong_partition.status == PX_ERR_PROTOCOL);
  CHECK(wrong_partition.error == "partition 1 is not held by this node");
  REQUIRE(wrong_row.done);
  CHECK(wrong_row.status == PX_ERR_PROTOCOL);
  CHECK(wrong_row.error == "row 2 is not held by this node in partition 0");
  REQUIRE(no_partition.done);
  CHECK(no_partition.status == PX_ERR_PROTOCOL);

  // The refused push counted for nothing: step 0 of partition 0 is still expected.
  h.owner->handle(make(SparseOp::kPush, 0, 0, 0, {0}, {5, 5}, nullptr, nullptr));
  h.owner->handle(make(SparseOp::kPush, 1, 0, 0, {}, {}, nullptr, nullptr));
  Outcome pulled;
  h.owner->handle(make(SparseOp::kPull, 0, 0, 1, {0}, {}, &out, &pulled));
  h.drain();
  REQUIRE(pulled.done);
  CHECK(out == std::vector<float>{-5, -5});
}

ShardRequest grouped(ShardRequest r, uint32_t groups) {
  r.groups = groups;
  return r;
}

TEST_CASE("a request for a group of partitions is counted and applied per partition") {
  Harness h;
  // Node 0 sends one request for both its partitions (group 0 of 1: partitions 0 and 2, rows
  // partition by partition); node 1 sends one per partition (groups of 2). Nodes need not
  // group alike.
  h.owner->handle(
      grouped(make(SparseOp::kPush, 0, 0, 0, {0, 4, 2}, {1, 1, 2, 2, 3, 3}, nullptr, nullptr), 1));
  h.owner->handle(grouped(make(SparseOp::kPush, 1, 0, 0, {4}, {10, 10}, nullptr, nullptr), 2));
  h.drain();
  std::vector<float> out;
  Outcome pulled;
  h.owner->handle(grouped(make(SparseOp::kPull, 1, 0, 1, {0, 4, 2}, {}, &out, &pulled), 1));
  h.drain();
  CHECK_FALSE(pulled.done);  // partition 2 still waits for node 1's push of step 0
  h.owner->handle(grouped(make(SparseOp::kPush, 1, 1, 0, {}, {}, nullptr, nullptr), 2));
  h.drain();
  REQUIRE(pulled.done);
  CHECK(pulled.status == PX_OK);
  CHECK(out == std::vector<float>{-1, -1, -12, -12, -3, -3});

  // Rows out of the group's order, groups this node cannot have, and a group on a request
  // that is not a step are refused whole: nothing of the push counts.
  Outcome disorder, too_many, index_past, not_step;
  h.owner->handle(
      grouped(make(SparseOp::kPush, 0, 0, 1, {2, 0}, {1, 1, 1, 1}, nullptr, &disorder), 1));
  h.owner->handle(grouped(make(SparseOp::kPull, 1, 0, 1, {0}, {}, &out, &too_many), 3));
  h.owner->handle(grouped(make(SparseOp::kPull, 1, 2, 1, {0}, {}, &out, &index_past), 2));
  h.owner->handle(grouped(make(SparseOp::kRead, 1, 0, 0, {0}, {}, &out, &not_step), 1));
  h.drain();
  REQUIRE(disorder.done);
  CHECK(disorder.status == PX_ERR_PROTOCOL);
  CHECK(disorder.error ==
        "row 0 at position 1 is not in order in group 0 of 1 of this node's partitions");
  REQUIRE(too_many.done);
  CHECK(too_many.error == "group 0 of 3 named, this node holds 2 partitions");
  REQUIRE(index_past.done);
  CHECK(index_past.error == "group 2 of 2 named, this node holds 2 partitions");
  REQUIRE(not_step.done);
  CHECK(not_step.error == "a read request names a partition group");

  h.owner->handle(grouped(make(SparseOp::kPush, 0, 0, 1, {0}, {5, 5}, nullptr, nullptr), 1));
  h.owner->handle(grouped(make(SparseOp::kPush, 1, 0, 1, {}, {}, nullptr, nullptr), 1));
  Outcome after;
  h.owner->handle(grouped(make(SparseOp::kPull, 0, 0, 2, {0, 2}, {}, &out, &after), 1));
  h.drain();
  REQUIRE(after.done);
  CHECK(out == std::vector<float>{-6, -6, -3, -3});
}

}  // namespace px

namespace px {

TEST_CASE("a node's partitions handed over go back to the cut every partition applied") {
  // Two nodes' owners: node 0 holds partitions 0 and 2, node 1 partitions 1 and 3. Push step
  // 0 reaches every partition from both nodes; in step 1 a lost node 1 sent its push to
  // partitions 0 and 1 only, so partitions 2 and 3 wait at 1 and partitions 0 and 1 are at 2.
  Harness n0(0), n1(1), ref0(0), ref1(1);
  for (Harness* h : {&n0, &n1}) h->owner->keep_journal(2);
  auto push = [](Harness& h, int from, uint32_t p, uint64_t step) {
    int64_t row = static_cast<int64_t>(p) + 4 * (from + 1);
    float g = static_cast<float>(step + 1 + from);
    h.owner->handle(make(SparseOp::kPush, from, p, step, {row}, {g, g}, nullptr, nullptr));
  };
  for (int from : {0, 1}) {
    for (uint32_t p : {0u, 2u}) {
      push(n0, from, p, 0);
      push(ref0, from, p, 0);
    }
    for (uint32_t p : {1u, 3u}) {
      push(n1, from, p, 0);
      push(ref1, from, p, 0);
    }
    push(n0, from, 0, 1);
    push(n1, from, 1, 1);
  }
  push(n0, 0, 2, 1);  // node 0's own push of step 1 reached partition 2, node 1's did not
  push(n1, 0, 3, 1);
  auto part = [](int node, std::vector<HandoverUnit> units) {
    HandoverData d;
    d.epoch = 5;
    d.node = static_cast<uint32_t>(node);
    d.nodes = 2;
    d.partitions = 4;
    d.dim = 2;
    d.slots = 0;
    d.units = std::move(units);
    return d;
  };
  std::vector<HandoverUnit> u0 = handed_units(n0), u1 = handed_units(n1);
  REQUIRE(u0.size() == 2);
  CHECK(u0[0].partition == 0);
  CHECK(u0[0].applied == 2);
  CHECK(u0[1].applied == 1);
  CHECK(u0[0].journal.size() == 2);
  HandoverPlan plan = plan_handover({part(0, u0), part(1, u1)}, 0);
  REQUIRE_MESSAGE(plan.ok, plan.why);
  CHECK(plan.cut == 1);
  CHECK(plan.rolled_back == 2);
  CHECK(plan.applies == 1);
  std::vector<HandoverUnit> r0 = handed_units(ref0), r1 = handed_units(ref1);
  std::vector<const ShardFileData*> expected = {&r0[0].rows, &r1[0].rows, &r0[1].rows, &r1[1].rows};
  REQUIRE(plan.rows.size() == 4);
  for (size_t p = 0; p < 4; ++p) {
    CHECK(plan.rows[p].rows == expected[p]->rows);
    CHECK(plan.rows[p].values == expected[p]->values);
  }
  // Rows changed outside a step: the journal no longer leads back.
  Outcome load;
  n0.owner->handle(make(SparseOp::kLoad, 0, kAllPartitions, 0, {0}, {7, 7}, nullptr, &load));
  std::vector<HandoverUnit> loaded = handed_units(n0);
  CHECK(load.status == PX_OK);
  CHECK(loaded[0].journal.empty());
  CHECK_FALSE(plan_handover({part(0, loaded), part(1, u1)}, 0).ok);
}

}  // namespace px

namespace px {

TEST_CASE("a copy takes its owner's rows step by step, loads too, and refuses any other node's") {
  // Node 1 keeps a copy of node 0's partitions (0 and 2); node 0 sends it the rows of each
  // push step it applied, values and state (SGD: none).
  Harness owner(0), keeper(1);
  keeper.owner->keep_copy_of(keeper.map, 0, 2);
  std::vector<std::pair<uint32_t, uint64_t>> sent;
  owner.owner->send_copies(
      [&](uint32_t partition, uint64_t step, std::shared_ptr<ReplicaRows> rows) {
        sent.push_back({partition, step});
        ShardRequest r;
        r.from_node = 0;
        r.op = SparseOp::kReplicate;
        r.partition = partition;
        r.step = step;
        r.count = rows->rows.size();
        r.rows = rows->rows.data();
        r.values = rows->values.data();
        r.keep_alive = rows;
        keeper.owner->handle(std::move(r));
      });
  for (uint64_t step = 0; step < 2; ++step)
    for (int from : {0, 1}) {
      float g = static_cast<float>(step + 1);
      owner.owner->handle(make(SparseOp::kPush, from, 0, step, {4}, {g, g}, nullptr, nullptr));
      owner.owner->handle(make(SparseOp::kPush, from, 2, step, {}, {}, nullptr, nullptr));
    }
  for (int i = 0; i < 100; ++i) {
    owner.drain();
    keeper.drain();
  }
  REQUIRE(sent.size() == 4);  // two steps of two partitions
  // A load is copied too, outside the steps.
  Outcome load;
  owner.owner->handle(make(SparseOp::kLoad, 0, kAllPartitions, 0, {8}, {7, 7}, nullptr, &load));
  for (int i = 0; i < 100; ++i) {
    owner.drain();
    keeper.drain();
  }
  CHECK(load.status == PX_OK);
  REQUIRE(sent.size() == 5);
  CHECK(sent[4].first == kAllPartitions);
  CHECK(sent[4].second == kLoadCopyStep);
  // A copy from a node this one does not copy, and one out of step order: refused.
  std::vector<int64_t> row = {4};
  std::vector<float> values = {9, 9};
  for (auto [from, step] : {std::pair<int, uint64_t>{1, 2}, {0, 5}}) {
    ShardRequest bad;
    bad.from_node = from;
    bad.op = SparseOp::kReplicate;
    bad.partition = 0;
    bad.step = step;
    bad.count = 1;
    bad.rows = row.data();
    bad.values = values.data();
    keeper.owner->handle(std::move(bad));
  }
  std::vector<HandoverUnit> units = handed_units(keeper);
  REQUIRE(units.size() == 4);  // its own partitions 1 and 3, then the copies of 0 and 2
  CHECK_FALSE(units[0].replica);
  CHECK(units[2].replica);
  CHECK(units[2].partition == 0);
  CHECK(units[2].applied == 2);
  CHECK(units[2].journal.empty());  // the load: no journal leads back past it
  // Row 4 (local index 1 of partition 0) after steps 1 and 2, both nodes pushing: -(2 + 4);
  // row 8 (index 2) as loaded.
  REQUIRE(units[2].rows.rows.size() == 10);
  CHECK(units[2].rows.rows[1] == 4);
  CHECK(units[2].rows.values[2] == -6.0f);
  CHECK(units[2].rows.values[3] == -6.0f);
  CHECK(units[2].rows.values[4] == 7.0f);
}

}  // namespace px

namespace px {

TEST_CASE("a replicated route's table restores from a checkpoint every node wrote whole") {
  // Three nodes of the allgatherv route each wrote the whole 40-row table: the restore
  // takes it once (it counted every cell three times, and refused, before).
  test::TempDir dir;
  ShardFileData whole;
  whole.dim = 2;
  for (int64_t row = 0; row < 40; ++row) {
    whole.rows.push_back(row);
    whole.values.push_back(static_cast<float>(row));
    whole.values.push_back(static_cast<float>(-row));
  }
  ManifestData manifest;
  manifest.rows = 40;
  manifest.dim = 2;
  manifest.optimizer_steps = 7;
  manifest.nodes = 3;
  std::string error;
  for (int node = 0; node < 3; ++node) {
    manifest.shard_files.push_back("t.node" + std::to_string(node) + ".shard");
    REQUIRE_MESSAGE(write_shard_file(dir.path() + "/" + manifest.shard_files.back(), whole, &error),
                    error);
  }
  Harness h;
  h.options.route = Route::kAllgatherv;
  ShardOwner owner("test", h.map, 1, 2, h.options, 3, h.pool,
                   [&h](std::function<void()> fn) { h.posted.push_back(std::move(fn)); });
  REQUIRE_MESSAGE(owner.restore(dir.path(), manifest, &error), error);
  std::vector<float> out;
  Outcome read;
  owner.handle(make(SparseOp::kRead, 1, kAllPartitions, 0, {39}, {}, &out, &read));
  h.drain();
  REQUIRE(read.done);
  CHECK(out == std::vector<float>{39, -39});
}

}  // namespace px
