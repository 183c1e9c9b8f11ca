// Fuzz target: the TOML configuration (daemon/front/config.cc), what parallaxd does with
// --config FILE before it starts anything: load_config_file (toml++ and every key's check),
// then finalize_config (the cross-field checks the command line also goes through).
//
// Contract: no crash, no sanitizer report, no leak, no exception escaping; a refused file
// gets a message naming the file (and so the key or line). A configuration accepted by both
// holds what the daemon relies on: a node index below a node count of 1..128 (nodes, when
// listed, one per node), a default arena no larger than the largest, ring capacities a
// power of two, the documented ranges of every number, a fabric address, and a coordinator
// or node list on a cluster.
#include <string>

#include "daemon/front/config.h"
#include "fuzz_check.h"

namespace px::fuzz {
namespace {

void check_accepted(const DaemonConfig& c) {
  PX_FUZZ_CHECK(c.node_count >= 1 && c.node_count <= 128);
  PX_FUZZ_CHECK(c.node_index >= 0 && c.node_index < c.node_count);
  PX_FUZZ_CHECK(c.nodes.empty() || c.nodes.size() == static_cast<size_t>(c.node_count));
  PX_FUZZ_CHECK(c.node_count == 1 || !c.nodes.empty() || !c.coordinator.empty());
  PX_FUZZ_CHECK(c.default_arena_bytes >= (1u << 20) && c.default_arena_bytes <= c.max_arena_bytes);
  PX_FUZZ_CHECK(c.ring_capacity >= 2 && c.ring_capacity <= (1u << 20) &&
                (c.ring_capacity & (c.ring_capacity - 1)) == 0);
  PX_FUZZ_CHECK(c.threads <= 256);
  PX_FUZZ_CHECK(c.fabric_port >= 0 && c.fabric_port <= 65535);
  PX_FUZZ_CHECK(c.chunk_bytes >= 4096 && c.chunk_bytes <= (1ull << 30));
  PX_FUZZ_CHECK(c.peer_silence_ms >= 1000 && c.peer_silence_ms <= 3600000);
  PX_FUZZ_CHECK(c.step_stall_ms >= 0 && c.step_stall_ms <= 86400000);
  PX_FUZZ_CHECK(c.startup_timeout_ms >= 100 && c.startup_timeout_ms <= 86400000);
  PX_FUZZ_CHECK(!c.fabric_address.empty());
  ClusterConfig cluster = cluster_config(c);
  PX_FUZZ_CHECK(cluster.node_count == c.node_count && cluster.node_index == c.node_index);
}

}  // namespace
}  // namespace px::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace px::fuzz;
  MemFile file(data, size);
  px::DaemonConfig config;
  std::string error;
  if (!px::load_config_file(file.path(), &config, &error)) {
    PX_FUZZ_CHECK(error.find(file.path()) != std::string::npos);
    return 0;
  }
  if (!px::finalize_config(&config, &error)) {
    PX_FUZZ_CHECK(!error.empty());
    return 0;
  }
  check_accepted(config);
  return 0;
}
