// A sparse table handed to a job's next run (sharding/handover.h, step_journal.h): journals
// take a partition back to an earlier step exactly; images round trip and damaged ones are
// refused; the plan takes each partition from its node or its copy, back to one cut, and
// names why when it cannot.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "sharding/handover.h"
#include "sharding/step_journal.h"

using namespace px;

namespace {

constexpr size_t kDim = 2, kSlots = 1;

// A partition's rows as a unit holds them, with its journal: `rows` rows numbered from
// `first`, stepped by the test.
struct FakeUnit {
  HandoverUnit unit;
  StepJournal journal{kDim, kSlots, 3};
  FakeUnit(uint32_t partition, int64_t first, size_t rows) {
    unit.partition = partition;
    unit.rows.dim = kDim;
    unit.rows.slots = kSlots;
    for (size_t i = 0; i < rows; ++i) {
      unit.rows.rows.push_back(first + static_cast<int64_t>(i));
      for (size_t c = 0; c < kDim; ++c) unit.rows.values.push_back(static_cast<float>(i));
      unit.rows.state.push_back(0.0f);
      unit.rows.state.push_back(0.0f);
    }
  }
  // Push step `applied`: adds step + 1 to the values of the rows at `positions` (unique, as
  // a step's rows are).
  void step(const std::vector<size_t>& positions) {
    journal.begin(unit.applied);
    for (size_t i : positions) {
      float* v = unit.rows.values.data() + i * kDim;
      float* s = unit.rows.state.data() + i * kDim * kSlots;
      journal.save(unit.rows.rows[i], v, s);
      for (size_t c = 0; c < kDim; ++c) {
        v[c] += static_cast<float>(unit.applied + 1);
        s[c] += 1.0f;
      }
    }
    ++unit.applied;
    ++unit.applies;
  }
  HandoverUnit handed() const {
    HandoverUnit u = unit;
    u.journal = journal.records();
    return u;
  }
};

HandoverData part(uint64_t epoch, uint32_t node, uint32_t nodes, std::vector<HandoverUnit> units) {
  HandoverData d;
  d.epoch = epoch;
  d.node = node;
  d.nodes = nodes;
  d.partitions = 4;
  d.dim = kDim;
  d.slots = kSlots;
  d.restored_steps = 10;
  d.units = std::move(units);
  return d;
}

HandoverData round_trip(const HandoverData& d) {
  std::vector<uint64_t> words((handover_image_bytes(d) + 7) / 8);
  encode_handover(d, reinterpret_cast<char*>(words.data()));
  HandoverData back;
  std::string why;
  REQUIRE_MESSAGE(decode_handover(reinterpret_cast<const char*>(words.data()),
                                  handover_image_bytes(d), &back, &why),
                  why);
  return back;
}

}  // namespace

TEST_CASE("a step journal takes rows back through its last steps, newest first") {
  FakeUnit u(0, 100, 3);
  std::vector<float> at0 = u.unit.rows.values, state0 = u.unit.rows.state;
  u.step({0, 1});
  std::vector<float> at1 = u.unit.rows.values;
  u.step({1, 2});
  u.step({1});
  CHECK(u.journal.can_roll_back(3, 3));
  CHECK(u.journal.can_roll_back(3, 0));
  CHECK_FALSE(u.journal.can_roll_back(3, 4));
  CHECK_FALSE(u.journal.can_roll_back(4, 3));  // the journal does not end at step 4

  auto back_to = [&](uint64_t to) {
    ShardFileData rows = u.unit.rows;
    u.journal.roll_back(3, to, [&](int64_t row, const float* v, const float* s) {
      size_t i = static_cast<size_t>(row - 100);
      std::memcpy(rows.values.data() + i * kDim, v, kDim * sizeof(float));
      std::memcpy(rows.state.data() + i * kDim, s, kDim * sizeof(float));
    });
    return rows;
  };
  CHECK(back_to(1).values == at1);
  ShardFileData start = back_to(0);
  CHECK(start.values == at0);
  CHECK(start.state == state0);

  // Past its depth (3), the oldest step is gone.
  u.step({0});
  CHECK_FALSE(u.journal.can_roll_back(4, 0));
  CHECK(u.journal.can_roll_back(4, 1));
  // A step that does not follow (the unit was loaded anew) starts the journal over.
  u.journal.begin(9);
  CHECK(u.journal.records().size() == 1);
  CHECK_FALSE(u.journal.can_roll_back(10, 8));
}

TEST_CASE("a handover image round trips, and a damaged one is refused") {
  FakeUnit a(1, 0, 4), b(3, 50, 2);
  a.step({0, 3});
  b.step({1});
  b.step({0, 1});
  b.unit.replica = true;
  HandoverData d = part(7, 1, 2, {a.handed(), b.handed()});
  HandoverData back = round_trip(d);
  CHECK(back.epoch == 7);
  CHECK(back.node == 1);
  CHECK(back.restored_steps == 10);
  REQUIRE(back.units.size() == 2);
  CHECK(back.units[0].rows.values == a.unit.rows.values);
  CHECK(back.units[1].replica);
  CHECK(back.units[1].applied == 2);
  REQUIRE(back.units[1].journal.size() == 2);
  CHECK(back.units[1].journal[1].rows.rows == std::vector<int64_t>{50, 51});

  std::vector<uint64_t> words((handover_image_bytes(d) + 7) / 8);
  char* bytes = reinterpret_cast<char*>(words.data());
  encode_handover(d, bytes);
  size_t size = handover_image_bytes(d);
  HandoverData out;
  std::string why;
  for (size_t cut = 0; cut < size; cut += 8) CHECK_FALSE(decode_handover(bytes, cut, &out, &why));
  // A partition past the table's.
  std::vector<uint64_t> damaged = words;
  uint32_t partition = 9;
  // The first partition's number: after the 64-byte image header.
  std::memcpy(reinterpret_cast<char*>(damaged.data()) + 64, &partition, sizeof partition);
  CHECK_FALSE(decode_handover(reinterpret_cast<char*>(damaged.data()), size, &out, &why));
  CHECK(why.find("partition 9") != std::string::npos);
}

TEST_CASE("a plan takes each partition from its node or its copy, back to one cut") {
  // Epoch 3 had two nodes: node 0 partitions 0 and 2, node 1 partitions 1 and 3, each with
  // a copy of the other's. Push step 2 reached partitions 0, 1 and 3, not 2.
  std::vector<FakeUnit> own, copies;
  for (uint32_t p = 0; p < 4; ++p) {
    own.emplace_back(p, p * 10, 3);
    copies.emplace_back(p, p * 10, 3);
  }
  std::vector<std::vector<float>> at1(4), at2(4);
  for (uint32_t p = 0; p < 4; ++p) {
    for (FakeUnit* u : {&own[p], &copies[p]}) u->step({0});
    at1[p] = own[p].unit.rows.values;
    for (FakeUnit* u : {&own[p], &copies[p]}) u->step({p % 3 == 1 ? 2u : p % 3, 1});
    at2[p] = own[p].unit.rows.values;
    if (p != 2)
      for (FakeUnit* u : {&own[p], &copies[p]}) u->step({1, 2});
  }
  for (FakeUnit& c : copies) c.unit.replica = true;

  SUBCASE("both nodes hand in: their own partitions, partitions 0, 1, 3 back one step") {
    HandoverPlan plan = plan_handover(
        {part(3, 0, 2, {own[0].handed(), own[2].handed(), copies[1].handed(), copies[3].handed()}),
         part(3, 1, 2, {own[1].handed(), own[3].handed(), copies[0].handed(), copies[2].handed()})},
        0);
    REQUIRE_MESSAGE(plan.ok, plan.why);
    CHECK(plan.cut == 2);
    CHECK(plan.restored_steps == 12);
    CHECK(plan.applies == 2);
    CHECK(plan.from_replicas == 0);
    CHECK(plan.rolled_back == 3);
    REQUIRE(plan.rows.size() == 4);
    for (const ShardFileData& rows : plan.rows) CHECK(rows.values == at2[rows.rows[0] / 10]);
  }
  SUBCASE("by default one step more goes back: it may be committed nowhere") {
    HandoverPlan plan = plan_handover({part(3, 0, 2, {own[0].handed(), own[2].handed()}),
                                       part(3, 1, 2, {own[1].handed(), own[3].handed()})});
    REQUIRE_MESSAGE(plan.ok, plan.why);
    CHECK(plan.cut == 1);
    CHECK(plan.restored_steps == 11);
    CHECK(plan.rolled_back == 4);
    for (const ShardFileData& rows : plan.rows) CHECK(rows.values == at1[rows.rows[0] / 10]);
  }
  SUBCASE("node 1 lost: its partitions come from node 0's copies") {
    HandoverPlan plan = plan_handover(
        {part(3, 0, 2, {own[0].handed(), own[2].handed(), copies[1].handed(), copies[3].handed()})},
        0);
    REQUIRE_MESSAGE(plan.ok, plan.why);
    CHECK(plan.cut == 2);
    CHECK(plan.from_replicas == 2);
    for (const ShardFileData& rows : plan.rows) CHECK(rows.values == at2[rows.rows[0] / 10]);
  }
  SUBCASE("no copies and a node lost: the checkpoint, and why") {
    HandoverPlan plan = plan_handover({part(3, 0, 2, {own[0].handed(), own[2].handed()})}, 0);
    CHECK_FALSE(plan.ok);
    CHECK(plan.why == "partition 1 of epoch 3 is held by no node of this one");
  }
  SUBCASE("an older epoch's part is left out") {
    HandoverData old = part(2, 0, 3, {});
    HandoverPlan plan = plan_handover({old, part(3, 0, 2, {own[0].handed(), own[2].handed()}),
                                       part(3, 1, 2, {own[1].handed(), own[3].handed()})},
                                      0);
    REQUIRE_MESSAGE(plan.ok, plan.why);
    CHECK(plan.epoch == 3);
  }
  SUBCASE("an earlier run of the same epoch is left out") {
    HandoverData earlier = part(3, 0, 2, {own[0].handed(), own[2].handed()});
    HandoverData later = part(3, 1, 2, {own[1].handed(), own[3].handed()});
    later.run = 2;
    HandoverPlan plan = plan_handover({earlier, later}, 0);
    CHECK_FALSE(plan.ok);  // run 2's part alone does not hold partitions 0 and 2
    CHECK(plan.why == "partition 0 of epoch 3 is held by no node of this one");
  }
  SUBCASE("a partition too far ahead to go back") {
    own[2].journal = StepJournal(kDim, kSlots, 3);  // its journal lost: no records
    own[0].step({0});
    own[0].step({0});
    own[0].step({0});
    own[0].step({0});  // 7 steps, 3 kept: back to 4 at the most
    HandoverPlan plan = plan_handover({part(3, 0, 2, {own[0].handed(), own[2].handed()}),
                                       part(3, 1, 2, {own[1].handed(), own[3].handed()})},
                                      0);
    CHECK_FALSE(plan.ok);
    CHECK(plan.why ==
          "partition 0 applied 7 push steps, too far past the 2 every partition "
          "applied to go back");
  }
  SUBCASE("parts that disagree on the table") {
    HandoverData other = part(3, 1, 2, {own[1].handed(), own[3].handed()});
    other.restored_steps = 11;
    HandoverPlan plan =
        plan_handover({part(3, 0, 2, {own[0].handed(), own[2].handed()}), other}, 0);
    CHECK_FALSE(plan.ok);
    CHECK(plan.why == "the nodes' parts of epoch 3 disagree");
  }
}

TEST_CASE("a replicated route's table comes from the node that applied the most") {
  // Every node holds the whole table (one partition); node 1 applied a step node 0 did not
  // get to yet.
  FakeUnit a(0, 0, 3), b(0, 0, 3);
  for (FakeUnit* u : {&a, &b}) u->step({0, 1});
  std::vector<float> at1 = a.unit.rows.values;
  b.step({1, 2});
  auto whole = [](uint32_t node, const FakeUnit& u) {
    HandoverData d = part(4, node, 2, {u.handed()});
    d.partitions = 1;
    return d;
  };
  HandoverPlan exact = plan_handover({whole(0, a), whole(1, b)}, 0);
  REQUIRE_MESSAGE(exact.ok, exact.why);
  CHECK(exact.cut == 2);
  CHECK(exact.rows[0].values == b.unit.rows.values);
  // By default one step back, taken through node 1's journal.
  HandoverPlan plan = plan_handover({whole(0, a), whole(1, b)});
  REQUIRE_MESSAGE(plan.ok, plan.why);
  CHECK(plan.cut == 1);
  CHECK(plan.rolled_back == 1);
  CHECK(plan.rows[0].values == at1);
}
