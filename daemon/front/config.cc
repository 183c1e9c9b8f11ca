#include "daemon/front/config.h"

#include <toml++/toml.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "daemon/cluster/cluster_auth.h"
#include "daemon/cluster/membership_url.h"
#include "parallax_c.h"

#ifndef PX_VERSION
#define PX_VERSION "unknown"  // daemon/CMakeLists.txt defines it from VERSION
#endif
namespace px {
namespace {

const char kUsage[] =
    "usage: parallaxd [options]\n"
    "\n"
    "The Parallax per-node communication daemon. Workers connect over a Unix socket and\n"
    "exchange gradients through shared memory; daemons of a cluster talk over libfabric.\n"
    "\n"
    "options (flags override --config):\n"
    "  --config FILE          TOML configuration (docs/configuration.md: every key)\n"
    "  --socket PATH          Unix socket (default $PARALLAX_SOCKET, else\n"
    "                         /run/parallax/parallaxd.sock); created 0660\n"
    "  --group NAME           also accept workers of this group (default: own user and root)\n"
    "  --foreground           stay in the foreground (default: detach once listening)\n"
    "  --threads N            reduction threads (default min(4, cores))\n"
    "  --arena-bytes N        default shared arena per worker (default 268435456)\n"
    "  --max-arena-bytes N    largest arena a worker may ask for (default 17179869184)\n"
    "  --ring-capacity N      entries per submission/completion ring, a power of two\n"
    "                         (default 1024): the most requests a worker can have in flight\n"
    "  --log-level LEVEL      error, warn, info (default) or debug\n"
    "  --restore DIR          sparse variables start from their checkpoint in DIR, if any\n"
    "  --log-file FILE        append the log to FILE, reopened on SIGHUP (default stderr)\n"
    "  --check-config         check the configuration (file and flags), print OK and exit\n"
    "service (SIGTERM drains: docs/service.md):\n"
    "  --drain-timeout-ms N   steps under way get this long to finish (default 30000)\n"
    "  --checkpoint-dir DIR   where the drain and the periodic checkpoints save sparse\n"
    "                         variables (default the --restore directory, which it is\n"
    "                         by default itself; neither: nothing is saved)\n"
    "  --checkpoint-timeout-ms N  deadline of a checkpoint (default 60000)\n"
    "  --checkpoint-interval-s N  checkpoint each job that pushed every N s (default 0: never)\n"
    "  --checkpoint-keep K    periodic checkpoints kept per job (default 3)\n"
    "limits per job on this node (default 0: none; past one, a clear error):\n"
    "  --job-variables N      variables a job may register\n"
    "  --job-requests-in-flight N  requests of a job's workers held at once (PX_ERR_BUSY)\n"
    "  --job-arena-bytes N    arena bytes of a job's workers together\n"
    "  --job-sparse-table-bytes N  rows x dim x 4 of a job's sparse tables together\n"
    "cluster:\n"
    "  --cluster NAME         cluster name; every node must use the same (default parallax)\n"
    "  --node-index I         this node's index, 0 is the coordinator\n"
    "  --nodes H:P,H:P,...    every node's control address, by index\n"
    "  --coordinator H:P      instead of --nodes: node 0's control address ...\n"
    "  --node-count N         ... and the number of nodes\n"
    "  --listen H:P           address the coordinator binds (default its --nodes entry);\n"
    "                         with --membership, this node's control address\n"
    "  --membership etcd://H:P[,H:P...]/PREFIX  membership on etcd: the node index is\n"
    "                         assigned and the coordinator elected (docs/elastic.md)\n"
    "  --membership-lease-s N its lease: a node silent to etcd this long is gone (default 5)\n"
    "  --membership-min-nodes N  re-form on the survivors if at least N (default node_count:\n"
    "                         wait for a replacement)\n"
    "  --membership-max-nodes N  the most nodes the cluster holds; nodes past node_count\n"
    "                         join a formed cluster (default node_count)\n"
    "  --fabric-provider P    libfabric provider (default tcp;ofi_rxm; fi_info -l lists them)\n"
    "  --fabric-address A     local address of the fabric endpoint (default this node's host)\n"
    "  --fabric-port N        its port, for firewalls (default 0: the provider picks one)\n"
    "  --chunk-bytes N        pipelining chunk of the ring allreduce (default 262144)\n"
    "  --route-estimate-steps N  pull steps between sparse route estimates (default 32)\n"
    "  --route-auto-sequence R,R  PX_ROUTE_AUTO tables move through these routes in turn,\n"
    "                         one per estimate, not to the estimates' choice (tests)\n"
    "  --secret-file FILE     the cluster's shared secret: daemons authenticate each other\n"
    "                         with HMAC (default none; docs/security.md)\n"
    "  --startup-timeout-ms N deadline for the cluster to form (default 60000)\n"
    "  --peer-silence-ms N    a node silent this long is lost (default 10000)\n"
    "  --step-stall-ms N      a step a local worker has not submitted this long after\n"
    "                         another did fails with PX_ERR_TIMEOUT (default 60000; 0: never)\n"
    "GPUs (docs/gpu.md):\n"
    "  --gpu MODE             auto (default: load the GPU backend if it is there), off, or\n"
    "                         required (refuse to start without a usable GPU)\n"
    "  --gpu-backend PATH     the GPU backend plugin (default libparallax_gpu.so beside\n"
    "                         parallaxd, else LIBDIR/parallax/)\n"
    "  --gpu-cross-node R     device allreduces across nodes: auto (default: NCCL where\n"
    "                         every node can run it, else the host ring) or host-ring\n"
    "  --nccl-timeout-ms N    deadline of an NCCL communicator's creation and of each NCCL\n"
    "                         step (default 60000)\n"
    "observability:\n"
    "  --metrics-listen H:P   serve Prometheus metrics on http://H:P/metrics (default off;\n"
    "                         127.0.0.1:9464 is the usual; port 0 picks a free one)\n"
    "  --stall-report-ms N    log an operation waiting this long, naming whom it waits for\n"
    "                         (default 10000; 0: never)\n"
    "  --version              print the version and exit\n"
    "  --help                 print this help and exit\n";

// One line, so a refused start shows whole in `systemctl status` and the journal.
[[noreturn]] void die_usage(const std::string& message) {
  fprintf(stderr, "parallaxd: %s (see parallaxd --help)\n", message.c_str());
  exit(2);
}

// A configuration file's error already names the file and the key.
[[noreturn]] void die_config(const std::string& message) {
  fprintf(stderr, "parallaxd: %s\n", message.c_str());
  exit(2);
}

bool parse_u64(const std::string& text, uint64_t* out) {
  // Digits only: strtoull skips leading blanks and negates a '-' after them, so " -1" was
  // taken as 18446744073709551615 (found by tests/unit/test_config.cc).
  if (text.empty() || !isdigit(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text.c_str(), &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

bool parse_log_level(const std::string& level, LogLevel* out) {
  if (level == "error")
    *out = LogLevel::kError;
  else if (level == "warn")
    *out = LogLevel::kWarn;
  else if (level == "info")
    *out = LogLevel::kInfo;
  else if (level == "debug")
    *out = LogLevel::kDebug;
  else
    return false;
  return true;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    if (comma > start) out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// "HOST:PORT" as the metrics endpoint binds it: an IPv4 address or name, or [IPv6].
bool valid_listen_address(const std::string& text) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  std::string host = text.substr(0, colon), port = text.substr(colon + 1);
  uint64_t p = 0;
  if (!parse_u64(port, &p) || p > 65535) return false;
  if (host.front() == '[') return host.back() == ']' && host.size() > 2;
  return host.find(':') == std::string::npos;
}

// Applies one setting by name: shared by the TOML file and the flags.
bool apply(DaemonConfig* c, const std::string& key, const std::string& value, std::string* error) {
  uint64_t n = 0;
  auto number = [&](uint64_t lo, uint64_t hi) {
    if (!parse_u64(value, &n) || n < lo || n > hi) {
      *error = key + ": '" + value + "' is not an integer in " + std::to_string(lo) + ".." +
               std::to_string(hi);
      return false;
    }
    return true;
  };
  if (key == "socket")
    c->socket_path = value;
  else if (key == "group")
    c->group = value;
  else if (key == "restore")
    c->restore_dir = value;
  else if (key == "threads") {
    if (!number(0, 256)) return false;
    c->threads = static_cast<unsigned>(n);
  } else if (key == "arena_bytes") {
    if (!number(1 << 20, UINT64_MAX)) return false;
    c->default_arena_bytes = n;
  } else if (key == "max_arena_bytes") {
    if (!number(1 << 20, UINT64_MAX)) return false;
    c->max_arena_bytes = n;
  } else if (key == "ring_capacity") {
    if (!number(2, 1 << 20)) return false;
    if (n & (n - 1)) {
      *error = key + ": " + value + " is not a power of two";
      return false;
    }
    c->ring_capacity = static_cast<uint32_t>(n);
  } else if (key == "log_level") {
    if (!parse_log_level(value, &c->log_level)) {
      *error = key + ": '" + value + "' is not error, warn, info or debug";
      return false;
    }
  } else if (key == "cluster")
    c->cluster = value;
  else if (key == "secret_file")
    c->secret_file = value;
  else if (key == "node_index") {
    if (!number(0, kMaxNodeIndex)) return false;
    c->node_index = static_cast<int>(n);
    c->node_index_given = true;
  } else if (key == "node_count") {
    if (!number(1, 128)) return false;
    c->node_count = static_cast<int>(n);
  } else if (key == "nodes")
    c->nodes = split_commas(value);
  else if (key == "coordinator")
    c->coordinator = value;
  else if (key == "listen")
    c->listen = value;
  else if (key == "membership")
    c->membership = value;
  else if (key == "membership_lease_s") {
    if (!number(2, 3600)) return false;
    c->membership_lease_s = static_cast<int64_t>(n);
  } else if (key == "membership_min_nodes") {
    if (!number(1, 128)) return false;
    c->membership_min_nodes = static_cast<int>(n);
  } else if (key == "membership_max_nodes") {
    if (!number(2, 128)) return false;
    c->membership_max_nodes = static_cast<int>(n);
  } else if (key == "fabric.provider")
    c->fabric_provider = value;
  else if (key == "fabric.address")
    c->fabric_address = value;
  else if (key == "fabric.port") {
    if (!number(0, 65535)) return false;
    c->fabric_port = static_cast<int>(n);
  } else if (key == "fabric.chunk_bytes") {
    if (!number(4096, 1ull << 30)) return false;
    c->chunk_bytes = n;
  } else if (key == "routes.estimate_steps") {
    if (!number(1, 1 << 20)) return false;
    c->route_estimate_steps = n;
  } else if (key == "routes.auto_sequence") {
    c->route_auto_sequence = split_commas(value);
    for (const std::string& route : c->route_auto_sequence) {
      if (route != "ps" && route != "alltoall-rows" && route != "alltoall-columns" &&
          route != "allgatherv" && route != "allreduce") {
        *error = key + ": '" + route +
                 "' is not ps, alltoall-rows, alltoall-columns, allgatherv or allreduce";
        return false;
      }
    }
  } else if (key == "timeouts.peer_silence_ms") {
    if (!number(1000, 3600000)) return false;
    c->peer_silence_ms = static_cast<int64_t>(n);
  } else if (key == "timeouts.step_stall_ms") {
    if (!number(0, 86400000)) return false;
    c->step_stall_ms = static_cast<int64_t>(n);
  } else if (key == "timeouts.startup_ms") {
    if (!number(100, 86400000)) return false;
    c->startup_timeout_ms = static_cast<int64_t>(n);
  } else if (key == "timeouts.stall_report_ms") {
    if (!number(0, 86400000)) return false;
    c->stall_report_ms = static_cast<int64_t>(n);
  } else if (key == "metrics.listen") {
    if (!valid_listen_address(value)) {
      *error = key + ": '" + value + "' is not HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464)";
      return false;
    }
    c->metrics_listen = value;
  } else if (key == "metrics.max_variables") {
    if (!number(0, 100000)) return false;
    c->metrics_max_variables = n;
  } else if (key == "log.file") {
    c->log_file = value;
  } else if (key == "service.drain_timeout_ms") {
    if (!number(0, 3600000)) return false;
    c->drain_timeout_ms = static_cast<int64_t>(n);
  } else if (key == "service.checkpoint_dir") {
    c->drain_checkpoint_dir = value;
  } else if (key == "service.checkpoint_timeout_ms") {
    if (!number(100, 86400000)) return false;
    c->drain_checkpoint_timeout_ms = static_cast<int64_t>(n);
  } else if (key == "service.checkpoint_interval_s") {
    if (!number(0, 31536000)) return false;
    c->checkpoint_interval_s = n;
  } else if (key == "service.checkpoint_keep") {
    if (!number(1, 10000)) return false;
    c->checkpoint_keep = static_cast<int>(n);
  } else if (key == "gpu.mode") {
    if (!gpu::parse_gpu_mode(value, &c->gpu_mode)) {
      *error = key + ": '" + value + "' is not auto, off or required";
      return false;
    }
  } else if (key == "gpu.backend") {
    c->gpu_backend = value;
  } else if (key == "gpu.cross_node") {
    if (value != "auto" && value != "host-ring") {
      *error = key + ": '" + value + "' is not auto or host-ring";
      return false;
    }
    c->gpu_nccl = value == "auto";
  } else if (key == "gpu.nccl_timeout_ms") {
    if (!number(100, 86400000)) return false;
    c->nccl_timeout_ms = static_cast<int64_t>(n);
  } else if (key == "limits.job_variables") {
    if (!number(0, 1u << 24)) return false;  // variable ids have 24 bits on the fabric
    c->job_limits.variables = n;
  } else if (key == "limits.job_requests_in_flight") {
    if (!number(0, UINT32_MAX)) return false;
    c->job_limits.requests_in_flight = n;
  } else if (key == "limits.job_arena_bytes") {
    if (!number(0, UINT64_MAX)) return false;
    c->job_limits.arena_bytes = n;
  } else if (key == "limits.job_sparse_table_bytes") {
    if (!number(0, UINT64_MAX)) return false;
    c->job_limits.sparse_table_bytes = n;
  } else {
    *error = "unknown setting '" + key + "'";
    return false;
  }
  return true;
}

const std::set<std::string> kTables = {"fabric",  "timeouts", "metrics", "log",
                                       "service", "limits",   "routes",  "gpu"};

// Flattens one TOML node to the string apply() takes; false if its type is wrong.
bool toml_value(const toml::node& node, std::string* out) {
  if (auto s = node.value<std::string>()) {
    *out = *s;
    return true;
  }
  if (node.is_integer()) {
    *out = std::to_string(*node.value<int64_t>());
    return true;
  }
  if (auto a = node.as_array()) {
    std::string joined;
    for (auto& element : *a) {
      auto s = element.value<std::string>();
      if (!s) return false;
      joined += (joined.empty() ? "" : ",") + *s;
    }
    *out = joined;
    return true;
  }
  return false;
}

// What a value of the wrong type is, for the message.
std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::boolean:
      return "a boolean; write a string or an integer";
    case toml::node_type::floating_point:
      return "a float; write an integer";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array of other than strings";
    default:
      return "a date or time";
  }
}

}  // namespace

bool load_config_file(const std::string& path, DaemonConfig* config, std::string* error) {
  toml::table root;
  // toml++ reports a missing file as a parse error at line 0; say what the system says.
  if (FILE* probe = fopen(path.c_str(), "r")) {
    fclose(probe);
  } else {
    *error = path + ": cannot read the configuration: " + strerror(errno);
    return false;
  }
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    *error =
        path + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description());
    return false;
  }
  for (auto& [key, node] : root) {
    std::string name(key.str());
    if (auto table = node.as_table()) {
      if (!kTables.count(name)) {
        *error = path + ": unknown table [" + name + "]";
        return false;
      }
      for (auto& [sub, subnode] : *table) {
        std::string full = name + "." + std::string(sub.str()), value;
        if (!toml_value(subnode, &value)) {
          *error = path + ": " + full + " has the wrong type (" + type_name(subnode) + ")";
          return false;
        }
        if (!apply(config, full, value, error)) {
          *error = path + ": " + *error;
          return false;
        }
      }
      continue;
    }
    std::string value;
    if (!toml_value(node, &value)) {
      *error = path + ": " + name + " has the wrong type (" + type_name(node) + ")";
      return false;
    }
    if (!apply(config, name, value, error)) {
      *error = path + ": " + *error;
      return false;
    }
  }
  return true;
}

DaemonConfig parse_command_line(int argc, char** argv) {
  DaemonConfig config;
  if (const char* env = getenv("PARALLAX_SOCKET"); env && *env) config.socket_path = env;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      fputs(kUsage, stdout);
      exit(0);
    }
    if (arg == "--version") {
      printf("parallaxd %s (ABI %d.%d)\n", PX_VERSION, PX_ABI_VERSION_MAJOR, PX_ABI_VERSION_MINOR);
      exit(0);
    }
    if (arg == "--config") {
      if (i + 1 >= argc) die_usage("--config needs a file");
      std::string error;
      if (!load_config_file(argv[i + 1], &config, &error)) die_config(error);
    }
  }
  static const std::pair<const char*, const char*> kFlags[] = {
      {"--socket", "socket"},
      {"--group", "group"},
      {"--restore", "restore"},
      {"--threads", "threads"},
      {"--arena-bytes", "arena_bytes"},
      {"--max-arena-bytes", "max_arena_bytes"},
      {"--ring-capacity", "ring_capacity"},
      {"--log-level", "log_level"},
      {"--cluster", "cluster"},
      {"--secret-file", "secret_file"},
      {"--node-index", "node_index"},
      {"--node-count", "node_count"},
      {"--nodes", "nodes"},
      {"--coordinator", "coordinator"},
      {"--listen", "listen"},
      {"--membership", "membership"},
      {"--membership-lease-s", "membership_lease_s"},
      {"--membership-min-nodes", "membership_min_nodes"},
      {"--membership-max-nodes", "membership_max_nodes"},
      {"--fabric-provider", "fabric.provider"},
      {"--fabric-address", "fabric.address"},
      {"--chunk-bytes", "fabric.chunk_bytes"},
      {"--fabric-port", "fabric.port"},
      {"--route-estimate-steps", "routes.estimate_steps"},
      {"--route-auto-sequence", "routes.auto_sequence"},
      {"--peer-silence-ms", "timeouts.peer_silence_ms"},
      {"--step-stall-ms", "timeouts.step_stall_ms"},
      {"--startup-timeout-ms", "timeouts.startup_ms"},
      {"--metrics-listen", "metrics.listen"},
      {"--stall-report-ms", "timeouts.stall_report_ms"},
      {"--log-file", "log.file"},
      {"--drain-timeout-ms", "service.drain_timeout_ms"},
      {"--checkpoint-dir", "service.checkpoint_dir"},
      {"--checkpoint-timeout-ms", "service.checkpoint_timeout_ms"},
      {"--checkpoint-interval-s", "service.checkpoint_interval_s"},
      {"--checkpoint-keep", "service.checkpoint_keep"},
      {"--gpu", "gpu.mode"},
      {"--gpu-backend", "gpu.backend"},
      {"--gpu-cross-node", "gpu.cross_node"},
      {"--nccl-timeout-ms", "gpu.nccl_timeout_ms"},
      {"--job-variables", "limits.job_variables"},
      {"--job-requests-in-flight", "limits.job_requests_in_flight"},
      {"--job-arena-bytes", "limits.job_arena_bytes"},
      {"--job-sparse-table-bytes", "limits.job_sparse_table_bytes"},
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--config") {
      ++i;
      continue;
    }
    if (arg == "--foreground") {
      config.foreground = true;
      continue;
    }
    if (arg == "--check-config") {
      config.check_only = true;
      continue;
    }
    const char* key = nullptr;
    for (auto& [flag, name] : kFlags)
      if (arg == flag) key = name;
    if (!key) die_usage("unknown option '" + arg + "'");
    if (i + 1 >= argc) die_usage(arg + " needs a value");
    std::string error;
    if (!apply(&config, key, argv[++i], &error)) die_usage(arg + ": " + error);
  }
  std::string error;
  if (!finalize_config(&config, &error)) die_usage(error);
  return config;
}

bool finalize_config(DaemonConfig* c, std::string* error) {
  if (c->drain_checkpoint_dir.empty()) c->drain_checkpoint_dir = c->restore_dir;
  // A daemon restarted with its config restores what it checkpointed.
  if (c->restore_dir.empty()) c->restore_dir = c->drain_checkpoint_dir;
  if (c->checkpoint_interval_s > 0 && c->drain_checkpoint_dir.empty()) {
    *error =
        "service.checkpoint_interval_s is set but there is no service.checkpoint_dir (or "
        "restore) to write into";
    return false;
  }
  if (c->default_arena_bytes > c->max_arena_bytes) {
    *error = "arena_bytes is larger than max_arena_bytes";
    return false;
  }
  if (c->membership.empty() && c->membership_min_nodes > 0) {
    *error = "membership_min_nodes needs membership (a static cluster always waits for every node)";
    return false;
  }
  if (c->membership.empty() && c->membership_max_nodes > 0) {
    *error = "membership_max_nodes needs membership (a static cluster has node_count nodes)";
    return false;
  }
  if (!c->membership.empty()) {
    MembershipUrl url;
    if (!parse_membership_url(c->membership, &url, error)) {
      *error = "membership: " + *error;
      return false;
    }
    if (!c->nodes.empty() || !c->coordinator.empty() || c->node_index_given) {
      *error =
          "membership: with membership on etcd the node index is assigned and the "
          "coordinator elected; drop nodes, coordinator and node_index";
      return false;
    }
    if (c->node_count < 2) {
      *error = "membership: node_count must be 2 or more (the nodes a cluster forms with)";
      return false;
    }
    if (c->membership_min_nodes > c->node_count) {
      *error = "membership_min_nodes (" + std::to_string(c->membership_min_nodes) +
               ") is more than node_count (" + std::to_string(c->node_count) + ")";
      return false;
    }
    if (c->membership_max_nodes > 0 && c->membership_max_nodes < c->node_count) {
      *error = "membership_max_nodes (" + std::to_string(c->membership_max_nodes) +
               ") is less than node_count (" + std::to_string(c->node_count) + ")";
      return false;
    }
    if (c->listen.empty()) {
      *error =
          "membership: needs listen, this node's control address (HOST:PORT) that the "
          "other nodes reach it on";
      return false;
    }
  } else if (!c->nodes.empty()) {
    // The node_count key's range holds for a node list too (found by
    // tests/fuzz/config_fuzz.cc; regressions/config).
    if (c->nodes.size() > 128) {
      *error = "nodes lists " + std::to_string(c->nodes.size()) + " nodes, more than 128";
      return false;
    }
    if (c->node_count > 1 && c->node_count != static_cast<int>(c->nodes.size())) {
      *error = "node_count " + std::to_string(c->node_count) + " but nodes lists " +
               std::to_string(c->nodes.size());
      return false;
    }
    c->node_count = static_cast<int>(c->nodes.size());
  } else if (c->node_count > 1 && c->coordinator.empty()) {
    *error = "node_count > 1 needs nodes or coordinator";
    return false;
  }
  if (c->node_index >= c->node_count) {
    *error = "node_index " + std::to_string(c->node_index) + " is not below the node count " +
             std::to_string(c->node_count);
    return false;
  }
  if (!c->secret_file.empty() && !read_secret_file(c->secret_file, &c->cluster_secret, error)) {
    *error = "secret_file: " + *error;
    return false;
  }
  if (c->fabric_address.empty()) {
    std::string self = !c->membership.empty() ? c->listen
                       : !c->nodes.empty()    ? c->nodes[static_cast<size_t>(c->node_index)]
                                              : (c->node_index == 0 ? c->coordinator : "");
    size_t colon = self.rfind(':');
    c->fabric_address = colon == std::string::npos ? "127.0.0.1" : self.substr(0, colon);
    if (c->fabric_address.empty() || c->fabric_address == "0.0.0.0")
      c->fabric_address = "127.0.0.1";
  }
  return true;
}

int cluster_indices(const DaemonConfig& config) {
  return std::max(config.node_count, config.membership_max_nodes);
}

ClusterConfig cluster_config(const DaemonConfig& config) {
  ClusterConfig c;
  c.cluster = config.cluster;
  c.node_index = config.node_index;
  c.node_count = cluster_indices(config);
  c.first_nodes = config.node_count;
  c.nodes = config.nodes;
  c.coordinator = config.coordinator;
  c.listen = config.listen;
  c.startup_timeout_ms = config.startup_timeout_ms;
  c.peer_silence_ms = config.peer_silence_ms;
  c.secret = config.cluster_secret;
  c.min_nodes = config.membership_min_nodes > 0 ? config.membership_min_nodes : config.node_count;
  // (node_count is the first epoch's nodes, Horovod's -np: the default --min-np as well.)
  return c;
}

}  // namespace px
