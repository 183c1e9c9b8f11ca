// Agreement (daemon/cluster/agreement.h): the coordinator's rules for jobs and variables,
// driven directly with what nodes report, no sockets. Each test checks the verdicts the
// coordinator would send: to whom, with which id or message.
#include <doctest/doctest.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/cluster/agreement.h"

using namespace px;
using Verdict = Agreement::Verdict;
using Kind = Agreement::Verdict::Kind;

namespace {

std::string label(int node) {
  return "node " + std::to_string(node);
}

Fingerprint dense(uint64_t count, ReduceOp op = ReduceOp::kSum, DType dtype = DType::kF32) {
  Fingerprint f;
  f.dtype = dtype;
  f.count = count;
  f.op = op;
  return f;
}

Fingerprint sparse(uint64_t rows, uint64_t dim, const std::string& options) {
  Fingerprint f;
  f.sparse = true;
  f.count = rows;
  f.dim = dim;
  f.options = options;
  return f;
}

// Every node of `agreement` registers (job, var) as f, in node order; the last one's verdict
// (the ones before must have none).
std::optional<Verdict> register_everywhere(Agreement& agreement, const std::string& job,
                                           const std::string& var, const Fingerprint& f) {
  for (int node = 0; node + 1 < agreement.node_count(); ++node)
    REQUIRE_FALSE(agreement.var_registered(node, job, var, f));
  return agreement.var_registered(agreement.node_count() - 1, job, var, f);
}

std::optional<Verdict> join_everywhere(Agreement& agreement, const std::string& job,
                                       uint32_t local_size) {
  for (int node = 0; node + 1 < agreement.node_count(); ++node)
    REQUIRE_FALSE(agreement.job_joined(node, job, local_size));
  return agreement.job_joined(agreement.node_count() - 1, job, local_size);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("agreement: every node registers the same variable: one id, sent to every node") {
  Agreement agreement(3, label);
  // Any order of arrival; nothing is sent until the last node registered.
  CHECK_FALSE(agreement.var_registered(2, "job", "w", dense(1024)));
  CHECK_FALSE(agreement.var_registered(0, "job", "w", dense(1024)));
  auto verdict = agreement.var_registered(1, "job", "w", dense(1024));
  REQUIRE(verdict);
  CHECK(verdict->kind == Kind::kVarReady);
  CHECK(verdict->to == Verdict::kEveryNode);
  CHECK(verdict->job == "job");
  CHECK(verdict->var == "w");
  CHECK(verdict->id != 0);  // 0 means "no id yet" to the scheduler

  // Other variables get other ids.
  auto other = register_everywhere(agreement, "job", "b", dense(16));
  REQUIRE(other);
  CHECK(other->kind == Kind::kVarReady);
  CHECK(other->id != verdict->id);

  // A node saying again what it said (another of its workers registering) changes nothing.
  CHECK_FALSE(agreement.var_registered(1, "job", "w", dense(1024)));
}

TEST_CASE("agreement: a variable that differs across nodes is a mismatch naming every node") {
  Agreement agreement(3, label);
  CHECK_FALSE(agreement.var_registered(0, "job", "w", dense(1024)));
  CHECK_FALSE(agreement.var_registered(1, "job", "w", dense(512, ReduceOp::kMean)));
  auto verdict = agreement.var_registered(2, "job", "w", dense(1024, ReduceOp::kSum, DType::kF16));
  REQUIRE(verdict);
  CHECK(verdict->kind == Kind::kVarMismatch);
  CHECK(verdict->to == Verdict::kEveryNode);
  CHECK(verdict->id == 0);
  CHECK(verdict->message ==
        "variable 'w' of job 'job' differs across nodes: node 0: f32[1024] sum, node 1: "
        "f32[512] mean, node 2: f16[1024] sum");
}

TEST_CASE("agreement: a sparse mismatch names only the words that differ, for every node") {
  Agreement agreement(2, label);
  std::string a = "sgd(lr=0.1) zeros partitions=auto", b = "sgd(lr=0.5) zeros partitions=auto";
  CHECK_FALSE(agreement.var_registered(0, "job", "emb", sparse(1000, 8, a)));
  auto verdict = agreement.var_registered(1, "job", "emb", sparse(1000, 8, b));
  REQUIRE(verdict);
  CHECK(verdict->kind == Kind::kVarMismatch);
  CHECK(verdict->message ==
        "variable 'emb' of job 'job' differs across nodes: node 0: sgd(lr=0.1), node 1: "
        "sgd(lr=0.5)");
}

TEST_CASE("agreement: a node whose own workers disagree poisons the variable at once") {
  Agreement agreement(3, label);
  CHECK_FALSE(agreement.var_registered(1, "job", "w", dense(1024)));
  // Node 1's second worker registered it otherwise: no need to wait for nodes 0 and 2.
  auto verdict = agreement.var_registered(1, "job", "w", dense(2048));
  REQUIRE(verdict);
  CHECK(verdict->kind == Kind::kVarMismatch);
  CHECK(verdict->to == Verdict::kEveryNode);
  CHECK(verdict->message ==
        "variable 'w' of job 'job' is registered on node 1 as f32[1024] sum and as "
        "f32[2048] sum");

  SUBCASE("a node that registers after the verdict gets it alone") {
    auto late = agreement.var_registered(2, "job", "w", dense(1024));
    REQUIRE(late);
    CHECK(late->to == 2);
    CHECK(late->kind == Kind::kVarMismatch);
    CHECK(late->message == verdict->message);
    // Once is enough.
    CHECK_FALSE(agreement.var_registered(2, "job", "w", dense(1024)));
    auto late0 = agreement.var_registered(0, "job", "w", dense(4));
    REQUIRE(late0);
    CHECK(late0->to == 0);  // the coordinator's own node, told like any other
    CHECK(late0->message == verdict->message);
  }
}

TEST_CASE("agreement: a node whose workers disagree after the variable was ready poisons it") {
  Agreement agreement(2, label);
  auto ready = register_everywhere(agreement, "job", "w", dense(8));
  REQUIRE(ready);
  REQUIRE(ready->kind == Kind::kVarReady);
  auto verdict = agreement.var_registered(0, "job", "w", dense(8, ReduceOp::kMax));
  REQUIRE(verdict);
  CHECK(verdict->kind == Kind::kVarMismatch);
  CHECK(verdict->to == Verdict::kEveryNode);
  CHECK(contains(verdict->message, "registered on node 0 as f32[8] sum and as f32[8] max"));
}

TEST_CASE("agreement: a job's world once every node joined, sizes by node") {
  Agreement agreement(3, label);
  CHECK_FALSE(agreement.job_joined(1, "job", 4));
  CHECK_FALSE(agreement.job_joined(2, "job", 1));
  auto world = agreement.job_joined(0, "job", 2);
  REQUIRE(world);
  CHECK(world->kind == Kind::kJobWorld);
  CHECK(world->to == Verdict::kEveryNode);
  CHECK(world->job == "job");
  CHECK(world->local_sizes == std::vector<uint32_t>{2, 4, 1});
  CHECK(world->id != 0);

  // Barrier ids and variable ids come from one counter: they never collide.
  auto var = register_everywhere(agreement, "job", "w", dense(1));
  REQUIRE(var);
  CHECK(var->id != world->id);
}

TEST_CASE("agreement: an epoch of fewer nodes agrees among them alone") {
  // Membership on etcd: the survivors of a lost node, counted by rank.
  Agreement agreement(3, label);
  CHECK_FALSE(agreement.job_joined(0, "job", 2));
  agreement.reset(2);
  CHECK(agreement.node_count() == 2);
  CHECK_FALSE(agreement.job_joined(1, "job", 1));
  auto world = agreement.job_joined(0, "job", 3);
  REQUIRE(world);
  CHECK(world->local_sizes == std::vector<uint32_t>{3, 1});
  auto var = register_everywhere(agreement, "job", "w", dense(1));
  REQUIRE(var);
  CHECK(var->kind == Kind::kVarReady);
  // And of more again.
  agreement.reset(3);
  CHECK_FALSE(agreement.job_joined(0, "job", 1));
  CHECK_FALSE(agreement.job_joined(1, "job", 1));
  world = agreement.job_joined(2, "job", 1);
  REQUIRE(world);
  CHECK(world->local_sizes == std::vector<uint32_t>{1, 1, 1});
}

TEST_CASE("agreement: a node that reports its size twice before the world counts once") {
  Agreement agreement(2, label);
  CHECK_FALSE(agreement.job_joined(0, "job", 2));
  CHECK_FALSE(agreement.job_joined(0, "job", 3));  // the latest word stands
  auto world = agreement.job_joined(1, "job", 1);
  REQUIRE(world);
  CHECK(world->local_sizes == std::vector<uint32_t>{3, 1});
}

TEST_CASE("agreement: a job re-run under the same name is agreed on afresh") {
  Agreement agreement(2, label);
  auto first = join_everywhere(agreement, "job", 2);
  REQUIRE(first);
  auto w1 = register_everywhere(agreement, "job", "w", dense(1024));
  REQUIRE(w1);
  // The first run poisons "bad" on node 0; the next run may register it rightly.
  CHECK_FALSE(agreement.var_registered(0, "job", "bad", dense(1)));
  auto poisoned = agreement.var_registered(0, "job", "bad", dense(2));
  REQUIRE(poisoned);
  CHECK(poisoned->kind == Kind::kVarMismatch);

  // The second run: its joins start from nothing (one node's join is not a world).
  CHECK_FALSE(agreement.job_joined(1, "job", 3));
  auto second = agreement.job_joined(0, "job", 1);
  REQUIRE(second);
  CHECK(second->local_sizes == std::vector<uint32_t>{1, 3});
  CHECK(second->id != first->id);

  // Its variables, even with the same name and shape, wait for every node again and get a
  // new id; a different shape is no conflict with the first run.
  CHECK_FALSE(agreement.var_registered(0, "job", "w", dense(4096)));
  auto w2 = agreement.var_registered(1, "job", "w", dense(4096));
  REQUIRE(w2);
  CHECK(w2->kind == Kind::kVarReady);
  CHECK(w2->to == Verdict::kEveryNode);
  std::set<uint32_t> ids{first->id, w1->id, second->id, w2->id};
  CHECK(ids.size() == 4);
  auto bad = register_everywhere(agreement, "job", "bad", dense(1));
  REQUIRE(bad);
  CHECK(bad->kind == Kind::kVarReady);
}

TEST_CASE("agreement: several jobs at once do not mix") {
  Agreement agreement(2, label);
  // Interleaved: a's and b's joins, then their registrations, the same variable name in both
  // (a node registers only once it has the job's world).
  CHECK_FALSE(agreement.job_joined(0, "a", 1));
  CHECK_FALSE(agreement.job_joined(1, "b", 2));
  auto world_b = agreement.job_joined(0, "b", 5);
  REQUIRE(world_b);
  CHECK(world_b->job == "b");
  CHECK(world_b->local_sizes == std::vector<uint32_t>{5, 2});
  CHECK_FALSE(agreement.var_registered(0, "b", "w", dense(20)));
  auto world_a = agreement.job_joined(1, "a", 1);
  REQUIRE(world_a);
  CHECK(world_a->job == "a");
  CHECK(world_a->local_sizes == std::vector<uint32_t>{1, 1});
  CHECK_FALSE(agreement.var_registered(0, "a", "w", dense(10)));

  // b's "w" is not a's: each matches its own job's registrations.
  auto wa = agreement.var_registered(1, "a", "w", dense(10));
  REQUIRE(wa);
  CHECK(wa->kind == Kind::kVarReady);
  CHECK(wa->job == "a");
  auto wb = agreement.var_registered(1, "b", "w", dense(21));
  REQUIRE(wb);
  CHECK(wb->kind == Kind::kVarMismatch);
  CHECK(wb->job == "b");
  CHECK(contains(wb->message, "of job 'b'"));

  // A new run of a forgets a's variables only: b's verdict still stands for a late worker.
  REQUIRE(join_everywhere(agreement, "a", 1));
  CHECK_FALSE(agreement.var_registered(1, "b", "w", dense(21)));
  CHECK_FALSE(agreement.var_registered(0, "a", "w", dense(10)));  // a waits afresh
  std::set<uint32_t> ids{world_a->id, world_b->id, wa->id};
  CHECK(ids.size() == 3);
}

TEST_CASE("agreement: messages name nodes as they are known when the message is written") {
  // A member's host is learnt only from its Join: the label is asked for each message.
  std::vector<std::string> hosts{"10.0.0.1:7070", ""};
  Agreement agreement(2, [&](int node) {
    return "node " + std::to_string(node) +
           (hosts[static_cast<size_t>(node)].empty()
                ? ""
                : " (" + hosts[static_cast<size_t>(node)] + ")");
  });
  hosts[1] = "10.0.0.2:7070";
  CHECK_FALSE(agreement.var_registered(0, "job", "w", dense(1)));
  auto verdict = agreement.var_registered(1, "job", "w", dense(2));
  REQUIRE(verdict);
  CHECK(verdict->message ==
        "variable 'w' of job 'job' differs across nodes: node 0 (10.0.0.1:7070): f32[1] sum, "
        "node 1 (10.0.0.2:7070): f32[2] sum");
}

TEST_CASE("agreement: a run ends once every node's workers left, and its state goes") {
  Agreement agreement(3, label);
  REQUIRE(!agreement.job_joined(0, "j", 1));
  REQUIRE(!agreement.job_joined(1, "j", 1));
  std::optional<Verdict> world = agreement.job_joined(2, "j", 1);
  REQUIRE(world);
  uint32_t run = world->id;
  for (int node = 0; node < 3; ++node) agreement.var_registered(node, "j", "v", dense(4));
  CHECK(agreement.running() == 1);
  CHECK(agreement.variables() == 1);
  CHECK(!agreement.job_left(0, "j", run));
  CHECK(!agreement.job_left(0, "j", run));  // said twice: still one node
  CHECK(!agreement.job_left(2, "j", run));
  CHECK(!agreement.job_left(1, "j", run + 100));  // a run never started
  CHECK(!agreement.job_left(1, "other", run));    // the id of another job's run
  std::optional<Verdict> end = agreement.job_left(1, "j", run);
  REQUIRE(end);
  CHECK(end->kind == Kind::kJobEnd);
  CHECK(end->to == Verdict::kEveryNode);
  CHECK(end->job == "j");
  CHECK(end->id == run);
  CHECK(agreement.running() == 0);
  CHECK(agreement.variables() == 0);
  CHECK(!agreement.job_left(1, "j", run));  // over: a late repeat changes nothing
}

TEST_CASE("agreement: a job has device routes only when every node can run NCCL") {
  Agreement agreement(3, label);
  CHECK_FALSE(agreement.job_joined(0, "gpu", 2, true));
  CHECK_FALSE(agreement.job_joined(1, "gpu", 2, true));
  auto world = agreement.job_joined(2, "gpu", 2, true);
  REQUIRE(world);
  CHECK(world->device_routes);
  CHECK_FALSE(agreement.job_joined(0, "mixed", 2, true));
  CHECK_FALSE(agreement.job_joined(2, "mixed", 2, true));
  world = agreement.job_joined(1, "mixed", 2, false);
  REQUIRE(world);
  CHECK_FALSE(world->device_routes);
  CHECK_FALSE(join_everywhere(agreement, "host", 1)->device_routes);
}
