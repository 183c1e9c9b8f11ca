// Device routes over the real control plane (daemon/cluster/cluster_device_routes.cc): two
// Cluster objects, coordinator and member, on one libuv loop over loopback TCP, with real
// fabric endpoints. Checked end to end through the Cap'n Proto messages: a job's device
// routes when both nodes can run NCCL (and not when one cannot), a variable's route reaching
// both nodes with the unique id node 0 made, and an NCCL step's turn once both are ready.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/cluster/cluster.h"

using namespace px;

namespace {

// A free port below the ephemeral range (as the integration harness picks its ports).
int free_port() {
  std::mt19937 rng(
      static_cast<unsigned>(getpid()) ^
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (;;) {
    int port = 20000 + static_cast<int>(rng() % 12000);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    close(fd);
    if (free) return port;
  }
}

struct Heard {
  bool ready = false;
  std::string fatal;
  std::vector<std::pair<std::string, bool>> worlds;  // job, device routes
  std::map<std::string, uint32_t> barriers;          // by job
  std::vector<DeviceRoutes::Route> routes;
  std::vector<DeviceRoutes::Turn> turns;
};

struct TwoClusters {
  TwoClusters() {
    uv_loop_init(&loop);
    std::vector<std::string> nodes = {"127.0.0.1:" + std::to_string(free_port()),
                                      "127.0.0.1:" + std::to_string(free_port())};
    for (int i = 0; i < 2; ++i) {
      FabricOptions options;
      options.provider = "tcp;ofi_rxm";
      options.address = "127.0.0.1";
      std::string error;
      fabrics.push_back(FabricEndpoint::open(options, &error));
      REQUIRE_MESSAGE(fabrics.back(), error);
      ClusterConfig config;
      config.cluster = "routes";
      config.node_index = i;
      config.node_count = 2;
      config.nodes = nodes;
      config.startup_timeout_ms = 10000;
      Heard& h = heard[i];
      Cluster::Events events;
      events.ready = [&h] { h.ready = true; };
      events.fatal = [&h](const std::string& why) { h.fatal = why; };
      events.job_world = [&h](const std::string& job, const std::vector<uint32_t>&,
                              uint32_t barrier, bool device_routes) {
        h.worlds.emplace_back(job, device_routes);
        h.barriers[job] = barrier;
      };
      events.var_ready = [](const std::string&, const std::string&, uint32_t) {};
      events.var_mismatch = [](const std::string&, const std::string&, const std::string&) {};
      events.node_lost = [&h](int, const std::string& why) { h.fatal = why; };
      events.job_broken = [](const std::string&, uint32_t, int, const std::string&, bool) {};
      events.job_end = [](const std::string&, uint32_t) {};
      events.reformed = [](uint64_t) {};
      events.device_route = [&h](const DeviceRoutes::Route& r) { h.routes.push_back(r); };
      events.nccl_turn = [&h](const DeviceRoutes::Turn& t) { h.turns.push_back(t); };
      events.nccl_unique_id = [this](std::string* id, std::string*) {
        ++ids_made;
        id->assign(128, static_cast<char>('a' + ids_made));
        return true;
      };
      clusters.push_back(
          std::make_unique<Cluster>(&loop, config, *fabrics.back(), std::move(events)));
    }
    for (auto& c : clusters) {
      std::string error;
      REQUIRE_MESSAGE(c->start(&error), error);
    }
    REQUIRE(run_until([&] { return heard[0].ready && heard[1].ready; }));
  }
  ~TwoClusters() {
    for (auto& c : clusters) c->stop();
    uv_run(&loop, UV_RUN_NOWAIT);
    clusters.clear();
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  // Runs the loop until done() or 10 s or a fatal event.
  bool run_until(const std::function<bool()>& done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
      if (!heard[0].fatal.empty() || !heard[1].fatal.empty()) {
        FAIL_CHECK(std::string(heard[0].fatal + heard[1].fatal));
        return false;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      uv_run(&loop, UV_RUN_NOWAIT);
      usleep(200);
    }
    return true;
  }

  uv_loop_t loop{};
  std::vector<std::unique_ptr<FabricEndpoint>> fabrics;
  std::vector<std::unique_ptr<Cluster>> clusters;
  Heard heard[2];
  int ids_made = 0;
};

}  // namespace

TEST_CASE("cluster device routes: job, route and turns travel between the daemons") {
  TwoClusters two;
  // A job whose nodes can both run NCCL, and one where node 1 cannot.
  two.clusters[1]->join_job("gpu", 2, true);
  two.clusters[0]->join_job("gpu", 2, true);
  two.clusters[0]->join_job("mixed", 1, true);
  two.clusters[1]->join_job("mixed", 1, false);
  REQUIRE(two.run_until(
      [&] { return two.heard[0].worlds.size() == 2 && two.heard[1].worlds.size() == 2; }));
  for (const Heard& h : two.heard) {
    CHECK(h.worlds[0] == std::make_pair(std::string("gpu"), true));
    CHECK(h.worlds[1] == std::make_pair(std::string("mixed"), false));
  }
  uint32_t run = two.heard[1].barriers["gpu"];  // the run with device routes
  two.clusters[1]->report_device_route(run, 5, NodeDevice{true, "m1", "0000:19:00.0", "2.28.9"});
  two.clusters[0]->report_device_route(run, 5, NodeDevice{true, "m0", "0000:19:00.0", "2.28.9"});
  two.clusters[0]->report_device_route(run, 6, NodeDevice{true, "m0", "0000:19:00.0", "2.28.9"});
  two.clusters[1]->report_device_route(run, 6, NodeDevice{false, "m1", "", ""});
  REQUIRE(two.run_until(
      [&] { return two.heard[0].routes.size() == 2 && two.heard[1].routes.size() == 2; }));
  CHECK(two.ids_made == 1);
  for (const Heard& h : two.heard) {
    CHECK(h.routes[0].var == 5);
    CHECK(h.routes[0].nccl);
    CHECK(h.routes[0].comm == 1);
    CHECK(h.routes[0].unique_id == std::string(128, 'b'));
    CHECK(h.routes[1].var == 6);
    CHECK_FALSE(h.routes[1].nccl);
    CHECK(h.routes[1].unique_id.empty());
    CHECK(h.routes[1].why.find("node 1") != std::string::npos);
    CHECK(h.routes[1].why.find("gave host memory") != std::string::npos);
  }
  // Steps 0 and 1 of var 5, ready on the two nodes in different orders: each gets its turn
  // once both are ready, in one order for both nodes (which order depends on when node 1's
  // reports reach the coordinator).
  two.clusters[0]->report_nccl_ready(run, 5, 0);
  two.clusters[1]->report_nccl_ready(run, 5, 1);
  two.clusters[1]->report_nccl_ready(run, 5, 0);
  two.clusters[0]->report_nccl_ready(run, 5, 1);
  REQUIRE(two.run_until(
      [&] { return two.heard[0].turns.size() == 2 && two.heard[1].turns.size() == 2; }));
  for (const Heard& h : two.heard) {
    CHECK(h.turns[0].turn == 0);
    CHECK(h.turns[1].turn == 1);
    CHECK(h.turns[0].step + h.turns[1].step == 1);  // steps 0 and 1
    CHECK(h.turns[0].step == two.heard[0].turns[0].step);
    CHECK(h.turns[0].var == 5);
    CHECK(h.turns[0].run == run);
  }
  // The run without device routes takes no reports.
  two.clusters[1]->report_device_route(two.heard[1].barriers["mixed"], 5, NodeDevice{});
  two.clusters[0]->report_device_route(two.heard[0].barriers["mixed"], 5, NodeDevice{});
  two.clusters[0]->report_nccl_ready(run, 5, 2);
  two.clusters[1]->report_nccl_ready(run, 5, 2);
  REQUIRE(two.run_until([&] { return two.heard[1].turns.size() == 3; }));
  CHECK(two.heard[1].routes.size() == 2);
}
