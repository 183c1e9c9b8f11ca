// parallaxd's settings (command line today; the cluster issue adds a TOML file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/cluster/cluster_config.h"  // ClusterConfig, kMaxNodeIndex
#include "daemon/common/log.h"
#include "daemon/gpu/gpu_loader.h"  // GpuMode

namespace px {

struct DaemonConfig {
  std::string socket_path = "/run/parallax/parallaxd.sock";
  std::string group;  // members of this group may connect, besides the daemon's own user
  bool foreground = false;
  unsigned threads = 0;  // 0: min(4, cores)
  uint64_t default_arena_bytes = 256ull << 20;
  uint64_t max_arena_bytes = 16ull << 30;
  std::string restore_dir;        // sparse variables load their checkpoint from here, if it has one
  uint32_t ring_capacity = 1024;  // also each worker's most requests in flight
  // Per-job limits on this node ([limits]; README: Running parallaxd as a service), so one
  // job cannot starve the others; 0: none. Past one, the worker or request that would cross
  // it is refused with an error naming the limit; the job goes on.
  struct JobLimits {
    uint64_t variables = 0;           // registered variables (dense and sparse)
    uint64_t requests_in_flight = 0;  // its workers' requests the daemon holds at once
    uint64_t arena_bytes = 0;         // the arenas of its workers on this node together
    uint64_t sparse_table_bytes = 0;  // rows x dim x 4 of its sparse tables together
  } job_limits;
  LogLevel log_level = LogLevel::kInfo;

  // Cluster (node_count > 1). Either nodes (host:port of every node's control port; node 0
  // is the coordinator) or coordinator + node_count.
  std::string cluster = "parallax";
  // A file holding the cluster's shared secret (mode 0600): daemons authenticate each other
  // with it at rendezvous. Read by finalize_config into cluster_secret.
  std::string secret_file;
  std::string cluster_secret;
  int node_index = 0;
  bool node_index_given = false;  // set by the key: refused with membership (assigned there)
  int node_count = 1;
  // "etcd://HOST:PORT[,...]/PREFIX": membership on etcd (daemon/cluster/etcd_membership.h;
  // docs/elastic.md): node_index is assigned there, listen is this node's control address.
  std::string membership;
  int64_t membership_lease_s = 5;
  // The fewest nodes an epoch re-forms on after the first (the survivors); 0: node_count.
  int membership_min_nodes = 0;
  // The most nodes the cluster holds (its node indices; later nodes join up to it, the first
  // epoch forms with node_count); 0: node_count. cluster_indices() reads both.
  int membership_max_nodes = 0;
  std::vector<std::string> nodes;
  std::string coordinator;
  std::string listen;  // what the coordinator binds (default: its entry in nodes)
  std::string fabric_provider = "tcp;ofi_rxm";
  std::string fabric_address;  // local address for the fabric endpoint (default: this node's host)
  int fabric_port = 0;         // the fabric endpoint's port; 0: one the provider picks
  uint64_t chunk_bytes = 256ull << 10;
  // Sparse routes ([routes]; README: Sparse variables). The route model estimates every
  // route's step from the pulls of this many pull steps (then again, every as many).
  uint64_t route_estimate_steps = 32;
  // PX_ROUTE_AUTO tables move through these routes in turn (then from the first again), one
  // per estimate, instead of where the estimates point ("ps", "alltoall-rows", "alltoall-columns",
  // "allgatherv", "allreduce"; for tests and experiments: the moves are real, the choice is
  // pinned). Empty: estimates.
  std::vector<std::string> route_auto_sequence;
  int64_t startup_timeout_ms = 60000;
  // A node from which nothing (not even a heartbeat, sent every quarter of this) arrived
  // on its control connection this long is lost: a daemon stopped or hung, or a machine or
  // link that vanished without closing the connection.
  int64_t peer_silence_ms = 10000;
  // A step that some local workers submitted and another has not within this long fails
  // for them with PX_ERR_TIMEOUT naming the missing worker (on a cluster the job fails on
  // every node: the others cannot complete that step either). 0: never.
  int64_t step_stall_ms = 60000;

  // Observability (README: Observability). The Prometheus endpoint, "HOST:PORT" (port 0: any
  // free one); empty: off.
  std::string metrics_listen;
  // Variables that get per-variable series; the rest are only counted.
  uint64_t metrics_max_variables = 256;
  // An operation waiting this long is logged once with who it waits for. 0: not logged.
  int64_t stall_report_ms = 10000;
  // Operating as a service (README: Running parallaxd as a service).
  std::string log_file;  // "" : stderr (journald under systemd); SIGHUP reopens a file
  // SIGTERM drains: steps already under way get this long to finish ...
  int64_t drain_timeout_ms = 30000;
  // ... then every sparse variable is checkpointed here ("" : into restore_dir; both empty:
  // nothing is saved), within this long.
  // The periodic checkpoints go there too (and a restarted daemon restores from there
  // when restore is not set).
  std::string drain_checkpoint_dir;
  int64_t drain_checkpoint_timeout_ms = 60000;
  // Every this many seconds each job that pushed since gets a new generation of
  // checkpoints (periodic_checkpoints.h); 0: none. The newest checkpoint_keep stay.
  uint64_t checkpoint_interval_s = 0;
  int checkpoint_keep = 3;
  // GPU (README: GPUs): whether to load the GPU backend plugin, and from where ("" : beside
  // parallaxd, else where it is installed).
  gpu::GpuMode gpu_mode = gpu::GpuMode::kAuto;
  std::string gpu_backend;
  // Device allreduces across nodes: "auto" (NCCL where every node can run it, else the host
  // ring through pinned memory) or "host-ring" (never NCCL: this node says it cannot).
  bool gpu_nccl = true;
  int64_t nccl_timeout_ms = 60000;  // an NCCL communicator's creation, and each NCCL step
  bool check_only = false;          // --check-config: validate, print a line, exit
};

// Reads a TOML file into config (keys as in the README). Unknown keys and bad values are
// errors naming the key.
bool load_config_file(const std::string& path, DaemonConfig* config, std::string* error);
// Parses the command line (after --config FILE, whose values it overrides). Exits with a
// message on bad usage; --help and --version print and exit.
DaemonConfig parse_command_line(int argc, char** argv);
// Checks cross-field consistency and fills derived fields; false with error if invalid.
bool finalize_config(DaemonConfig* config, std::string* error);
// The part of config the control plane reads (daemon/cluster/ knows no DaemonConfig).
ClusterConfig cluster_config(const DaemonConfig& config);
// The node indices of the cluster: node_count, or membership_max_nodes when more.
int cluster_indices(const DaemonConfig& config);

}  // namespace px
