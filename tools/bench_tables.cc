// px-bench tables: a DLRM-shaped sparse step over 26 tables, as separate variables and as
// one table group (ABI 1.12), on the same cluster.
//
//   px-bench tables [--json] [--nodes 4] [--workers-per-node 2] [--link-gbit 1]
//                   [--modes layers,concurrent,group] [--steps 20] [--batch 256] [--dim 16]
//                   [--max-rows 100000] [--route ps] [--zipf 1.0] [--daemon PATH]
//
// The tables have Criteo's 26 categorical cardinalities (Kaggle display-advertising set),
// each capped at --max-rows to fit this machine; 29 features, three tables taking two each
// (user history beside the candidate, as DIN and DLRM variants do). Each worker looks up
// --batch ids per feature, Zipf(S) within its table, and a step pulls them and pushes a
// gradient for each. Modes:
//   layers      one variable per table, the way a model of per-table layers
//               (parallax.torch.Embedding) steps: each table's pull waited in turn (a
//               layer's forward needs its rows), then every push issued and waited;
//   concurrent  one variable per table, every pull issued, then waited, then every push: the
//               most a per-table client can overlap;
//   group       one px_register_sparse_group of the 26 tables: one grouped pull, one
//               grouped push (parallax.torch.EmbeddingBagCollection's step).
// Reported per mode: the step (each step's time is its slowest worker's, over every node;
// median, min and max over steps), the daemon's requests per step per node (the table
// variables' request_partitions, a pull and a push step each), and each node's interface
// packets and bytes sent per step (tools/px-cluster's netns links).
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench_common.h"

namespace pxbench {
namespace {

// Criteo Kaggle's 26 categorical features' cardinalities (C1..C26).
const uint64_t kCriteoRows[26] = {1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
                                  93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
                                  2173,  4,    7046547,  18,      15,  286181, 105,     142572};
// Tables taking a second feature (the three largest).
const int kSecondFeature[3] = {2, 11, 20};

struct Shape {
  uint64_t batch = 256, dim = 16, max_rows = 100000;
  int steps = 20;
  std::string route = "ps";
  double zipf = 1.0;
};

// The tables' rows and each table's features (1 or 2).
std::vector<uint64_t> table_rows(const Shape& s) {
  std::vector<uint64_t> rows;
  for (uint64_t r : kCriteoRows) rows.push_back(std::min(r, s.max_rows));
  return rows;
}
int features_of(int table) {
  for (int t : kSecondFeature)
    if (t == table) return 2;
  return 1;
}

}  // namespace

int tables_worker(int argc, char** argv) {
  if (argc < 7) die("usage: px-bench tables-worker MODE BATCH DIM MAX_ROWS STEPS ROUTE ZIPF");
  std::string mode = argv[0];
  Shape s;
  s.batch = std::stoull(argv[1]);
  s.dim = std::stoull(argv[2]);
  s.max_rows = std::stoull(argv[3]);
  s.steps = std::max(1, atoi(argv[4]));
  s.route = argv[5];
  s.zipf = std::stod(argv[6]);
  std::vector<uint64_t> rows = table_rows(s);
  const int tables = int(rows.size());
  uint64_t lookups = 0;  // this worker's per step, every feature
  std::vector<uint64_t> table_lookups(tables);
  for (int t = 0; t < tables; ++t) lookups += table_lookups[t] = s.batch * features_of(t);
  px_connect_options o;
  px_connect_options_init(&o);
  o.timeout_ms = 300000;
  o.arena_bytes = 2 * lookups * (s.dim * 4 + 8) + (64ull << 20);
  px_client* c = nullptr;
  check(px_connect(&o, &c), "px_connect");
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  px_sparse_options so;
  px_sparse_options_init(&so);
  so.learning_rate = 0.01;
  so.route = parse_route(s.route);
  // Every table as a variable of its own (layers, concurrent) or of one group.
  std::vector<px_var*> vars(tables, nullptr);
  px_var* group = nullptr;
  bool grouped = mode == "group";
  if (grouped) {
    std::vector<std::string> names;
    for (int t = 0; t < tables; ++t) names.push_back("C" + std::to_string(t + 1));
    std::vector<const char*> name_ptrs;
    for (auto& n : names) name_ptrs.push_back(n.c_str());
    check(px_register_sparse_group(c, "dlrm", PX_F32, uint64_t(tables), name_ptrs.data(),
                                   rows.data(), s.dim, &so, &group, vars.data()),
          "px_register_sparse_group");
  } else if (mode == "layers" || mode == "concurrent") {
    for (int t = 0; t < tables; ++t)
      check(px_register_sparse(c, ("C" + std::to_string(t + 1)).c_str(), PX_F32, rows[t], s.dim,
                               &so, &vars[t]),
            "px_register_sparse");
  } else {
    die("px-bench tables-worker: mode " + mode + " (layers, concurrent, group)");
  }
  // Batches drawn before the first step (8, cycled), each table's ids one feature after
  // another, in arena memory: ids[b] holds every table's, table t's from offset[t].
  std::vector<uint64_t> offset(tables + 1, 0);
  for (int t = 0; t < tables; ++t) offset[t + 1] = offset[t] + table_lookups[t];
  constexpr int kBatches = 8;
  std::vector<int64_t*> ids(kBatches);
  {
    std::vector<Zipf> zipf;
    for (uint64_t r : rows) zipf.emplace_back(r, s.zipf);
    uint64_t rng = 0x9e3779b97f4a7c15ull * uint64_t(w.rank + 1);
    for (auto& b : ids) {
      void* mem = nullptr;
      check(px_alloc(c, lookups * 8, &mem), "px_alloc");
      b = static_cast<int64_t*>(mem);
      for (int t = 0; t < tables; ++t)
        for (uint64_t j = 0; j < table_lookups[t]; ++j) b[offset[t] + j] = zipf[size_t(t)](rng);
    }
  }
  void *rows_mem = nullptr, *grads_mem = nullptr;
  check(px_alloc(c, lookups * s.dim * 4, &rows_mem), "px_alloc");
  check(px_alloc(c, lookups * s.dim * 4, &grads_mem), "px_alloc");
  auto* grads = static_cast<float*>(grads_mem);
  for (uint64_t i = 0; i < lookups * s.dim; ++i) grads[i] = 1e-3f * float(i % 7);
  auto* out = static_cast<float*>(rows_mem);
  auto wait = [](px_request* r, const char* what) {
    check(px_wait(r, 600000), what);
    px_request_free(r);
  };
  int next = 0;
  auto step = [&] {
    const int64_t* b = ids[size_t(next++ % kBatches)];
    if (grouped) {
      px_request* r = nullptr;
      check(px_pull_rows_group(vars.data(), uint64_t(tables), table_lookups.data(), b, out, nullptr,
                               &r),
            "px_pull_rows_group");
      wait(r, "grouped pull");
      check(px_push_rows_group(vars.data(), uint64_t(tables), table_lookups.data(), b, grads,
                               nullptr, &r),
            "px_push_rows_group");
      wait(r, "grouped push");
      return;
    }
    std::vector<px_request*> reqs(tables, nullptr);
    for (int t = 0; t < tables; ++t) {
      check(
          px_pull_rows(vars[t], b + offset[t], table_lookups[t], out + offset[t] * s.dim, &reqs[t]),
          "px_pull_rows");
      if (mode == "layers") wait(reqs[t], "pull");
    }
    if (mode == "concurrent")
      for (px_request* r : reqs) wait(r, "pull");
    for (int t = 0; t < tables; ++t)
      check(px_push_rows(vars[t], b + offset[t], table_lookups[t], grads + offset[t] * s.dim,
                         &reqs[t]),
            "px_push_rows");
    for (px_request* r : reqs) wait(r, "push");
  };
  // Warm-up: connections, first touch, and the automatic partition searches.
  auto searching = [&] {
    for (int t = 0; t < (grouped ? 1 : tables); ++t)
      if (stats_of(vars[t]).search_steps_left > 0) return true;
    return false;
  };
  step();
  for (int extra = 0; extra < 100 && searching(); ++extra) step();
  check(px_barrier(c, 600000), "px_barrier");
  uint64_t requests = 0;  // per pull (or push) step, every variable
  for (int t = 0; t < (grouped ? 1 : tables); ++t) requests += stats_of(vars[t]).request_partitions;
  IfaceCounters before = iface_counters();
  std::vector<double> seconds;
  for (int k = 0; k < s.steps; ++k) {
    check(px_barrier(c, 600000), "px_barrier");
    double t0 = now_s();
    step();
    seconds.push_back(now_s() - t0);
  }
  check(px_barrier(c, 600000), "px_barrier");
  IfaceCounters after = iface_counters();
  max_over_ranks(c, "timing", seconds);
  StepSummary t = summarize(seconds);
  if (w.local_rank == 0) {
    // The barriers' packets are in the counters too: a few per step, in every mode alike.
    double n = s.steps;
    printf(
        "NODE {\"node\":%d,\"step_s\":%.6f,\"step_min_s\":%.6f,\"step_max_s\":%.6f,"
        "\"requests_per_step\":%llu,\"tx_packets\":%.1f,\"rx_packets\":%.1f,"
        "\"tx_bytes\":%.1f,\"rx_bytes\":%.1f}\n",
        w.node_index, t.median, t.min, t.max, static_cast<unsigned long long>(2 * requests),
        double(after.tx_packets - before.tx_packets) / n,
        double(after.rx_packets - before.rx_packets) / n,
        double(after.tx_bytes - before.tx_bytes) / n, double(after.rx_bytes - before.rx_bytes) / n);
    fflush(stdout);
  }
  check(px_barrier(c, 600000), "px_barrier");
  px_disconnect(c);
  return 0;
}

int bench_tables(int argc, char** argv) {
  bool json = false;
  std::string nodes_text = "4", modes = "layers,concurrent,group";
  int per_node = 2;
  double link_gbit = 1;
  Shape s;
  std::string daemon = tools_dir() + "/../daemon/parallaxd";
  parse_options(
      argc, argv,
      {{"--nodes", [&](const std::string& v) { nodes_text = v; }},
       {"--workers-per-node", [&](const std::string& v) { per_node = std::max(1, std::stoi(v)); }},
       {"--link-gbit", [&](const std::string& v) { link_gbit = std::stod(v); }},
       {"--modes", [&](const std::string& v) { modes = v; }},
       {"--steps", [&](const std::string& v) { s.steps = std::max(1, std::stoi(v)); }},
       {"--batch", [&](const std::string& v) { s.batch = std::stoull(v); }},
       {"--dim", [&](const std::string& v) { s.dim = std::stoull(v); }},
       {"--max-rows", [&](const std::string& v) { s.max_rows = std::stoull(v); }},
       {"--route", [&](const std::string& v) { s.route = v; }},
       {"--zipf", [&](const std::string& v) { s.zipf = std::stod(v); }},
       {"--daemon", [&](const std::string& v) { daemon = v; }}},
      {{"--json", &json}});
  parse_route(s.route);  // refused here, before any cluster starts
  int nodes = std::stoi(nodes_text);
  uint64_t total_rows = 0;
  for (uint64_t r : table_rows(s)) total_rows += r;
  char link_text[32], zipf_text[32];
  snprintf(link_text, sizeof link_text, "%g", link_gbit);
  snprintf(zipf_text, sizeof zipf_text, "%g", s.zipf);
  if (json)
    printf(
        "{\"scenario\":\"tables\",\"cores\":%u,\"link_gbit\":%s,\"nodes\":%d,"
        "\"workers_per_node\":%d,\"tables\":26,\"features\":29,\"rows\":%llu,\"dim\":%llu,"
        "\"batch\":%llu,\"steps\":%d,\"route\":\"%s\",\"zipf\":%s,\"timing\":\"%s\","
        "\"results\":[",
        std::thread::hardware_concurrency(), link_text, nodes, per_node,
        (unsigned long long)total_rows, (unsigned long long)s.dim, (unsigned long long)s.batch,
        s.steps, s.route.c_str(), zipf_text, kTimingMethod);
  else
    printf("timing: %s; seconds: median (min-max) over steps\n", kTimingMethod);
  std::string base = std::string(PX_SOURCE_DIR) + "/tools/px-cluster --nodes " + nodes_text +
                     " --workers-per-node " + std::to_string(per_node) +
                     " --mode netns --link-gbit " + link_text + " --timeout 3000";
  bool first = true;
  for (const std::string& mode : split(modes)) {
    std::string command = base + " --daemon " + daemon + " -- " + tools_dir() +
                          "/px-bench tables-worker " + mode + " " + std::to_string(s.batch) + " " +
                          std::to_string(s.dim) + " " + std::to_string(s.max_rows) + " " +
                          std::to_string(s.steps) + " " + s.route + " " + zipf_text;
    std::vector<std::string> node_json = node_lines(command, nodes, "mode " + mode);
    if (node_json.empty()) continue;
    StepSummary t;
    double requests = 0, tx_packets = 0, tx_bytes = 0;
    for (const std::string& j : node_json) {  // each node prints the same step times
      t.median = std::max(t.median, json_number(j, "step_s"));
      t.min = std::max(t.min, json_number(j, "step_min_s"));
      t.max = std::max(t.max, json_number(j, "step_max_s"));
      requests += json_number(j, "requests_per_step") / nodes;
      tx_packets += json_number(j, "tx_packets") / nodes;
      tx_bytes += json_number(j, "tx_bytes") / nodes;
    }
    if (json)
      printf(
          "%s{\"mode\":\"%s\",\"step_s\":%.4f,\"step_min_s\":%.4f,\"step_max_s\":%.4f,"
          "\"requests_per_step_per_node\":%.1f,\"tx_packets_per_step_per_node\":%.1f,"
          "\"tx_bytes_per_step_per_node\":%.0f}",
          first ? "" : ",", mode.c_str(), t.median, t.min, t.max, requests, tx_packets, tx_bytes);
    else
      printf(
          "%-10s step %.4f (%.4f-%.4f) s, %.0f requests, %.0f packets, %.0f bytes sent "
          "per step per node\n",
          mode.c_str(), t.median, t.min, t.max, requests, tx_packets, tx_bytes);
    fflush(stdout);
    first = false;
  }
  if (json) printf("]}\n");
  return 0;
}

}  // namespace pxbench
