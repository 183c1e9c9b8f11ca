// What the daemon is doing, as plain data: filled on the loop thread by the front
// (daemon/front/admin.cc, collect_daemon_state), then read anywhere: pxctl's replies and
// the Prometheus families (metric_families.h) are both made from it, so they agree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/observe/stall_report.h"

namespace px {

struct WorkerState {
  int local_rank = 0;
  int rank = -1;  // global; -1 until the job has its world
  int pid = 0;
  bool connected = false;
};

struct VariableState {
  std::string job;
  std::string name;
  uint32_t id = 0;
  bool sparse = false;
  std::string shape;  // Fingerprint::describe()
  std::string route;  // what its steps run: allreduce, ps, allgatherv, ... (see README)
  uint64_t ops = 0, bytes = 0, wait_ns = 0, reduce_ns = 0;
  // Sparse only (px_var_stats' fields).
  uint64_t pull_steps = 0, push_steps = 0, rows_pulled = 0, rows_unique = 0, rows_applied = 0,
           bytes_sent = 0, bytes_received = 0;
  // A hot-row cache's (px_var_stats' cache_*; all 0 without one).
  uint64_t cache_hits = 0, cache_misses = 0, cache_rows = 0, cache_bytes_saved = 0,
           cache_rows_flushed = 0;
  double alpha = 0;         // rows_pulled / (pull_steps * local workers * rows)
  double unique_alpha = 0;  // rows_unique / (pull_steps * rows)
  uint32_t pending_steps = 0;
  std::string failed;        // the variable's failure (mismatch, restore), empty if none
  std::string route_reason;  // device memory across nodes: why the host ring, not NCCL
};

struct JobState {
  std::string name;
  std::string state;  // waiting, running, broken
  std::string broken;
  int local_size = 0;
  int connected = 0;
  int node_count = 1;
  int world_size = 0;
  int rank_offset = 0;
  uint32_t variables = 0;
  std::vector<WorkerState> workers;
};

struct PeerState {
  int index = 0;
  std::string address;
  std::string state;  // self, up, lost, joining, absent (not in the epoch)
};

// The daemon's memory by part, in bytes: what it holds for its jobs and what its fabric
// costs, beside what the kernel counts as resident. The parts overlap resident only where
// touched (an arena's pages count once a worker or the daemon writes them).
struct DaemonMemory {
  uint64_t resident = 0;  // VmRSS: the daemon's resident set, shared pages included
  uint64_t shards = 0;    // sparse tables' rows and optimizer state held on this node
  uint64_t arenas = 0;    // the connected workers' shared-memory arenas' heaps it maps
  uint64_t rings = 0;     // their submission and completion rings (the arenas' heads)
  uint64_t scratch = 0;   // the collectives' receive buffers, in use and kept idle
  uint64_t staging = 0;   // pinned host buffers device steps cross nodes through
  uint64_t caches = 0;    // hot-row caches: copies and held sums, their maps estimated
  // ofi_rxm's bounce buffers, estimated from their size and count (1,024 a batch, a batch
  // for receives once the fabric is open and one for sends after the first send).
  uint64_t fabric_buffers = 0;
};

struct DaemonState {
  std::string version;
  std::string abi;
  int pid = 0;
  int64_t uptime_ms = 0;
  std::string socket;
  std::string cluster;
  std::string cluster_state;  // single, forming, ready, broken
  int node_index = 0;
  int node_count = 1;
  std::string node_label;  // "node 1 (127.0.0.1:7070)"; "node 0" on a single node
  int nodes_up = 1;
  uint32_t workers = 0;  // connected worker processes (admin connections not counted)
  std::string metrics_url;
  std::string timeline_path;
  uint64_t timeline_events = 0;
  uint64_t timeline_dropped = 0;
  int64_t step_stall_ms = 0;
  int64_t stall_report_ms = 0;
  // Sends that went to the fabric ahead of earlier ones by priority (send_window.h).
  uint64_t fabric_priority_overtakes = 0;
  // GPU (daemon/gpu): gpu.mode, the devices the backend found, and LoadedGpu::summary().
  std::string gpu_mode;
  int gpu_devices = 0;
  std::string gpu;
  std::string nccl;            // NCCL's version, "" without it
  std::string gpu_cross_node;  // "nccl" (this daemon offers it) or "host ring (why)"
  DaemonMemory memory;
  std::string membership;    // etcd://...; empty: a static cluster
  int coordinator_node = 0;  // the node that coordinates (etcd's choice with membership)
  int64_t coordinator_term = 0;
  std::vector<JobState> jobs;
  std::vector<VariableState> variables;
  std::vector<PeerState> peers;
  std::vector<Stall> stalls;
};

}  // namespace px
