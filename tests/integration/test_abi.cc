// ABI 1.3 with real daemons and real worker processes: request errors, lifetimes across
// threads and after px_disconnect, cancel, abort (one node and across nodes), the
// completion fd, per-operation options, the daemon's stall deadline, timed-out barriers.
#include <doctest/doctest.h>

#include "tests/integration/harness.h"

using namespace pxt;

TEST_CASE("abi: a failed request keeps its whole message, whatever thread waited") {
  DaemonProcess daemon("abi-errors");
  CHECK(all_ok(run_workers(daemon, "errors", 1, {"abi13-errors"}, 60000)));
}

TEST_CASE("abi: handles freed or disconnected in any order fail cleanly, waits are woken") {
  DaemonProcess daemon("abi-life");
  CHECK(all_ok(run_workers(daemon, "life", 2, {"abi13-lifetimes"}, 60000)));
  CHECK(daemon.alive());
}

TEST_CASE("abi: a px_checkpoint blocked on one thread does not hold up px_wait on another") {
  ScratchDir scratch("abi-threads");
  DaemonProcess daemon("abi-threads");
  CHECK(all_ok(run_workers(daemon, "threads", 2, {"abi13-threads"}, 60000,
                           {{"PX_TEST_SCRATCH", scratch.path()}})));
}

TEST_CASE("abi: px_request_cancel withdraws a step, peers fail naming it, later steps work") {
  DaemonProcess daemon("abi-cancel");
  CHECK(all_ok(run_workers(daemon, "cancel", 2, {"abi13-cancel"}, 60000)));
}

TEST_CASE("abi: a barrier that timed out on one worker does not release the other") {
  DaemonProcess daemon("abi-barrier");
  CHECK(all_ok(run_workers(daemon, "barrier", 2, {"abi13-barrier-timeout"}, 60000)));
}

TEST_CASE("abi: step_stall_ms fails a step a live worker never submits, naming it") {
  DaemonProcess daemon("abi-stall", {"--step-stall-ms", "500"});
  CHECK(all_ok(run_workers(daemon, "stall", 2, {"abi13-stall"}, 60000)));
  CHECK(daemon.log().find("stalled") != std::string::npos);
}

TEST_CASE(
    "abi: px_abort fails the job's operations with the reason, on one node and across nodes") {
  {
    DaemonProcess daemon("abi-abort");
    CHECK(all_ok(run_workers(daemon, "abort", 2, {"abi13-abort"}, 60000)));
  }
  ClusterProcesses cluster("abi-abort-c", 2);
  CHECK(all_ok(run_cluster_workers(cluster, "abort", 1, {"abi13-abort"}, 60000)));
}

TEST_CASE("abi: an event loop waits through px_client_fd and px_progress") {
  DaemonProcess daemon("abi-loop");
  CHECK(all_ok(run_workers(daemon, "loop", 2, {"abi13-event-loop"}, 60000)));
}

TEST_CASE("abi: per-operation options, and px_connect without a daemon fails at once") {
  DaemonProcess daemon("abi-options");
  CHECK(all_ok(run_workers(daemon, "options", 2, {"abi13-options"}, 60000)));
  // Host memory keeps working in a process that has loaded the CUDA runtime (no GPU here).
  CHECK(all_ok(run_workers(daemon, "cuda", 2, {"abi13-cuda-runtime"}, 60000)));
  CHECK(all_ok(run_workers(daemon, "connect", 1, {"abi13-connect"}, 60000)));
}

TEST_CASE("abi: px_alloc_ex gives host memory as px_alloc, and refuses device memory naming why") {
  {
    DaemonProcess daemon("abi-alloc");
    CHECK(all_ok(run_workers(daemon, "alloc", 2, {"abi18-alloc-ex"}, 60000)));
  }
  // The daemon's own reason reaches the worker (from px_connect's reply, no round trip).
  DaemonProcess off("abi-alloc-off", {"--gpu", "off"});
  CHECK(all_ok(run_workers(off, "alloc-off", 1, {"abi18-alloc-ex-gpu-off"}, 60000)));
}

TEST_CASE("abi: broadcast, allgather and allgatherv on one node, 1 to 3 workers, every dtype") {
  DaemonProcess daemon("abi-coll");
  for (int workers = 1; workers <= 3; ++workers)
    CHECK(all_ok(
        run_workers(daemon, "coll" + std::to_string(workers), workers, {"collectives"}, 120000)));
}

TEST_CASE(
    "abi: reduce_scatter, alltoall and alltoallv on one node, 1 to 3 workers, every dtype and op") {
  DaemonProcess daemon("abi-exch");
  for (int workers = 1; workers <= 3; ++workers)
    CHECK(all_ok(
        run_workers(daemon, "exch" + std::to_string(workers), workers, {"exchanges"}, 180000)));
}

TEST_CASE("abi: reduce_scatter, alltoall and alltoallv across 2 x 2 and 3 x 1 workers") {
  // Exact inputs: the nodes' ring sums in another order than the reference's.
  const std::map<std::string, std::string> exact = {{"PX_TEST_EXACT", "1"}};
  {
    ClusterProcesses cluster("abi-exch2", 2);
    CHECK(all_ok(run_cluster_workers(cluster, "exch", 2, {"exchanges"}, 240000, exact)));
  }
  ClusterProcesses cluster("abi-exch3", 3);
  CHECK(all_ok(run_cluster_workers(cluster, "exch", 1, {"exchanges"}, 240000, exact)));
}

TEST_CASE("abi: broadcast, allgather and allgatherv across 2 x 2, 3 x 1 and 4 x 3 workers") {
  {
    ClusterProcesses cluster("abi-coll2", 2);
    CHECK(all_ok(run_cluster_workers(cluster, "coll", 2, {"collectives"}, 180000)));
  }
  {
    ClusterProcesses cluster("abi-coll3", 3);
    CHECK(all_ok(run_cluster_workers(cluster, "coll", 1, {"collectives"}, 180000)));
  }
  ClusterProcesses cluster("abi-coll4", 4);
  CHECK(all_ok(run_cluster_workers(cluster, "coll", 3, {"collectives"}, 240000)));
}
