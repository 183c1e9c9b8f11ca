// Helpers shared by px-bench's scenarios.
#pragma once

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "parallax_c.h"

namespace pxbench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] inline void die(const std::string& what) {
  fprintf(stderr, "px-bench: %s\n", what.c_str());
  exit(1);
}

inline void check(px_status s, const char* what) {
  if (s != PX_OK) die(std::string(what) + ": " + px_strerror(s) + ": " + px_last_error());
}

inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// How every system in `px-bench allreduce` and `px-bench sparse` is timed (the JSON's
// "timing"): a synchronous step ends when its slowest rank does, so each step's time is the
// maximum over all ranks (every worker on every node) of that rank's time for the step;
// reported are the median of those per-step maxima and their min and max.
inline constexpr const char* kTimingMethod = "per-step max over ranks, median over steps";

// Median, min and max of per-step times (here: per-step maxima over ranks).
struct StepSummary {
  double median = 0, min = 0, max = 0;
};

inline StepSummary summarize(const std::vector<double>& steps) {
  if (steps.empty()) return {};
  return {percentile(steps, 0.5), *std::min_element(steps.begin(), steps.end()),
          *std::max_element(steps.begin(), steps.end())};
}

// Replaces each worker's per-step seconds by the maximum over every worker of the job (all
// nodes) for that step: an f64 PX_MAX allreduce of a variable `name` of seconds.size()
// elements, after the timed steps. Every worker must call it with the same name and count.
inline void max_over_ranks(px_client* c, const std::string& name, std::vector<double>& seconds) {
  px_var* var = nullptr;
  check(px_register_dense(c, name.c_str(), PX_F64, seconds.size(), PX_MAX, &var),
        "register timing");
  px_request* r = nullptr;
  check(px_allreduce(var, seconds.data(), seconds.data(), &r), "allreduce timing");
  check(px_wait(r, 600000), "wait timing");
  px_request_free(r);
}

// The folder of this executable (the build's tools/).
inline std::string tools_dir() {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return ".";
  self[n] = '\0';
  std::string path(self);
  return path.substr(0, path.rfind('/'));
}

inline std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    if (comma > at) out.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// Zipf(s) over [0, rows): P(k) proportional to 1 / (k + 1)^s.
class Zipf {
 public:
  Zipf(uint64_t rows, double s) : cdf_(rows) {
    double sum = 0;
    for (uint64_t k = 0; k < rows; ++k) cdf_[k] = sum += std::pow(double(k + 1), -s);
    for (double& c : cdf_) c /= sum;
  }
  int64_t operator()(uint64_t& state) const {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    double u = double(state >> 11) / 9007199254740992.0;
    return int64_t(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

// This network namespace's counters of the interface PX_CLUSTER_IFACE names (tools/px-cluster
// sets it; /proc/net/dev follows the netns): bytes and packets, each way. Zeros elsewhere.
struct IfaceCounters {
  uint64_t tx_bytes = 0, rx_bytes = 0, tx_packets = 0, rx_packets = 0;
};

inline IfaceCounters iface_counters() {
  const char* iface = getenv("PX_CLUSTER_IFACE");
  std::ifstream dev("/proc/net/dev");
  std::string line;
  while (std::getline(dev, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (!iface || name != iface) continue;
    std::istringstream fields(line.substr(colon + 1));
    uint64_t v[16] = {0};
    for (auto& x : v) fields >> x;
    return {v[8], v[0], v[9], v[1]};
  }
  return {};
}

// This network namespace's interface bytes: (sent, received).
inline std::pair<uint64_t, uint64_t> iface_bytes() {
  IfaceCounters c = iface_counters();
  return {c.tx_bytes, c.rx_bytes};
}

inline px_var_stats stats_of(px_var* var) {
  px_var_stats s{};
  s.struct_size = sizeof s;
  check(px_var_stats_get(var, &s), "px_var_stats_get");
  return s;
}

// A number from a flat JSON object a worker printed (0 when the key is absent).
inline double json_number(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return 0;
  return std::stod(json.substr(at + key.size() + 3));
}

// A sparse route by its px-bench name ("alltoall-rows" and "alltoall-columns" are alltoall,
// split as named); an unknown name ends the program.
inline px_route parse_route(const std::string& r) {
  if (r == "alltoall-rows" || r == "alltoall-columns" || r == "alltoall") return PX_ROUTE_ALLTOALL;
  if (r == "ps") return PX_ROUTE_PS;
  if (r == "allgatherv") return PX_ROUTE_ALLGATHERV;
  if (r == "allreduce") return PX_ROUTE_ALLREDUCE;
  if (r == "hybrid") return PX_ROUTE_HYBRID;
  if (r == "auto") return PX_ROUTE_AUTO;
  die("unknown route " + r);
}

// A scenario's options: `--name VALUE`, each given to its setter, and `--switch`es, each
// setting its bool. An unknown option, or one without its value, ends the program.
using OptionSetters = std::map<std::string, std::function<void(const std::string&)>>;
inline void parse_options(int argc, char** argv, const OptionSetters& values,
                          const std::map<std::string, bool*>& switches) {
  for (int i = 0; i < argc; ++i) {
    std::string o = argv[i];
    if (auto s = switches.find(o); s != switches.end()) {
      *s->second = true;
    } else if (auto v = values.find(o); v != values.end()) {
      if (i + 1 >= argc) die("missing value for " + o);
      v->second(argv[++i]);
    } else {
      die("unknown option " + o);
    }
  }
}

// Runs a tools/px-cluster command whose workers print "NODE {json}" (local rank 0 of each
// node): those lines' JSON, or nothing when it failed or not `nodes` of them came (then
// says so, naming `what`; the workers' stderr is in /tmp/px-bench-last.err).
inline std::vector<std::string> node_lines(const std::string& command, int nodes,
                                           const std::string& what) {
  FILE* p = popen((command + " 2>/tmp/px-bench-last.err").c_str(), "r");
  std::vector<std::string> lines;
  char line[4096];
  while (p && fgets(line, sizeof line, p))
    if (strncmp(line, "NODE ", 5) == 0) lines.emplace_back(line + 5);
  if (!p || pclose(p) != 0 || lines.size() != size_t(nodes)) {
    fprintf(stderr, "px-bench: %s on %d nodes failed (see /tmp/px-bench-last.err)\n", what.c_str(),
            nodes);
    return {};
  }
  return lines;
}

// px-bench sparse (bench_sparse.cc): argv after the scenario name.
int bench_sparse(int argc, char** argv);
int sparse_worker(int argc, char** argv);
// px-bench tables (bench_tables.cc).
int bench_tables(int argc, char** argv);
int tables_worker(int argc, char** argv);

}  // namespace pxbench
