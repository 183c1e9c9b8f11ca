// cluster_config() (daemon/front/config.h): the front hands the cluster layer its settings
// by copy, so a field it forgets would silently run the cluster on the default.
#include <doctest/doctest.h>

#include "daemon/front/config.h"

using namespace px;

TEST_CASE("cluster_config copies every cluster setting of the daemon's configuration") {
  DaemonConfig d;
  d.cluster = "train-a";
  d.node_index = 2;
  d.node_count = 3;
  d.nodes = {"10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"};
  d.coordinator = "10.0.0.1:7070";
  d.listen = "0.0.0.0:7070";
  d.startup_timeout_ms = 1234;
  d.peer_silence_ms = 567;
  ClusterConfig c = cluster_config(d);
  CHECK(c.cluster == "train-a");
  CHECK(c.node_index == 2);
  CHECK(c.node_count == 3);
  CHECK(c.nodes == d.nodes);
  CHECK(c.coordinator == "10.0.0.1:7070");
  CHECK(c.listen == "0.0.0.0:7070");
  CHECK(c.startup_timeout_ms == 1234);
  CHECK(c.peer_silence_ms == 567);
}

TEST_CASE("the cluster's defaults are the daemon's") {
  DaemonConfig d;
  ClusterConfig defaults, c = cluster_config(d);
  CHECK(c.cluster == defaults.cluster);
  CHECK(c.node_index == defaults.node_index);
  CHECK(c.node_count == defaults.node_count);
  CHECK(c.startup_timeout_ms == defaults.startup_timeout_ms);
  CHECK(c.peer_silence_ms == defaults.peer_silence_ms);
}
