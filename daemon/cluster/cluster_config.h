// What the control plane needs to know of its node's configuration. The front fills it from
// its DaemonConfig (cluster_config() in daemon/front/config.h), so that the cluster layer
// depends on nothing above it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace px {

// The highest node_index a configuration may give (a Join claiming more is malformed).
constexpr int kMaxNodeIndex = 1023;

struct ClusterConfig {
  std::string cluster = "parallax";  // every node's name must match
  int node_index = 0;                // 0 is the coordinator
  int node_count = 1;                // the node indices (membership: the most nodes it holds)
  // Membership on etcd: the nodes the first epoch forms with (node_count when 0 or equal).
  int first_nodes = 0;
  // Either nodes (host:port of every node's control port, by index) or coordinator.
  std::vector<std::string> nodes;
  std::string coordinator;
  std::string listen;  // what the coordinator binds (default: its entry in nodes)
  int64_t startup_timeout_ms = 60000;
  // Nothing (not even a heartbeat) heard on a control connection this long: the node is lost.
  int64_t peer_silence_ms = 10000;
  // With membership on etcd, the fewest nodes a later epoch forms on (the survivors of a
  // lost node); the first forms on node_count. A static cluster always waits for node_count.
  int min_nodes = 1;
  // Non-empty: daemons authenticate each other with it at rendezvous (cluster_auth.h).
  std::string secret;
};

}  // namespace px
