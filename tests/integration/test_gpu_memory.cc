// Device memory through the daemon (CUDA builds, label gpu): real parallaxd processes and
// px_gpu_worker processes holding device memory. Without a device each case says why and
// counts as skipped, unless PX_REQUIRE_GPU=1 (tools/quickstart test --gpu).
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "tests/integration/harness.h"

using namespace pxt;

namespace {

const std::map<std::string, std::string> kGpuWorker = {
    {"PX_WORKER_PROGRAM", program_path("PX_TEST_GPU_WORKER", PX_GPU_WORKER_PATH)}};

// True when the results are all "skipped" (exit 77): then MESSAGE, or fail under
// PX_REQUIRE_GPU=1.
bool skipped(const std::vector<WorkerResult>& results) {
  for (const WorkerResult& r : results)
    if (r.exit_code != 77) return false;
  std::string why = results.empty() ? "no workers" : results[0].output;
  const char* required = std::getenv("PX_REQUIRE_GPU");
  if (required && std::string(required) == "1")
    FAIL_CHECK("no CUDA device and PX_REQUIRE_GPU=1: " << why);
  else
    MESSAGE("gpu test skipped: " << why);
  return true;
}

}  // namespace

TEST_CASE("device: px_allreduce_ex on device memory, every dtype x op, 1 to 4 workers on one GPU") {
  for (int workers : {1, 2, 4}) {
    CAPTURE(workers);
    DaemonProcess daemon("gpu-allreduce");
    auto results = run_workers(daemon, "allreduce", workers, {"allreduce"}, 240000, kGpuWorker);
    if (skipped(results)) return;
    CHECK(all_ok(results));
  }
}

TEST_CASE("device: px_allreduce_ex on device memory across 2 daemons on one GPU (host ring)") {
  // Two daemons of one machine cannot share a GPU in one NCCL communicator: the node's sum
  // crosses through pinned host memory and the libfabric ring. 3000 elements take recursive
  // doubling, 40000 the ring; every dtype x op against the host path, bit for bit.
  ClusterProcesses cluster("gpu-c2", 2);
  for (const char* count : {"3000", "40000"}) {
    CAPTURE(count);
    auto results = run_cluster_workers(cluster, std::string("ring") + count, 2,
                                       {"allreduce", count}, 240000, kGpuWorker);
    if (skipped(results)) return;
    CHECK(all_ok(results));
  }
  // With NCCL in the build both daemons can run it, so each variable's route was agreed
  // through the coordinator, which chose the host ring for this shape and said why.
  std::string log = cluster.node(0).log();
  if (log.find("; NCCL ") != std::string::npos) {
    CHECK(log.find("cross nodes on the host ring, not NCCL: node 0") != std::string::npos);
    CHECK(log.find("reduce on one GPU") != std::string::npos);
  }
}

TEST_CASE("device: sparse pull and push steps on device memory, 2 workers and 2 daemons x 2") {
  {
    DaemonProcess daemon("gpu-rows");
    auto results = run_workers(daemon, "rows", 2, {"rows"}, 240000, kGpuWorker);
    if (skipped(results)) return;
    CHECK(all_ok(results));
  }
  ClusterProcesses cluster("gpu-rows-c2", 2);
  CHECK(all_ok(run_cluster_workers(cluster, "rows2", 2, {"rows"}, 240000, kGpuWorker)));
}

TEST_CASE("device: allreduce and sparse steps on device memory, 2 daemons x 1 worker on one GPU") {
  // One worker per node: the node's sum is the worker's own buffer, copied out to pinned
  // memory for the ring with no local reduction first (the shape of one GPU per node).
  ClusterProcesses cluster("gpu-c2w1", 2);
  auto results =
      run_cluster_workers(cluster, "ring40000", 1, {"allreduce", "40000"}, 240000, kGpuWorker);
  if (skipped(results)) return;
  CHECK(all_ok(results));
  CHECK(all_ok(run_cluster_workers(cluster, "rows1", 1, {"rows"}, 240000, kGpuWorker)));
}

TEST_CASE("device: px_alloc_ex device memory, mapped by the daemon, from 2 workers on one GPU") {
  DaemonProcess daemon("gpu-alloc");
  auto results = run_workers(daemon, "alloc", 2, {"alloc"}, 120000, kGpuWorker);
  if (skipped(results)) return;
  CHECK(all_ok(results));
  std::string log = daemon.log();
  bool reported = log.find("gpu: 1 device: ") != std::string::npos ||
                  log.find(" devices: ") != std::string::npos;
  CHECK(reported);
}
