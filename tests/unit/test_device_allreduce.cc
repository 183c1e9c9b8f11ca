// Device allreduce steps in the scheduler (admission.cc, device_allreduce_step.cc) without
// a GPU: fake workers hold device regions backed by host memory, and a test backend does
// the GPU backend's job with the host reduction. Checked: what reaches the backend (ranks
// in order, count, mean divisor, one device), results in every worker's output, and the
// refusals (host and device mixed, buffers past a region, device memory for another
// operation, no backend, a failing backend). Across two nodes (two schedulers in one
// process over libfabric on loopback): the host ring through the backend's staging, with
// device or host memory on either node.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/common/completer.h"
#include "daemon/common/job.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/thread_pool.h"
#include "daemon/dense/scheduler.h"
#include "tests/unit/collective_test_util.h"
#include "tests/unit/device_fakes.h"
#include "tests/unit/manual_loop.h"
#include "tests/unit/scheduler_entries.h"
#include "transport/kernels/reduce.h"

using namespace px;
using pxtest::Completion;
using pxtest::DeviceWorker;
using pxtest::entry;
using pxtest::HostBackend;

namespace {

// One node of a two-node job: its place in the job and its endpoint.
struct ClusterNode {
  JobWorld world;
  CollectiveTransport* fabric = nullptr;
};

struct Fixture {
  // Each worker's device region holds 2 x count floats unless region_bytes says more; worker
  // r's is on GPU r % gpus.
  Fixture(int workers, uint64_t count, ReduceOp op = ReduceOp::kSum, bool with_backend = true,
          const ClusterNode* node = nullptr, uint64_t region_bytes = 0, int gpus = 1)
      : pool(2), scheduler(pool, loop.poster()), job(std::make_shared<Job>("j", workers)) {
    // Two nodes run on two threads of one process: neither is "the" loop thread then.
    if (!node) loop_thread.emplace();
    job->mark_ready();
    if (node) {
      job->set_world(node->world);
      scheduler.set_cluster_transport(node->fabric, 16 << 10);
    }
    Fingerprint f;
    f.dtype = DType::kF32;
    f.count = count;
    f.op = op;
    Variable& v = job->add("v", f, "test");
    v.registered.assign(static_cast<size_t>(workers), true);
    if (node) v.global_id = 5;  // as if every node had registered it
    var_id = v.id;
    for (int r = 0; r < workers; ++r) {
      auto w = std::make_shared<DeviceWorker>(
          r, region_bytes ? region_bytes : 2 * count * sizeof(float), r % gpus);
      job->members()[static_cast<size_t>(r)] = w;
      this->workers.push_back(std::move(w));
    }
    if (with_backend) scheduler.set_gpu(&backend);
  }
  void submit(int rank, const SubmitEntry& e) {
    scheduler.submit(job, rank, workers[static_cast<size_t>(rank)], e);
  }
  bool all_done(size_t each) const { return pxtest::all_done(workers, each); }

  std::optional<LoopThreadScope> loop_thread;
  ManualLoop loop;
  ThreadPool pool;
  Scheduler scheduler;
  HostBackend backend;
  std::shared_ptr<Job> job;
  uint32_t var_id = 0;
  std::vector<std::shared_ptr<DeviceWorker>> workers;
};

// Each worker's input: rank + 1 + i % 5, in the first half of its region; output after it.
void device_step(Fixture& fx, uint64_t count, uint64_t step) {
  uint64_t bytes = count * sizeof(float);
  for (size_t r = 0; r < fx.workers.size(); ++r) {
    DeviceWorker& w = *fx.workers[r];
    for (uint64_t i = 0; i < count; ++i) w.floats(0)[i] = static_cast<float>(r + 1 + i % 5);
    fx.submit(static_cast<int>(r), entry(10 + step, fx.var_id, Opcode::kAllreduce, step,
                                         w.device(0, bytes), w.device(bytes, bytes)));
  }
}

}  // namespace

TEST_CASE("device allreduce: the backend reduces every local worker's device buffers") {
  Fixture fx(3, 100);
  device_step(fx, 100, 0);
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  for (auto& w : fx.workers) {
    CHECK(w->done[0].status == PX_OK);
    const float* out = w->floats(400);
    for (int i = 0; i < 100; ++i) CHECK(out[i] == 6 + 3 * (i % 5));
  }
  const gpu::DeviceAllreduce& seen = fx.backend.seen;
  CHECK(seen.count == 100);
  CHECK(seen.inputs.size() == 3);
  CHECK(seen.device == 0);
  for (size_t r = 0; r < 3; ++r) {  // by rank: the host path's summation order
    CHECK(seen.inputs[r] == fx.workers[r]->floats(0));
    CHECK(seen.outputs[r] == fx.workers[r]->floats(400));
  }
  CHECK(fx.job->find(fx.var_id)->stats.ops == 1);
}

TEST_CASE("device allreduce: a mean is divided by the job's world size") {
  Fixture fx(2, 8, ReduceOp::kMean);
  device_step(fx, 8, 0);
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  CHECK(fx.backend.seen.mean_divisor == 2);
  CHECK(fx.workers[1]->floats(32)[0] == doctest::Approx(1.5));
}

TEST_CASE("device allreduce: host and device memory in one step fail it for every worker") {
  Fixture fx(2, 8);
  DeviceWorker& w0 = *fx.workers[0];
  DeviceWorker& w1 = *fx.workers[1];
  fx.submit(0, entry(1, fx.var_id, Opcode::kAllreduce, 0, w0.device(0, 32), w0.device(32, 32)));
  fx.submit(1, entry(2, fx.var_id, Opcode::kAllreduce, 0, w1.host(0, 32), w1.host(64, 32)));
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  for (auto& w : fx.workers) {
    CHECK(w->done[0].status == PX_ERR_INVALID);
    CHECK(w->done[0].message.find("device rank 1 gave host memory where the other local "
                                  "workers gave device memory") != std::string::npos);
    CHECK(w->done[0].message.find("variable 'v', step 0") != std::string::npos);
  }
}

TEST_CASE("device allreduce: bad device buffers are refused naming the worker and why") {
  Fixture fx(2, 8);
  DeviceWorker& w0 = *fx.workers[0];
  DeviceWorker& w1 = *fx.workers[1];
  // Past the end of the region (64 bytes): the step fails for both.
  fx.submit(0, entry(1, fx.var_id, Opcode::kAllreduce, 0, w0.device(0, 32), w0.device(48, 32)));
  fx.submit(1, entry(2, fx.var_id, Opcode::kAllreduce, 0, w1.device(0, 32), w1.device(32, 32)));
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  CHECK(w1.done[0].status == PX_ERR_INVALID);
  CHECK(w1.done[0].message.find("device rank 0 gave an invalid buffer: out: bytes [48, 48 + 32) "
                                "run past device memory region 1 of 64 bytes") !=
        std::string::npos);
  // A region the worker never registered; in device, out host.
  fx.submit(0, entry(3, fx.var_id, Opcode::kAllreduce, 1,
                     BufferRef{0, 32, static_cast<uint32_t>(MemoryKind::kCudaDevice), 9},
                     w0.device(32, 32)));
  fx.submit(1, entry(4, fx.var_id, Opcode::kAllreduce, 1, w1.device(0, 32), w1.host(0, 32)));
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(2); }));
  CHECK(w0.done[1].message.find("device memory region 9 is not registered") != std::string::npos);
  // Device memory for an allgatherv: not taken so far.
  fx.submit(0, entry(5, fx.var_id, Opcode::kAllgatherv, 0, w0.device(0, 32), w0.device(32, 32)));
  fx.submit(1, entry(6, fx.var_id, Opcode::kAllgatherv, 0, w1.device(0, 32), w1.device(32, 32)));
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(3); }));
  CHECK(w0.done[2].message.find("allreduce, broadcast, allgather and sparse pulls, pushes, loads "
                                "and reads only so far") != std::string::npos);
}

TEST_CASE("device allreduce: without a backend, or when it fails, the step fails clearly") {
  {
    Fixture fx(2, 8, ReduceOp::kSum, false);
    device_step(fx, 8, 0);
    REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
    CHECK(fx.workers[0]->done[0].status == PX_ERR_NOT_IMPLEMENTED);
    CHECK(fx.workers[0]->done[0].message.find("no usable GPU") != std::string::npos);
  }
  Fixture fx(2, 8);
  fx.backend.fail_with =
      "gpu allreduce: launch: cudaErrorLaunchFailure: unspecified launch failure";
  device_step(fx, 8, 0);
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  CHECK(fx.workers[1]->done[0].status == PX_ERR_INTERNAL);
  CHECK(fx.workers[1]->done[0].message.find("gpu allreduce: launch: cudaErrorLaunchFailure") !=
        std::string::npos);
  // The next step works once the backend does.
  fx.backend.fail_with.clear();
  device_step(fx, 8, 1);
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(2); }));
  CHECK(fx.workers[0]->done[1].status == PX_OK);
}

namespace {

// What one node of a two-node step saw: each local worker's status and output.
struct NodeResult {
  std::vector<px_status> status;
  std::vector<std::string> message;
  std::vector<std::vector<float>> out;
  int allocations = 0;
  std::string route;
  std::string aborted;  // what the node's abort_job was told, if anything
};

// Node `index` of two, 2 workers each (global rank = 2 x index + local rank), on its own
// thread: `steps` allreduces of count floats, input rank + 1 + i % 5, in device memory or in
// the host arena. The result of the last step. fail_with: the node's backend fails with it;
// its abort_job then fails the variable's traffic on peer, as the cluster's report of the
// broken job does on the other daemon.
NodeResult run_node(int index, FabricEndpoint& fabric, bool device, uint64_t count, ReduceOp op,
                    int steps, const std::string& fail_with = "", FabricEndpoint* peer = nullptr,
                    Opcode opcode = Opcode::kAllreduce) {
  ClusterNode node;
  node.world.node_index = index;
  node.world.node_count = 2;
  node.world.rank_offset = 2 * index;
  node.world.world_size = 4;
  node.world.node_sizes = {2, 2};
  node.fabric = &fabric;
  // An allgather's output holds the 4 workers' blocks.
  uint64_t out_count = opcode == Opcode::kAllgather ? 4 * count : count;
  Fixture fx(2, count, op, true, &node, (count + out_count) * sizeof(float));
  uint64_t bytes = count * sizeof(float);
  NodeResult result;
  fx.backend.fail_with = fail_with;
  fx.scheduler.set_abort_job([&result, peer](Job&, const std::string& why) {
    result.aborted = why;
    if (peer) peer->fail_variables({5}, why);
  });
  for (int step = 0; step < steps; ++step) {
    for (size_t r = 0; r < 2; ++r) {
      DeviceWorker& w = *fx.workers[r];
      float* in = device ? w.floats(0) : w.host_floats(0);
      for (uint64_t i = 0; i < count; ++i)
        in[i] = static_cast<float>(2 * index + static_cast<int>(r) + 1 + static_cast<int>(i % 5));
      BufferRef a = device ? w.device(0, bytes) : w.host(0, bytes);
      BufferRef b = device ? w.device(bytes, out_count * sizeof(float))
                           : w.host(bytes, out_count * sizeof(float));
      SubmitEntry e = entry(1 + static_cast<uint64_t>(step), fx.var_id, opcode,
                            static_cast<uint64_t>(step), a, b);
      e.root = 3;  // a broadcast's root: global rank 3, on node 1
      fx.submit(static_cast<int>(r), e);
    }
    if (!fx.loop.run_until([&] { return fx.all_done(static_cast<size_t>(step) + 1); })) {
      // The other node's thread and the endpoints still use this node's pool and loop:
      // returning would free them under it. A hang is the failure; say so and stop.
      fprintf(stderr, "node %d: no completion in 10 s (step %d)\n", index, step);
      std::abort();
    }
  }
  for (auto& w : fx.workers) {
    result.status.push_back(w->done.back().status);
    result.message.push_back(w->done.back().message);
    const float* out = device ? w->floats(bytes) : w->host_floats(bytes);
    result.out.emplace_back(out, out + out_count);
  }
  result.allocations = fx.backend.allocations.load();
  result.route = fx.job->find(fx.var_id)->stats.route;
  return result;
}

// Both nodes' results for one configuration.
std::vector<NodeResult> two_nodes(bool device0, bool device1, uint64_t count, ReduceOp op,
                                  int steps = 1, Opcode opcode = Opcode::kAllreduce) {
  auto eps = pxt::open_endpoints(2);
  std::vector<NodeResult> results(2);
  std::thread other(
      [&] { results[1] = run_node(1, *eps[1], device1, count, op, steps, "", nullptr, opcode); });
  results[0] = run_node(0, *eps[0], device0, count, op, steps, "", nullptr, opcode);
  other.join();
  return results;
}

void check_results(const std::vector<NodeResult>& results, uint64_t count, ReduceOp op) {
  for (const NodeResult& node : results) {
    for (size_t r = 0; r < 2; ++r) {
      INFO(node.message[r]);
      CHECK(node.status[r] == PX_OK);
      int bad = 0;
      for (uint64_t i = 0; i < count; ++i) {
        float sum = static_cast<float>(10 + 4 * (i % 5));  // ranks 1..4 plus 4 x (i % 5)
        float want = op == ReduceOp::kMean ? sum / 4 : sum;
        bad += node.out[r][i] != want;
      }
      CHECK(bad == 0);
    }
  }
}

}  // namespace

TEST_CASE("device allreduce across nodes: the host ring through pinned staging") {
  for (uint64_t count : {uint64_t{100}, uint64_t{20000}}) {  // recursive doubling, then ring
    CAPTURE(count);
    auto results = two_nodes(true, true, count, ReduceOp::kSum, 3);
    check_results(results, count, ReduceOp::kSum);
    for (const NodeResult& node : results) {
      CHECK(node.allocations == 1);  // one staging buffer, kept for the next steps
      CHECK(node.route == "gpu-host-ring");
    }
  }
}

TEST_CASE("device allreduce across nodes: a mean is divided once, by the job's world size") {
  check_results(two_nodes(true, true, 20000, ReduceOp::kMean), 20000, ReduceOp::kMean);
}

TEST_CASE("device allreduce across nodes: one node's device memory meets another's host memory") {
  auto results = two_nodes(true, false, 20000, ReduceOp::kMean);
  check_results(results, 20000, ReduceOp::kMean);
  CHECK(results[0].route == "gpu-host-ring");
  CHECK(results[1].route == "");  // the plain host allreduce
}

TEST_CASE("device allreduce across nodes: a failure before the ring ends the job on every node") {
  auto eps = pxt::open_endpoints(2);
  std::vector<NodeResult> results(2);
  std::thread other([&] { results[1] = run_node(1, *eps[1], true, 20000, ReduceOp::kSum, 1); });
  results[0] = run_node(0, *eps[0], true, 20000, ReduceOp::kSum, 1,
                        "gpu reduce to host: copy: cudaErrorIllegalAddress", eps[1].get());
  other.join();
  CHECK(results[0].status[0] == PX_ERR_INTERNAL);
  CHECK(results[0].message[0].find("gpu reduce to host: copy: cudaErrorIllegalAddress") !=
        std::string::npos);
  CHECK(results[0].aborted.find("the other nodes cannot complete the step without this "
                                "node's share, so the job ends") != std::string::npos);
  // Node 1 was in the ring: it fails instead of waiting for node 0's share.
  CHECK(results[1].status[0] == PX_ERR_PEER_LOST);
  CHECK(results[1].aborted.empty());
}

TEST_CASE("device broadcast: the root's device buffer reaches every worker's, on one node") {
  Fixture fx(3, 50);
  for (size_t r = 0; r < 3; ++r) {
    DeviceWorker& w = *fx.workers[r];
    for (int i = 0; i < 50; ++i) w.floats(0)[i] = static_cast<float>(100 * static_cast<int>(r) + i);
    SubmitEntry e =
        entry(1, fx.var_id, Opcode::kBroadcast, 0, w.device(0, 200), w.device(200, 200));
    e.root = 1;
    fx.submit(static_cast<int>(r), e);
  }
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  for (auto& w : fx.workers) {
    INFO(w->done[0].message);
    CHECK(w->done[0].status == PX_OK);
    for (int i = 0; i < 50; ++i) CHECK(w->floats(200)[i] == 100 + i);
  }
  CHECK(fx.backend.copies == 3);  // the root's input to the first output, then two more
}

TEST_CASE("device broadcast across nodes: through pinned staging, device meeting host memory") {
  auto results = two_nodes(true, false, 20000, ReduceOp::kSum, 2, Opcode::kBroadcast);
  for (const NodeResult& node : results)
    for (size_t r = 0; r < 2; ++r) {
      INFO(node.message[r]);
      CHECK(node.status[r] == PX_OK);
      int bad = 0;
      for (uint64_t i = 0; i < 20000; ++i) bad += node.out[r][i] != static_cast<float>(4 + i % 5);
      CHECK(bad == 0);  // global rank 3's input: 2 x 1 + 1 + 1 + i % 5
    }
  CHECK(results[0].allocations == 1);  // node 0's staging, kept for its second step
}

TEST_CASE("device allgather: every worker's block in rank order, on one node and across two") {
  {
    Fixture fx(3, 8, ReduceOp::kSum, true, nullptr, 4 * 32);
    for (size_t r = 0; r < 3; ++r) {
      DeviceWorker& w = *fx.workers[r];
      for (int i = 0; i < 8; ++i) w.floats(0)[i] = static_cast<float>(10 * static_cast<int>(r) + i);
      fx.submit(static_cast<int>(r),
                entry(1, fx.var_id, Opcode::kAllgather, 0, w.device(0, 32), w.device(32, 96)));
    }
    REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
    for (auto& w : fx.workers) {
      INFO(w->done[0].message);
      CHECK(w->done[0].status == PX_OK);
      for (int k = 0; k < 24; ++k) CHECK(w->floats(32)[k] == 10 * (k / 8) + k % 8);
    }
  }
  auto results = two_nodes(false, true, 5000, ReduceOp::kSum, 1, Opcode::kAllgather);
  for (const NodeResult& node : results)
    for (size_t r = 0; r < 2; ++r) {
      INFO(node.message[r]);
      CHECK(node.status[r] == PX_OK);
      int bad = 0;
      for (uint64_t k = 0; k < 4 * 5000; ++k)  // rank k / 5000's input: rank + 1 + i % 5
        bad += node.out[r][k] != static_cast<float>(k / 5000 + 1 + (k % 5000) % 5);
      CHECK(bad == 0);
    }
}

TEST_CASE("device steps: workers on different GPUs of the node reduce and copy across them") {
  Fixture fx(3, 100, ReduceOp::kSum, true, nullptr, 0, 3);
  device_step(fx, 100, 0);
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  for (auto& w : fx.workers) {
    INFO(w->done[0].message);
    CHECK(w->done[0].status == PX_OK);
    for (int i = 0; i < 100; ++i) CHECK(w->floats(400)[i] == 6 + 3 * (i % 5));
  }
  CHECK(fx.backend.seen.devices == std::vector<int>{0, 1, 2});
  CHECK(fx.backend.seen.device == 0);  // the first worker's GPU reduces
  // A broadcast from the worker on GPU 2 reaches the others.
  for (size_t r = 0; r < 3; ++r) {
    DeviceWorker& w = *fx.workers[r];
    SubmitEntry e =
        entry(20, fx.var_id, Opcode::kBroadcast, 0, w.device(0, 400), w.device(400, 400));
    e.root = 2;
    fx.submit(static_cast<int>(r), e);
  }
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(2); }));
  for (auto& w : fx.workers) {
    CHECK(w->done[1].status == PX_OK);
    CHECK(w->floats(400)[7] == 3 + 7 % 5);  // rank 2's input: 3 + i % 5
  }
}
