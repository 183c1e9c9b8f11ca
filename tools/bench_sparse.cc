// px-bench sparse: an LM1B-shaped training step through every sparse route.
//
//   px-bench sparse [--json] [--nodes 2,4] [--workers-per-node 2] [--link-gbit 1]
//                   [--routes hybrid,ps,allgatherv,allreduce,alltoall-rows,alltoall-columns]
//                   [--steps N] [--rows 800000] [--dim 128] [--lookups 8192]
//                   [--dense-bytes 25000000] [--partitions P (0: automatic)]
//                   [--mtu N (links' MTU, default 1500)] [--zipf S (default 1.0)]
//                   (any of them + "-bf16" or "-f16": that route with a 16-bit wire dtype;
//                   + "-prefetch" last: each next pull issued before the push, px_prefetch_rows;
//                   + "-boundedS": PX_BOUNDED with staleness S, then "-cacheS": a hot-row
//                   cache of --cache-rows rows serving S pull steps, e.g. ps-bounded0-cache4)
//                   [--cache-rows R (default 65536)] [--peers gloo] [--daemon PATH]
//
// Each worker looks up `lookups` rows of a rows x dim f32 table, Zipf(S)-distributed,
// pulls them, and pushes a gradient for each (uncoalesced, as a model would); the full step
// also reduces `dense-bytes` of dense gradients (allreduce; through the parameter server
// too under the ps route, as Parallax's PS mode). Runs on tools/px-cluster netns links.
// Reported per route: the sparse part's step time (pull + push) and the full step's (each
// step's time is its slowest worker's, over every node; median, min and max over steps), the
// payload each node sent for the table (daemon counters), the bytes its network interface
// sent (headers included), both divided by the route's theoretical volume computed from
// the measured unique rows, the full step against its busiest link's bytes / link rate, and
// the sparse part's link balance: the busiest node link direction's bytes over the mean of
// every node's (1.0: every link carries the same), from the interfaces' counters and from
// the daemons' payload counters.
// Peer in the same run: PyTorch gloo's sparse all_reduce of the same uncoalesced
// per-worker gradients (tools/bench/gloo_sparse.py), timed the same way.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "tools/bench_common.h"

namespace pxbench {
namespace {

struct SparseShapeArgs {
  uint64_t rows = 800000, dim = 128, lookups = 8192, dense_bytes = 25000000;
  int steps = 6;
  uint32_t partitions = 0;  // 0: automatic
  double zipf = 1.0;
  uint32_t cache_rows = 65536;
};

// A route with a wire dtype: "hybrid-bf16", "alltoall-columns-f16"
// (px_sparse_options.wire_dtype: the table's rows and gradients cross nodes in 16 bits).
// Plain names are f32.
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
// "-prefetch" last ("ps-prefetch", "hybrid-bf16-prefetch"): px_sparse_options.prefetch, and
// each step's next pull issued before its push (px_prefetch_rows).
// "-boundedS" and "-cacheS" last of all: the table's consistency and hot-row cache.
// Returns the route without them; *bounded / *cache: S, or -1 where absent.
std::string without_consistency(const std::string& r, int* bounded = nullptr,
                                int* cache = nullptr) {
  std::string rest = r;
  int b = -1, c = -1;
  for (;;) {
    size_t dash = rest.rfind('-');
    if (dash == std::string::npos) break;
    std::string tail = rest.substr(dash + 1);
    size_t digits = tail.find_first_of("0123456789");
    if (digits == std::string::npos || digits == 0 ||
        tail.find_first_not_of("0123456789", digits) != std::string::npos)
      break;
    std::string word = tail.substr(0, digits);
    int value = std::stoi(tail.substr(digits));
    if (word == "bounded")
      b = value;
    else if (word == "cache")
      c = value;
    else
      break;
    rest = rest.substr(0, dash);
  }
  if (bounded) *bounded = b;
  if (cache) *cache = c;
  return rest;
}
bool prefetch_of(const std::string& r) {
  return ends_with(without_consistency(r), "-prefetch");
}
std::string without_prefetch(const std::string& raw) {
  std::string r = without_consistency(raw);
  return ends_with(r, "-prefetch") ? r.substr(0, r.size() - 9) : r;
}
int32_t wire_of(const std::string& raw) {
  std::string r = without_prefetch(raw);
  if (ends_with(r, "-bf16")) return PX_BF16;
  if (ends_with(r, "-f16")) return PX_F16;
  return PX_F32;
}
std::string base_route(const std::string& raw) {
  std::string r = without_prefetch(raw);
  return r.substr(0, r.size() - (wire_of(r) == PX_BF16 ? 5 : wire_of(r) == PX_F16 ? 4 : 0));
}

}  // namespace

// One worker: px-bench sparse-worker ROUTE ROWS DIM LOOKUPS DENSE_BYTES STEPS [PARTITIONS
// [ZIPF [CACHE_ROWS]]].
// Local rank 0 of every node prints "NODE {json}": its node's counters, and the step times
// (median, min, max over the steps of each step's slowest worker of the whole job, the same
// on every node).
int sparse_worker(int argc, char** argv) {
  if (argc < 6) die("usage: px-bench sparse-worker ROUTE ROWS DIM LOOKUPS DENSE_BYTES STEPS");
  std::string route = argv[0];
  SparseShapeArgs a;
  a.rows = std::stoull(argv[1]);
  a.dim = std::stoull(argv[2]);
  a.lookups = std::stoull(argv[3]);
  a.dense_bytes = std::stoull(argv[4]);
  a.steps = std::max(1, atoi(argv[5]));
  if (argc > 6) a.partitions = static_cast<uint32_t>(std::stoul(argv[6]));
  if (argc > 7) a.zipf = std::stod(argv[7]);
  if (argc > 8) a.cache_rows = static_cast<uint32_t>(std::stoul(argv[8]));
  uint64_t row_bytes = a.dim * sizeof(float);
  uint64_t dense_rows = (a.dense_bytes + row_bytes - 1) / row_bytes;
  bool dense_as_ps = base_route(route) == "ps";
  px_connect_options o;
  px_connect_options_init(&o);
  o.timeout_ms = 300000;
  uint64_t dense_buffer = dense_as_ps ? dense_rows * (row_bytes + 8) : a.dense_bytes;
  o.arena_bytes = a.lookups * (2 * row_bytes + 8) + 2 * dense_buffer + (64ull << 20);
  px_client* c = nullptr;
  check(px_connect(&o, &c), "px_connect");
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");

  px_sparse_options so;
  px_sparse_options_init(&so);
  so.learning_rate = 0.01;
  so.route = parse_route(base_route(route));
  so.alltoall_split = base_route(route) == "alltoall-columns" ? PX_SPLIT_COLUMNS : PX_SPLIT_ROWS;
  so.partitions = so.route == PX_ROUTE_ALLTOALL ? 0 : a.partitions;
  px_sparse_options table_options = so;  // the dense-as-ps table stays f32 on the wire
  table_options.wire_dtype = wire_of(route);
  bool prefetch = prefetch_of(route);
  table_options.prefetch = prefetch ? 1 : 0;
  int bounded = -1, cache = -1;
  without_consistency(route, &bounded, &cache);
  if (bounded >= 0) {
    table_options.consistency = PX_BOUNDED;
    table_options.staleness = static_cast<uint32_t>(bounded);
  }
  if (cache > 0) {
    table_options.cache_rows = a.cache_rows;
    table_options.cache_staleness = static_cast<uint32_t>(cache);
  }
  px_var* table = nullptr;
  check(px_register_sparse(c, "embedding", PX_F32, a.rows, a.dim, &table_options, &table),
        "register table");
  px_var* dense = nullptr;
  if (dense_as_ps) {
    check(px_register_sparse(c, "dense", PX_F32, dense_rows, a.dim, &so, &dense), "register dense");
  } else {
    check(px_register_dense(c, "dense", PX_F32, a.dense_bytes / 4, PX_SUM, &dense), "register");
  }
  void *idx_mem[2], *rows_mem, *grads_mem, *dense_mem, *dense_idx_mem = nullptr;
  for (auto& m : idx_mem) check(px_alloc(c, a.lookups * 8, &m), "px_alloc");
  check(px_alloc(c, a.lookups * row_bytes, &rows_mem), "px_alloc");
  check(px_alloc(c, a.lookups * row_bytes, &grads_mem), "px_alloc");
  check(px_alloc(c, dense_as_ps ? dense_rows * row_bytes : a.dense_bytes, &dense_mem), "px_alloc");
  auto* grads = static_cast<float*>(grads_mem);
  for (uint64_t i = 0; i < a.lookups * a.dim; ++i) grads[i] = 1e-3f * float(i % 7);
  std::memset(dense_mem, 0, dense_as_ps ? dense_rows * row_bytes : a.dense_bytes);
  auto* dense_idx = static_cast<int64_t*>(dense_idx_mem);
  if (dense_as_ps) {
    check(px_alloc(c, dense_rows * 8, &dense_idx_mem), "px_alloc");
    dense_idx = static_cast<int64_t*>(dense_idx_mem);
    for (uint64_t r = 0; r < dense_rows; ++r) dense_idx[r] = int64_t(r);
  }
  // Every batch is drawn before the first step (as the gloo peer does): sampling costs a few
  // ms of CPU per batch, and on this one machine a node sampling between steps would take
  // CPU from another node's step still in flight, which separate machines do not share.
  int cur = 0;  // idx_mem[cur]: the batch pulled last, pushed next
  auto idx = [&](int which) { return static_cast<int64_t*>(idx_mem[which]); };
  std::vector<std::vector<int64_t>> batches(1 + 2 * (1 + size_t(a.steps)));
  {
    Zipf zipf(a.rows, a.zipf);
    uint64_t rng = 0x9e3779b97f4a7c15ull * uint64_t(w.rank + 1);
    for (auto& b : batches) {
      b.resize(a.lookups);
      for (int64_t& row : b) row = zipf(rng);
    }
  }
  size_t next_batch = 0;
  auto draw_next = [&] {
    std::memcpy(idx(1 - cur), batches[next_batch++ % batches.size()].data(),
                a.lookups * sizeof(int64_t));
  };
  auto wait = [](px_request* r, const char* what) {
    check(px_wait(r, 600000), what);
    px_request_free(r);
  };
  // A step's communication: push batch cur's gradients and, without waiting for the push,
  // pull batch cur + 1's rows (in sync mode the daemons hold that pull until every node's
  // push is applied). full: the dense part too; the next batch's rows are prefetched while
  // the dense gradients are reduced, as a training loop would (the pull only needs the
  // table's push applied).
  auto pull = [&](int which, bool full) {
    px_request *r = nullptr, *d = nullptr;
    if (full && dense_as_ps)
      check(px_pull_rows(dense, dense_idx, dense_rows, dense_mem, &d), "pull dense");
    check(px_pull_rows(table, idx(which), a.lookups, rows_mem, &r), "pull");
    wait(r, "pull");
    if (d) wait(d, "pull dense");
  };
  auto step = [&](bool full) {
    px_request *r = nullptr, *d = nullptr, *ahead = nullptr;
    // Prefetch: the next batch's rows asked for before the push; those no node pulled in
    // this step come back while the push is under way.
    if (prefetch)
      check(px_prefetch_rows(table, idx(1 - cur), a.lookups, rows_mem, &ahead), "prefetch");
    check(px_push_rows(table, idx(cur), a.lookups, grads, &r), "push");
    if (full && dense_as_ps)
      check(px_push_rows(dense, dense_idx, dense_rows, dense_mem, &d), "push dense");
    else if (full)
      check(px_allreduce(dense, dense_mem, dense_mem, &d), "allreduce dense");
    if (ahead) {
      wait(ahead, "prefetch");
      if (full && dense_as_ps) {
        px_request* dp = nullptr;
        check(px_pull_rows(dense, dense_idx, dense_rows, dense_mem, &dp), "pull dense");
        wait(dp, "pull dense");
      }
    } else {
      pull(1 - cur, full);
    }
    wait(r, "push");
    if (d) wait(d, "dense");
    cur = 1 - cur;
  };
  struct Phase {
    std::vector<double> seconds;
    px_var_stats before{}, after{};
    std::pair<uint64_t, uint64_t> iface_before, iface_after;
  };
  auto run_phase = [&](bool full) {
    Phase p;
    draw_next();
    step(full);  // warm-up: connections, page faults, first touch of the shards
    // With automatic partitions the daemons time their first push steps to choose how many
    // requests a step makes: those steps are warm-up too. Every worker sees the same count
    // (it follows the push steps started, which a completed step fixes on every node).
    auto searching = [&] {
      if (stats_of(table).search_steps_left > 0) return true;
      return full && dense_as_ps && stats_of(dense).search_steps_left > 0;
    };
    for (int extra = 0; extra < 100 && searching(); ++extra) {
      draw_next();
      step(full);
    }
    // Its pull waited for every push so far to be applied (the replicated routes exchange a
    // push after it completed), so the counters now hold exactly the steps before.
    check(px_barrier(c, 600000), "px_barrier");
    p.before = stats_of(table);
    p.iface_before = iface_bytes();
    for (int s = 0; s < a.steps; ++s) {
      // Every node starts the timed step together, as the gloo peer does.
      draw_next();
      check(px_barrier(c, 600000), "px_barrier");
      double t0 = now_s();
      step(full);
      p.seconds.push_back(now_s() - t0);
    }
    // Once every node's last pull is served, every request of the timed steps has arrived
    // everywhere: the received counters stop depending on when each node reads them.
    check(px_barrier(c, 600000), "px_barrier");
    p.after = stats_of(table);
    p.iface_after = iface_bytes();
    return p;
  };
  draw_next();
  pull(1 - cur, false);
  cur = 1 - cur;
  Phase sparse = run_phase(false);
  Phase full = run_phase(true);
  // After the timed steps: each step's time becomes that of its slowest worker (every worker
  // on every node), as a synchronous step ends when its slowest rank does.
  std::vector<double> seconds = sparse.seconds;
  seconds.insert(seconds.end(), full.seconds.begin(), full.seconds.end());
  max_over_ranks(c, "timing", seconds);
  StepSummary sparse_t = summarize({seconds.begin(), seconds.begin() + a.steps});
  StepSummary full_t = summarize({seconds.begin() + a.steps, seconds.end()});
  if (w.local_rank == 0) {
    double n = a.steps;
    auto per_step = [n](uint64_t after, uint64_t before) { return double(after - before) / n; };
    printf(
        "NODE {\"node\":%d,\"sparse_step_s\":%.6f,\"sparse_step_min_s\":%.6f,"
        "\"sparse_step_max_s\":%.6f,\"step_s\":%.6f,\"step_min_s\":%.6f,\"step_max_s\":%.6f,"
        "\"rows_pulled\":%.1f,"
        "\"rows_unique\":%.1f,\"rows_applied\":%.1f,\"payload_sent\":%.1f,"
        "\"payload_received\":%.1f,\"iface_tx_sparse\":%.1f,\"iface_rx_sparse\":%.1f,"
        "\"iface_tx_full\":%.1f,\"iface_rx_full\":%.1f,\"request_partitions\":%llu}\n",
        w.node_index, sparse_t.median, sparse_t.min, sparse_t.max, full_t.median, full_t.min,
        full_t.max, per_step(sparse.after.rows_pulled, sparse.before.rows_pulled),
        per_step(sparse.after.rows_unique, sparse.before.rows_unique),
        per_step(sparse.after.rows_applied, sparse.before.rows_applied),
        per_step(sparse.after.bytes_sent, sparse.before.bytes_sent),
        per_step(sparse.after.bytes_received, sparse.before.bytes_received),
        per_step(sparse.iface_after.first, sparse.iface_before.first),
        per_step(sparse.iface_after.second, sparse.iface_before.second),
        per_step(full.iface_after.first, full.iface_before.first),
        per_step(full.iface_after.second, full.iface_before.second),
        static_cast<unsigned long long>(sparse.after.request_partitions));
    fflush(stdout);
  }
  check(px_barrier(c, 600000), "px_barrier");
  px_disconnect(c);
  return 0;
}

namespace {

// A JSON number, or null when there is none (NaN: a link-bound figure of unlimited links).
std::string json_or_null(double v, const char* format) {
  if (std::isnan(v)) return "null";
  char text[64];
  snprintf(text, sizeof text, format, v);
  return text;
}

// Theoretical payload a node sends per step under a route, from the measured unique rows
// per node U (its workers' union; a push coalesces to the same rows), with values of
// v bytes (4; 2 with a 16-bit wire dtype):
//   ps: pull requests 8 B and pushed rows 8 + v d for the rows other nodes own, and the
//       replies v d to other nodes' pulls of its own rows: U (N-1)/N (16 + 2 v d);
//   allgatherv: the ring forwards N-1 nodes' coalesced rows: (N-1) U (8 + 4d);
//   allreduce: 2 (N-1)/N of the densified table, V d 4 bytes;
//   alltoall-rows: as ps (one partition per node);
//   alltoall-columns: to every other node the U indices of its pull and of its push, the
//       push's d/N columns, and the replies' d/N columns of the others' pulls:
//       (N-1) U (16 + 2 v d/N).
double theoretical_sent(const std::string& route, int nodes, double unique, uint64_t rows,
                        uint64_t dim, double value_bytes = 4) {
  double n = nodes, d = double(dim);
  if (route == "alltoall-columns") return (n - 1) * unique * (16 + 2 * value_bytes * d / n);
  if (route == "allgatherv") return (n - 1) * unique * (8 + 4 * d);
  if (route == "allreduce") return 2 * (n - 1) / n * double(rows) * d * 4;
  return unique * (n - 1) / n * (16 + 2 * value_bytes * d);
}

// The share of a shaped link's rate that is TCP payload: per frame of MTU bytes, 52 bytes of
// IP and TCP headers (with timestamps) against 14 of Ethernet header that tbf counts.
double tcp_payload_share(int mtu) {
  return double(mtu - 52) / double(mtu + 14);
}

}  // namespace

int bench_sparse(int argc, char** argv) {
  bool json = false;
  std::string nodes_list = "2,4", routes = "hybrid,ps,allgatherv,allreduce", peers = "gloo";
  int per_node = 2;
  double link_gbit = 1;
  int mtu = 0;  // px-cluster's default (1500)
  SparseShapeArgs a;
  std::string daemon = tools_dir() + "/../daemon/parallaxd";
  parse_options(
      argc, argv,
      {{"--nodes", [&](const std::string& v) { nodes_list = v; }},
       {"--workers-per-node", [&](const std::string& v) { per_node = std::max(1, std::stoi(v)); }},
       {"--link-gbit", [&](const std::string& v) { link_gbit = std::stod(v); }},
       {"--mtu", [&](const std::string& v) { mtu = std::max(0, std::stoi(v)); }},
       {"--routes", [&](const std::string& v) { routes = v; }},
       {"--partitions",
        [&](const std::string& v) { a.partitions = static_cast<uint32_t>(std::stoul(v)); }},
       {"--steps", [&](const std::string& v) { a.steps = std::max(1, std::stoi(v)); }},
       {"--rows", [&](const std::string& v) { a.rows = std::stoull(v); }},
       {"--dim", [&](const std::string& v) { a.dim = std::stoull(v); }},
       {"--lookups", [&](const std::string& v) { a.lookups = std::stoull(v); }},
       {"--dense-bytes", [&](const std::string& v) { a.dense_bytes = std::stoull(v); }},
       {"--zipf", [&](const std::string& v) { a.zipf = std::stod(v); }},
       {"--cache-rows",
        [&](const std::string& v) { a.cache_rows = static_cast<uint32_t>(std::stoul(v)); }},
       {"--peers", [&](const std::string& v) { peers = v; }},
       {"--daemon", [&](const std::string& v) { daemon = v; }}},
      {{"--json", &json}});
  std::string source_tools = std::string(PX_SOURCE_DIR) + "/tools";
  // gloo_sparse.py draws Zipf(1.0) lookups only.
  if (peers.find("gloo") != std::string::npos && a.zipf != 1.0) {
    fprintf(stderr, "px-bench: the gloo peer draws Zipf(1.0) only; skipping it for --zipf %g\n",
            a.zipf);
    peers = "";
  }
  bool want_gloo = peers.find("gloo") != std::string::npos &&
                   system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") == 0;
  if (peers.find("gloo") != std::string::npos && !want_gloo)
    fprintf(stderr, "px-bench: /usr/bin/python3 cannot import torch; skipping gloo\n");
  char link_text[32];
  snprintf(link_text, sizeof link_text, "%g", link_gbit);
  double link_bytes_per_s = link_gbit * 1e9 / 8;
  if (json)
    printf(
        "{\"scenario\":\"sparse\",\"cores\":%u,\"link_gbit\":%s,\"rows\":%llu,\"dim\":%llu,"
        "\"lookups_per_worker\":%llu,\"dense_bytes\":%llu,\"workers_per_node\":%d,"
        "\"steps\":%d,\"partitions\":%u,\"mtu\":%d,\"zipf\":%g,\"timing\":\"%s\",\"results\":[",
        std::thread::hardware_concurrency(), link_text, (unsigned long long)a.rows,
        (unsigned long long)a.dim, (unsigned long long)a.lookups, (unsigned long long)a.dense_bytes,
        per_node, a.steps, a.partitions, mtu > 0 ? mtu : 1500, a.zipf, kTimingMethod);
  else
    printf("timing: %s; seconds: median (min-max) over steps\n", kTimingMethod);
  bool first = true;
  for (const std::string& n_text : split(nodes_list)) {
    int n = std::stoi(n_text);
    std::string base = source_tools + "/px-cluster --nodes " + n_text + " --workers-per-node " +
                       std::to_string(per_node) + " --mode netns --link-gbit " + link_text +
                       " --timeout 3000" + (mtu > 0 ? " --mtu " + std::to_string(mtu) : "");
    std::string shape = std::to_string(a.rows) + " " + std::to_string(a.dim) + " " +
                        std::to_string(a.lookups) + " " + std::to_string(a.dense_bytes) + " " +
                        std::to_string(a.steps);
    char zipf_text[32];
    snprintf(zipf_text, sizeof zipf_text, "%g", a.zipf);
    std::string worker_shape = shape + " " + std::to_string(a.partitions) + " " + zipf_text + " " +
                               std::to_string(a.cache_rows);
    for (const std::string& route : split(routes)) {
      std::string command = base + " --daemon " + daemon + " -- " + tools_dir() +
                            "/px-bench sparse-worker " + route + " " + worker_shape;
      std::vector<std::string> node_json = node_lines(command, n, "route " + route);
      if (node_json.empty()) continue;
      // Step times are already per-step maxima over every worker of the job (each node
      // prints the same); the max over nodes only guards against a node disagreeing.
      StepSummary step_t, sparse_t;
      double unique = 0, pulled = 0, sent = 0, tx_sparse = 0, busiest = 0;
      // The sparse part's per-link bytes: each node's link, each direction.
      double link_max = 0, link_sum = 0;
      // ... and the table's payload each node sent and received (daemon counters: no TCP
      // acknowledgements or retransmissions in them).
      double payload_max = 0, payload_sum = 0;
      std::vector<std::string> chosen;  // each node's request partitions
      for (const std::string& j : node_json) {
        auto widen = [&j](StepSummary& t, const std::string& key) {
          t.median = std::max(t.median, json_number(j, key + "_s"));
          t.min = std::max(t.min, json_number(j, key + "_min_s"));
          t.max = std::max(t.max, json_number(j, key + "_max_s"));
        };
        widen(step_t, "step");
        widen(sparse_t, "sparse_step");
        unique += json_number(j, "rows_unique") / n;
        pulled += json_number(j, "rows_pulled") / n;
        sent += json_number(j, "payload_sent") / n;
        tx_sparse += json_number(j, "iface_tx_sparse") / n;
        busiest =
            std::max({busiest, json_number(j, "iface_tx_full"), json_number(j, "iface_rx_full")});
        double tx = json_number(j, "iface_tx_sparse"), rx = json_number(j, "iface_rx_sparse");
        link_max = std::max({link_max, tx, rx});
        link_sum += tx + rx;
        double out = json_number(j, "payload_sent"), in = json_number(j, "payload_received");
        payload_max = std::max({payload_max, out, in});
        payload_sum += out + in;
        chosen.push_back(
            std::to_string(static_cast<long long>(json_number(j, "request_partitions"))));
      }
      // "16" when every node chose alike, else each node's: "16/8/16/16".
      std::string partitions = chosen[0];
      if (std::count(chosen.begin(), chosen.end(), chosen[0]) != n)
        for (size_t i = 1; i < chosen.size(); ++i) partitions += "/" + chosen[i];
      std::string plain = base_route(route);
      bool wire16 = wire_of(route) != PX_F32;
      double theory = theoretical_sent(plain, n, unique, a.rows, a.dim, wire16 ? 2 : 4);
      // The time the f32 volume of this route takes at the links' TCP payload ceiling: the
      // floor a 16-bit wire is measured against (the "fp32 wire floor").
      double f32_floor = theoretical_sent(plain, n, unique, a.rows, a.dim) /
                         (link_bytes_per_s * tcp_payload_share(mtu > 0 ? mtu : 1500));
      double alpha = pulled / per_node / double(a.rows);
      double link_bound = busiest / link_bytes_per_s;
      double link_balance = link_sum > 0 ? link_max / (link_sum / (2.0 * n)) : 0;
      double payload_balance = payload_sum > 0 ? payload_max / (payload_sum / (2.0 * n)) : 0;
      double step = step_t.median, sparse_step = sparse_t.median;
      // Figures against the link rate: none on links without a limit (--link-gbit 0).
      auto bound = [&](double v) { return link_gbit > 0 ? v : std::nan(""); };
      if (json) {
        printf(
            "%s{\"system\":\"parallax\",\"route\":\"%s\",\"nodes\":%d,\"step_s\":%.4f,"
            "\"step_min_s\":%.4f,\"step_max_s\":%.4f,\"sparse_step_s\":%.4f,"
            "\"sparse_step_min_s\":%.4f,\"sparse_step_max_s\":%.4f,\"alpha\":%.6f,"
            "\"unique_rows_per_node\":%.0f,"
            "\"payload_sent_per_node\":%.0f,\"wire_tx_sparse_per_node\":%.0f,"
            "\"theoretical_sent_per_node\":%.0f,\"payload_over_theory\":%.3f,"
            "\"wire_over_theory\":%.3f,\"busiest_link_bytes\":%.0f,"
            "\"step_over_link_bound\":%s,\"request_partitions\":\"%s\","
            "\"sparse_link_max_over_mean\":%.3f,\"sparse_payload_max_over_mean\":%.3f,"
            "\"f32_wire_floor_s\":%s,\"sparse_over_f32_floor\":%s}",
            first ? "" : ",", route.c_str(), n, step, step_t.min, step_t.max, sparse_step,
            sparse_t.min, sparse_t.max, alpha, unique, sent, tx_sparse, theory, sent / theory,
            tx_sparse / theory, busiest, json_or_null(bound(step / link_bound), "%.3f").c_str(),
            partitions.c_str(), link_balance, payload_balance,
            json_or_null(bound(f32_floor), "%.4f").c_str(),
            json_or_null(bound(sparse_step / f32_floor), "%.3f").c_str());
        first = false;
      } else {
        printf(
            "%-10s N=%d step %.3f s (%.3f-%.3f)  sparse %.3f s (%.3f-%.3f)  alpha %.5f  "
            "unique/node %.0f  sent/node %.2f MB (wire %.2f MB, theory %.2f MB: x%.2f / x%.2f)  "
            "step / link bound %.2f  P %s  sparse link max/mean %.3f (payload %.3f)  "
            "sparse / f32 floor %.2f\n",
            route.c_str(), n, step, step_t.min, step_t.max, sparse_step, sparse_t.min, sparse_t.max,
            alpha, unique, sent / 1e6, tx_sparse / 1e6, theory / 1e6, sent / theory,
            tx_sparse / theory, step / link_bound, partitions.c_str(), link_balance,
            payload_balance, sparse_step / f32_floor);
      }
      fflush(stdout);
    }
    if (want_gloo) {
      std::string command = base + " --no-daemons -- /usr/bin/python3 " + source_tools +
                            "/bench/gloo_sparse.py " + shape + " 2>/tmp/px-bench-last.err";
      FILE* p = popen(command.c_str(), "r");
      char line[512];
      StepSummary t;  // per-step maxima over every rank, computed by gloo_sparse.py's rank 0
      while (p && fgets(line, sizeof line, p))
        sscanf(line, "RESULT gloo-sparse %lf %lf %lf", &t.median, &t.min, &t.max);
      if (p) pclose(p);
      if (t.median <= 0) {
        fprintf(stderr, "px-bench: gloo sparse on %d nodes failed\n", n);
      } else if (json) {
        printf(
            "%s{\"system\":\"gloo\",\"route\":\"sparse-allreduce\",\"nodes\":%d,"
            "\"sparse_step_s\":%.4f,\"sparse_step_min_s\":%.4f,\"sparse_step_max_s\":%.4f}",
            first ? "" : ",", n, t.median, t.min, t.max);
        first = false;
      } else {
        printf("gloo       N=%d sparse all_reduce %.3f s (%.3f-%.3f)\n", n, t.median, t.min, t.max);
      }
      fflush(stdout);
    }
  }
  if (json) printf("]}\n");
  return 0;
}

}  // namespace pxbench
