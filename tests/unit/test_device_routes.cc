// The coordinator's agreement on device routes across nodes (daemon/cluster/device_routes.h):
// NCCL only where every node's part is device memory with one NCCL version and no two nodes
// reduce on one GPU, else the host ring with the reason; one communicator per device set
// of a run, its unique id made once; NCCL steps' turns handed out once every node is ready,
// in one order for every node.
#include <doctest/doctest.h>

#include <string>

#include "daemon/cluster/device_routes.h"

using namespace px;

namespace {

std::string label(int node) {
  return "node " + std::to_string(node);
}

NodeDevice gpu(const std::string& machine, const std::string& bus = "0000:19:00.0",
               const std::string& nccl = "2.28.9") {
  return NodeDevice{true, machine, bus, nccl};
}

struct Routes {
  Routes() {
    routes.run_started(7);
    routes.run_started(8);
  }
  int ids = 0;
  bool id_fails = false;
  DeviceRoutes routes{3, label, [this](std::string* id, std::string* why) {
                        if (id_fails) {
                          *why = "ncclGetUniqueId: unhandled system error";
                          return false;
                        }
                        *id = "id " + std::to_string(++ids);
                        return true;
                      }};
  // Every node reports var's part; the route once the last did.
  DeviceRoutes::Route all(uint32_t var, const NodeDevice& a, const NodeDevice& b,
                          const NodeDevice& c, uint32_t run = 7) {
    CHECK_FALSE(routes.reported(0, run, var, a));
    CHECK_FALSE(routes.reported(2, run, var, c));
    auto route = routes.reported(1, run, var, b);
    REQUIRE(route);
    CHECK(route->run == run);
    CHECK(route->var == var);
    return *route;
  }
};

}  // namespace

TEST_CASE("device routes: NCCL when every node gives device memory on its own GPU") {
  Routes r;
  auto route = r.all(3, gpu("a"), gpu("b"), gpu("c"));
  CHECK(route.nccl);
  CHECK(route.why.empty());
  CHECK(route.comm == 1);
  CHECK(route.unique_id == "id 1");
  // Another variable on the same GPUs: the same communicator, no new id.
  route = r.all(4, gpu("a"), gpu("b"), gpu("c"));
  CHECK(route.comm == 1);
  CHECK(route.unique_id.empty());
  // Node 1 reduces on another of its GPUs: another device set, another communicator.
  route = r.all(5, gpu("a"), gpu("b", "0000:3b:00.0"), gpu("c"));
  CHECK(route.comm == 2);
  CHECK(route.unique_id == "id 2");
  // Two daemons of one machine on different GPUs may meet in NCCL.
  CHECK(r.all(6, gpu("a"), gpu("a", "0000:3b:00.0"), gpu("c")).nccl);
  // A new run of the job starts its communicators afresh.
  route = r.all(3, gpu("a"), gpu("b"), gpu("c"), 8);
  CHECK(route.comm == 1);
  CHECK(route.unique_id == "id 4");
}

TEST_CASE("device routes: the host ring otherwise, saying why") {
  Routes r;
  NodeDevice host;
  auto route = r.all(1, gpu("a"), host, gpu("c"));
  CHECK_FALSE(route.nccl);
  CHECK(route.why == "node 1 gave host memory");
  route = r.all(2, gpu("a"), gpu("b"), gpu("c", "0000:19:00.0", ""));
  CHECK(route.why == "node 2 has no NCCL");
  route = r.all(3, gpu("a"), gpu("b", "0000:19:00.0", "2.27.3"), gpu("c"));
  CHECK(route.why == "NCCL 2.28.9 on node 0 but 2.27.3 on node 1");
  route = r.all(4, gpu("a"), gpu("b"), gpu("a"));
  CHECK(route.why ==
        "node 0 and node 2 reduce on one GPU (0000:19:00.0), and NCCL takes one rank per GPU");
  CHECK(r.ids == 0);
  r.id_fails = true;
  route = r.all(5, gpu("a"), gpu("b"), gpu("c"));
  CHECK_FALSE(route.nccl);
  CHECK(route.why == "no NCCL unique id on node 0: ncclGetUniqueId: unhandled system error");
  // A node that reports twice, or a node outside the cluster, changes nothing.
  CHECK_FALSE(r.routes.reported(0, 7, 9, gpu("a")));
  CHECK_FALSE(r.routes.reported(0, 7, 9, NodeDevice{}));
  CHECK_FALSE(r.routes.reported(3, 7, 9, gpu("x")));
  CHECK_FALSE(r.routes.reported(1, 7, 9, gpu("b")));
  CHECK(r.routes.reported(2, 7, 9, gpu("c"))->why.find("no NCCL unique id") == 0);
  // Once routed, a variable takes no more reports; a run not started takes none.
  CHECK_FALSE(r.routes.reported(0, 7, 9, gpu("a")));
  CHECK_FALSE(r.routes.reported(0, 99, 1, gpu("a")));
  CHECK(r.routes.runs() == 2);
}

TEST_CASE("device routes: a step's turn once every node is ready, numbered in one order") {
  Routes r;
  r.all(1, gpu("a"), gpu("b"), gpu("c"));
  r.all(2, gpu("a"), gpu("b"), gpu("c"));
  r.all(1, gpu("a"), gpu("b"), gpu("c"), 8);
  r.all(3, gpu("a"), NodeDevice{}, gpu("c"));  // the host ring
  // Node 0 is ready for var 1 first, nodes 1 and 2 for var 2: var 2 gets the first turn.
  CHECK_FALSE(r.routes.ready(0, 7, 1, 0));
  CHECK_FALSE(r.routes.ready(1, 7, 2, 0));
  CHECK_FALSE(r.routes.ready(2, 7, 2, 0));
  CHECK_FALSE(r.routes.ready(1, 7, 1, 0));
  CHECK_FALSE(r.routes.ready(1, 7, 1, 0));  // a second report changes nothing
  auto turn = r.routes.ready(0, 7, 2, 0);
  REQUIRE(turn);
  CHECK(turn->var == 2);
  CHECK(turn->step == 0);
  CHECK(turn->turn == 0);
  turn = r.routes.ready(2, 7, 1, 0);
  REQUIRE(turn);
  CHECK(turn->var == 1);
  CHECK(turn->turn == 1);
  // Turns count per run; another run starts at 0.
  for (int n = 0; n < 2; ++n) CHECK_FALSE(r.routes.ready(n, 8, 1, 0));
  CHECK(r.routes.ready(2, 8, 1, 0)->turn == 0);
  CHECK_FALSE(r.routes.ready(5, 8, 1, 1));  // no such node
  // Steps of a host-ring variable, of a variable never routed, of a run not started: no turns.
  for (int n = 0; n < 3; ++n) {
    CHECK_FALSE(r.routes.ready(n, 7, 3, 0));
    CHECK_FALSE(r.routes.ready(n, 7, 4, 0));
    CHECK_FALSE(r.routes.ready(n, 99, 1, 0));
  }
  CHECK(r.routes.runs() == 2);
  r.routes.run_ended(7);
  CHECK(r.routes.runs() == 1);
}
