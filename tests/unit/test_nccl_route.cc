// Device allreduces across nodes over NCCL, without a GPU (daemon/dense/cross_node_route.h):
// two nodes' schedulers in one process, their device memory host-backed, NCCL played by an
// in-process fake that fails calls issued in different orders (device_fakes.h), and the
// coordinator's agreement (daemon/cluster/device_routes.h) reached through an in-process
// channel in place of the cluster's control connections. Checked: the route agreed once per
// variable (NCCL, or the host ring with its reason), one communicator per device set opened
// once, results (sum and mean), steps of two variables finished in opposite orders on the
// two nodes issued in one order, and a host-memory step refused on an NCCL variable.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/cluster/device_routes.h"
#include "daemon/common/job.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/thread_pool.h"
#include "daemon/dense/cross_node_route.h"
#include "daemon/dense/scheduler.h"
#include "tests/unit/collective_test_util.h"
#include "tests/unit/device_fakes.h"
#include "tests/unit/manual_loop.h"
#include "tests/unit/scheduler_entries.h"

using namespace px;
using pxtest::DeviceWorker;
using pxtest::entry;
using pxtest::HostBackend;

namespace {

constexpr int kNodes = 2;
constexpr uint32_t kRun = 1;

struct Node;

// The coordinator's side in process: the agreement, and delivery to each node's loop (in
// the order decided, as one TCP connection per node delivers it).
struct Coordinator {
  std::mutex mutex;
  HostBackend* node0_backend = nullptr;
  DeviceRoutes routes{
      kNodes, [](int n) { return "node " + std::to_string(n); },
      [this](std::string* id, std::string* why) { return node0_backend->nccl_unique_id(id, why); }};
  Node* nodes[kNodes] = {};
  Coordinator() { routes.run_started(kRun); }
  void reported(int node, uint32_t var, const NodeDevice& part);
  void ready(int node, uint32_t var, uint64_t step);
};

class Channel final : public RouteChannel {
 public:
  Channel(Coordinator& c, int node, std::string machine)
      : coordinator_(c), node_(node), machine_(std::move(machine)) {}
  const std::string& machine() const override { return machine_; }
  void report_route(const Job&, const Variable& var, const NodeDevice& part) override {
    coordinator_.reported(node_, var.global_id, part);
  }
  void report_ready(const Job&, const Variable& var, uint64_t step) override {
    coordinator_.ready(node_, var.global_id, step);
  }

 private:
  Coordinator& coordinator_;
  int node_;
  std::string machine_;
};

// One node: 2 workers on device memory (or host memory), variables "a" (global id 5) of
// count floats and "b" (6) of count + 8, so the fake NCCL tells their steps apart.
struct Node {
  Node(Coordinator& c, int index, CollectiveTransport& fabric, uint64_t count,
       const std::string& machine, const std::string& nccl, ReduceOp op)
      : pool(2),
        scheduler(pool, loop.poster()),
        job(std::make_shared<Job>("j", 2)),
        channel(c, index, machine) {
    job->mark_ready();
    JobWorld world;
    world.node_index = index;
    world.node_count = kNodes;
    world.rank_offset = 2 * index;
    world.world_size = 4;
    world.node_sizes = {2, 2};
    world.device_routes = true;
    job->set_world(world);
    scheduler.set_cluster_transport(&fabric, 16 << 10);
    scheduler.set_routes(&channel, 2000);
    backend.with_nccl(nccl, "0000:19:00.0");
    scheduler.set_gpu(&backend);
    Fingerprint f;
    f.count = count;
    f.op = op;
    uint32_t global = 5;
    for (const char* name : {"a", "b"}) {
      f.count = count + (global - 5) * 8;
      Variable& v = job->add(name, f, "test");
      v.registered.assign(2, true);
      v.global_id = global++;
      vars.push_back(v.id);
    }
    for (int r = 0; r < 2; ++r) {
      auto w = std::make_shared<DeviceWorker>(r, 4 * (count + 8) * sizeof(float), 0);
      job->members()[static_cast<size_t>(r)] = w;
      workers.push_back(std::move(w));
    }
    c.nodes[index] = this;
  }
  Variable& var_by_global(uint32_t global) { return *job->find(vars[global - 5]); }
  // Both workers submit step `step` of variable `v` (0: "a", 1: "b", of `base` + 8 v
  // floats): input global rank + 1 + i % 5 in device memory at v x 2 x base floats, output
  // after it (or host memory).
  void submit(int v, uint64_t step, uint64_t base, bool device = true) {
    uint64_t count = base + static_cast<uint64_t>(v) * 8;
    uint64_t bytes = count * sizeof(float);
    uint64_t at = static_cast<uint64_t>(v) * 2 * base * sizeof(float);
    for (size_t r = 0; r < 2; ++r) {
      DeviceWorker& w = *workers[r];
      float* in = device ? w.floats(at) : w.host_floats(at);
      int rank = 2 * job->world().node_index + static_cast<int>(r);
      for (uint64_t i = 0; i < count; ++i)
        in[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 5));
      BufferRef a = device ? w.device(at, bytes) : w.host(at, bytes);
      BufferRef b = device ? w.device(at + bytes, bytes) : w.host(at + bytes, bytes);
      scheduler.submit(
          job, static_cast<int>(r), workers[r],
          entry(++request, vars[static_cast<size_t>(v)], Opcode::kAllreduce, step, a, b));
    }
  }
  const float* out(size_t r, int v, uint64_t base) const {
    uint64_t count = base + static_cast<uint64_t>(v) * 8;
    return workers[r]->floats((static_cast<uint64_t>(v) * 2 * base + count) * sizeof(float));
  }
  bool done(size_t each) const { return pxtest::all_done(workers, each); }
  void wait(size_t each) {
    if (!loop.run_until([&] { return done(each); })) {
      // The other node still uses this one's loop and pool: stop rather than free them.
      fprintf(stderr, "node %d: no completion in 10 s\n", job->world().node_index);
      std::abort();
    }
  }

  ManualLoop loop;
  ThreadPool pool;
  Scheduler scheduler;
  HostBackend backend;
  std::shared_ptr<Job> job;
  Channel channel;
  std::vector<uint32_t> vars;
  std::vector<std::shared_ptr<DeviceWorker>> workers;
  uint64_t request = 0;
};

void Coordinator::reported(int node, uint32_t var, const NodeDevice& part) {
  std::lock_guard<std::mutex> lock(mutex);
  auto route = routes.reported(node, kRun, var, part);
  if (!route) return;
  for (Node* n : nodes)
    n->loop.post([n, route = *route] {
      n->scheduler.route_decided(n->job, n->var_by_global(route.var), route);
    });
}

void Coordinator::ready(int node, uint32_t var, uint64_t step) {
  std::lock_guard<std::mutex> lock(mutex);
  auto turn = routes.ready(node, kRun, var, step);
  if (!turn) return;
  for (Node* n : nodes)
    n->loop.post([n, turn = *turn] {
      CHECK(n->scheduler.turn_arrived(n->var_by_global(turn.var), turn.step));
    });
}

// Runs body(node) for both nodes, each on its own thread, against one coordinator.
struct TwoNodes {
  TwoNodes(uint64_t count, std::vector<std::string> machines, std::vector<std::string> nccl,
           ReduceOp op = ReduceOp::kSum)
      : eps(pxt::open_endpoints(2)) {
    for (int i = 0; i < kNodes; ++i)
      nodes.push_back(std::make_unique<Node>(coordinator, i, *eps[static_cast<size_t>(i)], count,
                                             machines[static_cast<size_t>(i)],
                                             nccl[static_cast<size_t>(i)], op));
    coordinator.node0_backend = &nodes[0]->backend;
  }
  void run(const std::function<void(Node&)>& body) {
    std::thread other([&] { body(*nodes[1]); });
    body(*nodes[0]);
    other.join();
  }
  std::vector<std::unique_ptr<FabricEndpoint>> eps;
  Coordinator coordinator;
  std::vector<std::unique_ptr<Node>> nodes;
};

// Every worker's output of v: the sum over global ranks 0..3 of rank + 1 + i % 5 (or its
// mean).
void check_sum(const Node& node, int v, uint64_t base, float scale = 1) {
  uint64_t count = base + static_cast<uint64_t>(v) * 8;
  for (size_t r = 0; r < 2; ++r) {
    INFO(node.workers[r]->done.back().message);
    CHECK(node.workers[r]->done.back().status == PX_OK);
    int bad = 0;
    for (uint64_t i = 0; i < count; ++i)
      bad += node.out(r, v, base)[i] != static_cast<float>(10 + 4 * (i % 5)) * scale;
    CHECK(bad == 0);
  }
}

}  // namespace

TEST_CASE("nccl route: agreed once, one communicator opened once, results on every worker") {
  uint64_t count = 3000;
  TwoNodes two(count, {"m0", "m1"}, {"2.28.9", "2.28.9"});
  two.run([&](Node& n) {
    for (uint64_t step = 0; step < 3; ++step) {
      n.submit(0, step, count);
      n.wait(step + 1);
      check_sum(n, 0, count);
    }
    n.submit(1, 0, count);  // a second variable on the same GPUs: the same communicator
    n.wait(4);
    check_sum(n, 1, count);
  });
  for (auto& n : two.nodes) {
    Variable& a = *n->job->find(n->vars[0]);
    CHECK(a.stats.route == std::string("gpu-nccl"));
    CHECK(a.route.state == CrossNodeRoute::State::kNccl);
    CHECK(a.route.comm == 1);
    CHECK(n->backend.nccl_opens == 1);
    CHECK(n->backend.allocations == 0);  // no pinned staging: nothing crossed to the host
  }
}

TEST_CASE("nccl route: a mean is summed over NCCL and divided once on the device") {
  uint64_t count = 100;
  TwoNodes two(count, {"m0", "m1"}, {"2.28.9", "2.28.9"}, ReduceOp::kMean);
  two.run([&](Node& n) {
    n.submit(0, 0, count);
    n.wait(1);
    check_sum(n, 0, count, 0.25f);
  });
}

TEST_CASE("nccl route: steps finished in opposite orders on two nodes meet in one order") {
  uint64_t count = 500;
  TwoNodes two(count, {"m0", "m1"}, {"2.28.9", "2.28.9"});
  two.run([&](Node& n) {
    // Agree both routes first (one step each), then race: node 0 submits a then b, node 1
    // b then a, four rounds; their sizes differ, so the fake NCCL catches a mixed order.
    n.submit(0, 0, count);
    n.wait(1);
    n.submit(1, 0, count);
    n.wait(2);
    for (uint64_t step = 1; step < 5; ++step) {
      bool a_first = n.job->world().node_index == 0;
      n.submit(a_first ? 0 : 1, step, count);
      n.submit(a_first ? 1 : 0, step, count);
      n.wait(2 * step + 2);
    }
    for (size_t r = 0; r < 2; ++r)
      for (const auto& done : n.workers[r]->done) {
        INFO(done.message);
        CHECK(done.status == PX_OK);
      }
    check_sum(n, 0, count);
    check_sum(n, 1, count);
  });
}

TEST_CASE("nccl route: the host ring where NCCL cannot run, with the reason") {
  uint64_t count = 3000;
  SUBCASE("two daemons of one machine on one GPU") {
    TwoNodes two(count, {"m0", "m0"}, {"2.28.9", "2.28.9"});
    two.run([&](Node& n) {
      n.submit(0, 0, count);
      n.wait(1);
      check_sum(n, 0, count);
    });
    for (auto& n : two.nodes) {
      Variable& a = *n->job->find(n->vars[0]);
      CHECK(a.stats.route == std::string("gpu-host-ring"));
      CHECK(a.route.why ==
            "node 0 and node 1 reduce on one GPU (0000:19:00.0), and NCCL takes one rank per GPU");
      CHECK(n->backend.nccl_opens == 0);
    }
  }
  SUBCASE("one node gives host memory") {
    TwoNodes two(count, {"m0", "m1"}, {"2.28.9", "2.28.9"});
    two.run([&](Node& n) {
      n.submit(0, 0, count, n.job->world().node_index == 0);
      n.wait(1);
      for (size_t r = 0; r < 2; ++r) {
        INFO(n.workers[r]->done.back().message);
        CHECK(n.workers[r]->done.back().status == PX_OK);
      }
    });
    CHECK(two.nodes[0]->job->find(two.nodes[0]->vars[0])->route.why == "node 1 gave host memory");
  }
  SUBCASE("NCCL versions differ") {
    TwoNodes two(count, {"m0", "m1"}, {"2.28.9", "2.27.3"});
    two.run([&](Node& n) {
      n.submit(0, 0, count);
      n.wait(1);
      check_sum(n, 0, count);
    });
    CHECK(two.nodes[1]->job->find(two.nodes[1]->vars[0])->route.why ==
          "NCCL 2.28.9 on node 0 but 2.27.3 on node 1");
  }
}

TEST_CASE("nccl route: a host-memory step on an NCCL variable is refused and ends the job") {
  uint64_t count = 100;
  TwoNodes two(count, {"m0", "m1"}, {"2.28.9", "2.28.9"});
  std::string aborted;
  two.nodes[1]->scheduler.set_abort_job([&](Job&, const std::string& why) {
    aborted = why;
    // As the cluster's report of the broken job does on the other daemon.
    Node* other = two.nodes[0].get();
    other->loop.post([other, why] {
      other->job->mark_broken(why);
      other->scheduler.fail_job(*other->job, PX_ERR_PEER_LOST, why);
    });
  });
  two.run([&](Node& n) {
    n.submit(0, 0, count);
    n.wait(1);
    n.submit(0, 1, count, n.job->world().node_index == 0);  // node 1: host memory
    n.wait(2);
  });
  const auto& refused = two.nodes[1]->workers[0]->done.back();
  CHECK(refused.status == PX_ERR_INVALID);
  CHECK(refused.message.find("this node gave host memory, but the variable crosses nodes over "
                             "NCCL") != std::string::npos);
  CHECK(aborted.find("so the job ends") != std::string::npos);
  // Node 0 waited for the step's turn: it fails with the job instead.
  const auto& failed = two.nodes[0]->workers[0]->done.back();
  CHECK(failed.status == PX_ERR_PEER_LOST);
}

TEST_CASE("nccl route: a communicator that cannot be opened ends the job on every node") {
  uint64_t count = 100;
  TwoNodes two(count, {"m0", "m1"}, {"2.28.9", "2.28.9"});
  two.nodes[1]->backend.fail_open = "fake ncclCommInitRank: unhandled cuda error";
  std::vector<std::string> aborted(2);
  for (int i = 0; i < kNodes; ++i)
    two.nodes[static_cast<size_t>(i)]->scheduler.set_abort_job(
        [&, i](Job&, const std::string& why) {
          if (!aborted[static_cast<size_t>(i)].empty()) return;
          aborted[static_cast<size_t>(i)] = why;
          // As the cluster's report of the broken job does on every daemon.
          for (auto& n : two.nodes) {
            Node* node = n.get();
            node->loop.post([node, why] {
              if (!node->job->broken().empty()) return;
              node->job->mark_broken(why);
              node->scheduler.fail_job(*node->job, PX_ERR_PEER_LOST, why);
            });
          }
        });
  two.run([&](Node& n) {
    n.submit(0, 0, count);
    n.wait(1);
  });
  CHECK(aborted[1].find("opening the NCCL communicator: fake ncclCommInitRank: unhandled cuda "
                        "error") != std::string::npos);
  for (auto& n : two.nodes)
    for (auto& w : n->workers) {
      INFO(w->done.back().message);
      CHECK(w->done.back().status == PX_ERR_PEER_LOST);
    }
}

TEST_CASE(
    "nccl route: the run's end fails the steps waiting for a turn and frees the communicators") {
  uint64_t count = 100;
  TwoNodes two(count, {"m0", "m1"}, {"2.28.9", "2.28.9"});
  two.run([&](Node& n) {
    n.submit(0, 0, count);  // routes agreed, communicator opened
    n.wait(1);
    if (n.job->world().node_index == 1) return;  // node 1's workers submit no more
    n.submit(0, 1, count);
    // Node 0's step waits for a turn that cannot come; its run ends here (its workers left,
    // as Server::worker_left's grace ends it): the step fails, the communicators go.
    Variable& a = *n.job->find(n.vars[0]);
    REQUIRE(n.loop.run_until([&] { return !a.route.awaiting_turn.empty(); }));
    end_device_routes(*n.job, PX_ERR_PEER_LOST, "a worker of node 1 left");
    n.wait(2);
    for (auto& w : n.workers) {
      CHECK(w->done.back().status == PX_ERR_PEER_LOST);
      CHECK(w->done.back().message.find("a worker of node 1 left") != std::string::npos);
    }
    CHECK_FALSE(n.job->nccl_comms());
    CHECK(a.route.awaiting_turn.empty());
    // A later step finds no communicator and fails at once.
    n.submit(0, 2, count);
    n.wait(3);
    INFO(n.workers[0]->done.back().message);
    CHECK(n.workers[0]->done.back().message.find("NCCL communicators are gone") !=
          std::string::npos);
  });
}
