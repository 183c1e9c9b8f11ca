// px-bench: Parallax benchmarks. Each scenario prints one JSON object with --json.
//
//   px-bench local [--json] [--daemon PATH] [--iterations N]
//     4 KiB allreduce round trip between 2 workers (median, p99), 64 MiB allreduce across
//     2 and 4 workers (GB/s of algorithm bandwidth), and single-thread memcpy bandwidth
//     measured in the same run for reference.
//
//   px-bench allreduce [--json] [--nodes 2,4] [--links 1,5,0,lo] [--sizes B,B,...]
//                      [--iterations N] [--peers mpi,gloo] [--workers-per-node W]
//                      [--wire f32,bf16,f16] [--daemon PATH]
//     Bus bandwidth (algbw x 2(N-1)/N, N = nodes) of a dense f32 allreduce across N
//     daemons with W workers each (once per --wire: the variable's px_dense_options
//     wire_dtype, system "parallax-bf16" etc.), through tools/px-cluster: netns links of X Gbit/s
//     (0: unlimited) or plain loopback ("lo"). Open MPI and PyTorch gloo run on the same
//     links with W ranks per node (N x W ranks in all). Every system is timed alike: an
//     iteration's time is its slowest rank's, reported as the median (min, max) over
//     iterations.
//
//   px-bench sparse ...   (bench_sparse.cc)
//   px-bench tables ...   (bench_tables.cc)
//
//   px-bench torch-dense [--json] [--nodes 4] [--workers-per-node 1,2] [--links 1,0,lo]
//                        [--steps N] [--sleep-ms MS] [--model resnet50|lm] [--daemon PATH]
//                        [--peers ddp,ddp-parallax,ddp-copy,parallax-bf16,ddp-fp16-hook]
//     A many-tensor dense step (ResNet-50's 161 gradients, or the language model's dense
//     part; synthetic compute; tools/bench/torch_dense.py): parallax.torch's
//     DistributedDataParallel (parallax-bf16: with compression=bf16) and torch DDP on the
//     "parallax" backend (ddp-parallax) against torch DDP on gloo (ddp; ddp-fp16-hook: with
//     fp16_compress_hook), 25 MB buckets, synchronized and under no_sync() (compute alone).
//
//   px-bench lm [--json] [--nodes 2,4] [--link-gbit 1] ...   (tools/bench/lm.py)
//     The demo's language model at vocabulary 800,000 through Parallax and through torch
//     DDP with dense and with sparse embeddings: words/s, compute and exposed communication.
//
//   px-bench soak [--json] [--steps 10000] [--sample-at 1000] ...   (tools/bench/soak.py)
//     The demo's language model on 2 nodes x 2 workers for 10,000 steps: every daemon's RSS
//     and open fds at the end against their values at step 1,000 (target: within 2%).
//
//   px-bench faults [--json] [--faults 200] [--seed S] [--membership] [--partition]
//     (tests/integration/fault_suite.cc) Randomized faults on a 3-node cluster running
//     sparse and dense training (--membership: on a 3-member etcd it starts, with etcd
//     members killed among the faults; --partition: the same in network namespaces, with
//     a node's link taken down and healed among them, as root); every fault
//     must end in a clear error naming the right node and a re-formed cluster.
//
//   px-bench elastic-lm [--nodes 4] [--min-nodes 2] [--events 50]   (tools/bench/elastic_lm.py)
//     The demo's language model trained elastically on 4 nodes with membership on a
//     3-member etcd, under random events (nodes and the coordinator killed, nodes added,
//     etcd members killed): hangs, crashes, events the logs account for, perplexity.
//
//   px-bench gpu [--json] [--daemon PATH] [--iterations N]   (bench_gpu.cc; CUDA builds)
//     Device memory bandwidth, px_allreduce_ex of 256 MiB bf16 from 2 and 4 workers on one
//     GPU against it, 4 KiB device allreduce latency, GPU against host coalescing.
//
//   px-bench allreduce-worker SIZES ITERATIONS   (one worker, run by px-cluster)
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "parallax_c.h"
#include "tools/bench_common.h"
#include "tools/bench_local.h"

namespace {

using namespace pxbench;

// Single-thread memcpy of 64 MiB, median of several runs, in GB/s (10^9 bytes/s).
double memcpy_gbps() {
  const size_t bytes = 64ull << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> rates;
  for (int i = 0; i < 12; ++i) {
    double t0 = now_s();
    std::memcpy(b.data(), a.data(), bytes);
    double t = now_s() - t0;
    if (i >= 2) rates.push_back(static_cast<double>(bytes) / t / 1e9);
    a[static_cast<size_t>(i)] = b[static_cast<size_t>(i) + 1];  // keep the copies observable
  }
  return percentile(rates, 0.5);
}

// Round trip of a bare eventfd ping-pong between two processes (two wake-ups), in us: the
// floor under any doorbell-driven round trip on this machine, measured for reference.
std::vector<double> eventfd_ping_pong(int iterations) {
  int ping = eventfd(0, EFD_CLOEXEC), pong = eventfd(0, EFD_CLOEXEC);
  uint64_t one = 1, value = 0;
  auto wait_and_read = [&](int fd) {
    pollfd p{fd, POLLIN, 0};
    while (poll(&p, 1, -1) < 0) {
    }
    if (read(fd, &value, sizeof value) != sizeof value) die("eventfd read");
  };
  pid_t child = fork();
  if (child == 0) {
    for (int i = 0; i < iterations + 100; ++i) {
      wait_and_read(ping);
      if (write(pong, &one, sizeof one) != sizeof one) _exit(1);
    }
    _exit(0);
  }
  std::vector<double> us;
  for (int i = 0; i < iterations + 100; ++i) {
    double t0 = now_s();
    if (write(ping, &one, sizeof one) != sizeof one) die("eventfd write");
    wait_and_read(pong);
    if (i >= 100) us.push_back((now_s() - t0) * 1e6);
  }
  waitpid(child, nullptr, 0);
  close(ping);
  close(pong);
  return us;
}

// Round trip of one small allreduce (submit to completion) as seen by rank 0, in us.
std::vector<double> round_trips(const Daemon& d, int iterations) {
  return run_workers(2, [&](int rank) {
    px_client* c = connect_worker(d, "rtt", rank, 2);
    px_var* var = nullptr;
    check(px_register_dense(c, "rtt4k", PX_F32, 1024, PX_SUM, &var), "register");
    void* buf = nullptr;
    check(px_alloc(c, 4096, &buf), "px_alloc");
    std::memset(buf, 0, 4096);
    std::vector<double> us = timed_allreduces(c, var, buf, 200, iterations, false);
    for (double& t : us) t *= 1e6;
    px_disconnect(c);
    return us;
  });
}

// Seconds per 64 MiB allreduce (barrier-aligned), as seen by rank 0.
std::vector<double> big_allreduce(const Daemon& d, int workers, bool arena, int iterations) {
  const uint64_t count = 16ull << 20;  // f32: 64 MiB
  std::string job = "big" + std::to_string(workers) + (arena ? "a" : "o");
  return run_workers(workers, [&](int rank) {
    px_client* c = connect_worker(d, job, rank, workers);
    px_var* var = nullptr;
    check(px_register_dense(c, "big", PX_F32, count, PX_SUM, &var), "register");
    void* arena_buf = nullptr;
    std::vector<float> plain;
    float* buf;
    if (arena) {
      check(px_alloc(c, count * 4, &arena_buf), "px_alloc");
      buf = static_cast<float*>(arena_buf);
    } else {
      plain.resize(count);
      buf = plain.data();
    }
    for (uint64_t i = 0; i < count; ++i) buf[i] = 1.0f;
    std::vector<double> seconds = timed_allreduces(c, var, buf, 2, iterations);
    px_disconnect(c);
    return seconds;
  });
}

int bench_local(bool json, const std::string& daemon_path, int iterations) {
  double memcpy_rate = memcpy_gbps();
  std::vector<double> floor_us = eventfd_ping_pong(iterations);
  Daemon daemon;
  start_daemon(daemon, daemon_path);
  std::vector<double> rtt = round_trips(daemon, iterations);
  struct Row {
    int workers;
    const char* memory;
    double gbps;
  };
  std::vector<Row> rows;
  for (int workers : {2, 4}) {
    for (bool arena : {true, false}) {
      std::vector<double> t = big_allreduce(daemon, workers, arena, 8);
      rows.push_back(
          {workers, arena ? "arena" : "ordinary", (64.0 * 1048576.0) / percentile(t, 0.5) / 1e9});
    }
  }
  double median = percentile(rtt, 0.5), p99 = percentile(rtt, 0.99);
  if (json) {
    printf("{\"scenario\":\"local\",\"cores\":%u,\"memcpy_gbps\":%.3f,",
           std::thread::hardware_concurrency(), memcpy_rate);
    printf("\"rtt_4k_2_workers_us\":{\"median\":%.2f,\"p99\":%.2f,\"samples\":%zu},", median, p99,
           rtt.size());
    printf("\"eventfd_ping_pong_us\":{\"median\":%.2f,\"p99\":%.2f},", percentile(floor_us, 0.5),
           percentile(floor_us, 0.99));
    printf("\"allreduce_64mib\":[");
    for (size_t i = 0; i < rows.size(); ++i)
      printf("%s{\"workers\":%d,\"memory\":\"%s\",\"algbw_gbps\":%.3f,\"fraction_of_memcpy\":%.3f}",
             i ? "," : "", rows[i].workers, rows[i].memory, rows[i].gbps,
             rows[i].gbps / memcpy_rate);
    printf("]}\n");
  } else {
    printf("single-thread memcpy (64 MiB):     %.2f GB/s\n", memcpy_rate);
    printf("4 KiB allreduce round trip, 2 wk:  median %.1f us, p99 %.1f us (%zu samples)\n", median,
           p99, rtt.size());
    printf("eventfd ping-pong, 2 processes:    median %.1f us, p99 %.1f us (wake-up floor)\n",
           percentile(floor_us, 0.5), percentile(floor_us, 0.99));
    for (const Row& r : rows)
      printf("64 MiB allreduce, %d workers, %-8s %.2f GB/s (%.0f%% of memcpy)\n", r.workers,
             r.memory, r.gbps, 100 * r.gbps / memcpy_rate);
  }
  return 0;
}

// The system name of parallax's allreduce on a wire dtype: "parallax", "parallax-bf16", ...
std::string wire_system(int32_t wire) {
  return wire == PX_BF16 ? "parallax-bf16" : wire == PX_F16 ? "parallax-f16" : "parallax";
}

int32_t parse_wire(const std::string& name) {
  if (name == "f32") return PX_F32;
  if (name == "bf16") return PX_BF16;
  if (name == "f16") return PX_F16;
  die("--wire takes f32, bf16 or f16, not " + name);
}

// One worker of `px-bench allreduce`: f32 sum in the arena, in place; rank 0 prints, per
// size, the median, min and max over iterations of each iteration's slowest worker (every
// worker on every node).
int allreduce_worker(const std::string& sizes_text, int iterations, int32_t wire) {
  px_connect_options o;
  px_connect_options_init(&o);
  o.timeout_ms = 120000;
  o.arena_bytes = 0;
  std::vector<uint64_t> sizes;
  for (size_t at = 0; at < sizes_text.size();) {
    size_t comma = sizes_text.find(',', at);
    if (comma == std::string::npos) comma = sizes_text.size();
    sizes.push_back(std::stoull(sizes_text.substr(at, comma - at)));
    at = comma + 1;
  }
  uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  o.arena_bytes = std::max<uint64_t>(64ull << 20, largest + (16ull << 20));
  px_client* c = nullptr;
  check(px_connect(&o, &c), "px_connect");
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  void* buf = nullptr;
  check(px_alloc(c, largest, &buf), "px_alloc");
  std::memset(buf, 0, largest);
  for (uint64_t bytes : sizes) {
    px_var* var = nullptr;
    std::string name = "bench" + std::to_string(bytes);
    px_dense_options options;
    px_dense_options_init(&options);
    options.wire_dtype = wire;
    check(px_register_dense_ex(c, name.c_str(), PX_F32, bytes / 4, PX_SUM, &options, &var),
          "register");
    std::vector<double> seconds = timed_allreduces(c, var, buf, 1, iterations);
    max_over_ranks(c, "timing" + std::to_string(bytes), seconds);
    StepSummary t = summarize(seconds);
    if (w.rank == 0)
      printf("RESULT %s %llu %.9f %.9f %.9f\n", wire_system(wire).c_str(),
             static_cast<unsigned long long>(bytes), t.median, t.min, t.max);
    fflush(stdout);
  }
  px_disconnect(c);
  return 0;
}

// Runs a shell command (stderr to /tmp/px-bench-last.err) and hands each line of its
// output to on_line; says so when the command fails. The scenarios' collectors parse.
template <typename OnLine>
void for_each_output_line(const std::string& command, const std::string& what, OnLine on_line) {
  FILE* p = popen((command + " 2>/tmp/px-bench-last.err").c_str(), "r");
  if (!p) return;
  char line[512];
  while (fgets(line, sizeof line, p)) on_line(line);
  if (pclose(p) != 0)
    fprintf(stderr, "px-bench: %s run failed (see /tmp/px-bench-last.err)\n", what.c_str());
}

// Collects a command's "RESULT system bytes median min max" lines (seconds per step, each
// step's time being its slowest rank's).
std::vector<std::pair<uint64_t, StepSummary>> collect(const std::string& command,
                                                      const std::string& system) {
  std::vector<std::pair<uint64_t, StepSummary>> out;
  for_each_output_line(command, system, [&](const char* line) {
    char name[64];
    unsigned long long bytes;
    StepSummary t;
    if (sscanf(line, "RESULT %63s %llu %lf %lf %lf", name, &bytes, &t.median, &t.min, &t.max) ==
            5 &&
        system == name)
      out.push_back({bytes, t});
  });
  return out;
}

int bench_allreduce(bool json, const std::string& daemon, const std::string& nodes_list,
                    const std::string& links_list, const std::string& sizes, int iterations,
                    const std::string& peers_list, int per_node, int mtu,
                    const std::string& wires_list) {
  std::string tools = tools_dir();
  std::string source_tools = std::string(PX_SOURCE_DIR) + "/tools";
  std::string cluster = source_tools + "/px-cluster";
  std::vector<std::string> peers = split(peers_list);
  bool want_mpi = std::find(peers.begin(), peers.end(), "mpi") != peers.end();
  bool want_gloo = std::find(peers.begin(), peers.end(), "gloo") != peers.end();
  std::string mpi_binary = tools + "/px-mpi-allreduce";
  if (want_mpi && access(mpi_binary.c_str(), X_OK) != 0) {
    fprintf(stderr,
            "px-bench: %s missing (install openmpi-bin libopenmpi-dev and rebuild); skipping MPI\n",
            mpi_binary.c_str());
    want_mpi = false;
  }
  if (want_gloo && system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    fprintf(
        stderr,
        "px-bench: /usr/bin/python3 cannot import torch (install python3-torch); skipping gloo\n");
    want_gloo = false;
  }
  if (json)
    printf("{\"scenario\":\"allreduce\",\"cores\":%u,\"timing\":\"%s\",\"results\":[",
           std::thread::hardware_concurrency(), kTimingMethod);
  else
    printf("timing: %s; ms per allreduce: median (min, max) over iterations\n", kTimingMethod);
  bool first = true;
  for (const std::string& n_text : split(nodes_list)) {
    int n = std::stoi(n_text);
    for (const std::string& link : split(links_list)) {
      std::string mode =
          link == "lo" ? "--mode loopback"
                       : "--mode netns" + (link == "0" ? std::string() : " --link-gbit " + link) +
                             (mtu > 0 ? " --mtu " + std::to_string(mtu) : std::string());
      std::string base = cluster + " --nodes " + std::to_string(n) + " --workers-per-node " +
                         std::to_string(per_node) + " " + mode + " --timeout 1200";
      std::string it = std::to_string(iterations);
      std::map<std::string, std::vector<std::pair<uint64_t, StepSummary>>> by_system;
      for (const std::string& wire_name : split(wires_list)) {
        std::string system_name = wire_system(parse_wire(wire_name));
        by_system[system_name] =
            collect(base + " --daemon " + daemon + " -- " + tools + "/px-bench allreduce-worker " +
                        sizes + " " + it + " " + wire_name,
                    system_name);
      }
      if (want_mpi)
        by_system["mpi"] =
            collect(base + " --no-daemons --once -- " + source_tools + "/bench/mpi_launch.sh " +
                        mpi_binary + " " + sizes + " " + it,
                    "mpi");
      if (want_gloo)
        by_system["gloo"] = collect(base + " --no-daemons -- /usr/bin/python3 " + source_tools +
                                        "/bench/gloo_allreduce.py " + sizes + " " + it,
                                    "gloo");
      for (auto& [system_name, rows] : by_system) {
        for (auto& [bytes, t] : rows) {
          double seconds = t.median;
          double algbw = static_cast<double>(bytes) / seconds;
          double busbw_gbit = algbw * 2.0 * (n - 1) / n * 8 / 1e9;
          if (json) {
            printf(
                "%s{\"system\":\"%s\",\"nodes\":%d,\"workers_per_node\":%d,\"link\":\"%s\","
                "\"mtu\":%d,\"bytes\":%llu,\"seconds\":%.6f,\"seconds_min\":%.6f,"
                "\"seconds_max\":%.6f,\"busbw_gbit\":%.3f}",
                first ? "" : ",", system_name.c_str(), n, per_node,
                link == "lo"
                    ? "loopback"
                    : (link == "0" ? "netns-unlimited" : ("netns-" + link + "gbit").c_str()),
                link == "lo" ? 65536 : (mtu > 0 ? mtu : 1500),
                static_cast<unsigned long long>(bytes), seconds, t.min, t.max, busbw_gbit);
            first = false;
          } else {
            printf(
                "%-9s N=%d W=%d link=%-5s %10llu B  %9.3f ms (min %.3f, max %.3f)  bus %7.3f "
                "Gbit/s\n",
                system_name.c_str(), n, per_node, link.c_str(),
                static_cast<unsigned long long>(bytes), seconds * 1e3, t.min * 1e3, t.max * 1e3,
                busbw_gbit);
          }
          fflush(stdout);
        }
      }
    }
  }
  if (json) printf("]}\n");
  return 0;
}

// `px-bench torch-dense`: a many-tensor dense training step (ResNet-50's 161 gradient
// tensors, 25.6 M float32, or with --model lm the demo language model's dense part;
// synthetic compute; tools/bench/torch_dense.py) with parallax.torch.DistributedDataParallel
// and torch's own DDP on torch.distributed's "parallax" backend (ddp-parallax) against torch
// DDP on gloo (ddp), all with 25 MB buckets, on the same px-cluster links. Per system: the
// synchronized step and the same step under no_sync() (compute alone), each the median (min, max)
// over steps of the slowest rank's forward + backward. A worker's RESULT lines (per-step times) and
// CPU lines (cores busy: machine, daemons, workers) by name ("parallax-sync", ...).
struct TorchRun {
  std::map<std::string, StepSummary> steps;
  std::map<std::string, std::array<double, 3>> cores;
};

TorchRun collect_results(const std::string& command, const char* what) {
  TorchRun out;
  for_each_output_line(command, what, [&](const char* line) {
    char name[64];
    unsigned long long bytes;
    StepSummary t;
    std::array<double, 3> c{};
    if (sscanf(line, "RESULT %63s %llu %lf %lf %lf", name, &bytes, &t.median, &t.min, &t.max) == 5)
      out.steps[name] = t;
    else if (sscanf(line, "CPU %63s %lf %lf %lf", name, &c[0], &c[1], &c[2]) == 4)
      out.cores[name] = c;
  });
  return out;
}

int bench_torch_dense(int argc, char** argv) {
  bool json = false;
  std::string nodes_list = "4", per_node_list = "1,2", links_list = "1,0";
  std::string peers_list = "ddp,ddp-parallax", model = "resnet50";
  std::string daemon = default_daemon_path();
  int steps = 20;
  double sleep_ms = 0.5;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--json")
      json = true;
    else if (a == "--nodes")
      nodes_list = value();
    else if (a == "--workers-per-node")
      per_node_list = value();
    else if (a == "--links")
      links_list = value();
    else if (a == "--peers")
      peers_list = value();
    else if (a == "--steps")
      steps = std::max(1, std::stoi(value()));
    else if (a == "--sleep-ms")
      sleep_ms = std::stod(value());
    else if (a == "--daemon")
      daemon = value();
    else if (a == "--model")
      model = value();
    else
      die("unknown option " + a);
  }
  if (model != "resnet50" && model != "lm") die("--model is resnet50 or lm, not " + model);
  std::string source = PX_SOURCE_DIR;
  std::string script = source + "/tools/bench/torch_dense.py";
  // Staging room for DDP's buckets and its 250 MB broadcast at construction (ddp-parallax).
  setenv("PARALLAX_ARENA_BYTES", std::to_string(512ull << 20).c_str(), 0);
  // The worker imports the package from the source tree and loads this build's library.
  std::string pythonpath = source + "/clients/python";
  if (const char* old = getenv("PYTHONPATH")) pythonpath += std::string(":") + old;
  setenv("PYTHONPATH", pythonpath.c_str(), 1);
  setenv("PARALLAX_LIB", (tools_dir() + "/../clients/c/libparallax.so.1").c_str(), 1);
  if (system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0)
    die("/usr/bin/python3 cannot import torch (install python3-torch)");
  char args[64];
  snprintf(args, sizeof args, " %d %g", steps, sleep_ms);
  if (json)
    printf(
        "{\"scenario\":\"torch-dense\",\"cores\":%u,\"timing\":\"%s; forward+backward\","
        "\"model\":\"%s\",\"bucket_cap_mb\":25,\"sleep_ms_per_tensor\":%g,\"steps\":%d,"
        "\"results\":[",
        std::thread::hardware_concurrency(), kTimingMethod,
        model == "lm" ? "lm dense part: 6 float32 tensors, 107584 values"
                      : "resnet50 shapes: 161 float32 tensors, 25557032 values",
        sleep_ms, steps);
  else
    printf("timing: %s; seconds per forward+backward: median (min, max)\n", kTimingMethod);
  bool first = true;
  int port = 29561;
  for (const std::string& n_text : split(nodes_list)) {
    for (const std::string& w_text : split(per_node_list)) {
      for (const std::string& link : split(links_list)) {
        std::string mode =
            link == "lo" ? "--mode loopback"
                         : "--mode netns" + (link == "0" ? std::string() : " --link-gbit " + link);
        std::string label = link == "lo"
                                ? "loopback"
                                : (link == "0" ? "netns-unlimited" : "netns-" + link + "gbit");
        std::string base = source + "/tools/px-cluster --nodes " + n_text + " --workers-per-node " +
                           w_text + " " + mode + " --timeout 1800";
        std::map<std::string, TorchRun> by_system;
        by_system["parallax"] =
            collect_results(base + " --daemon " + daemon + " -- /usr/bin/python3 " + script +
                                " parallax" + args + " 0 " + model,
                            "parallax");
        for (const std::string& peer : split(peers_list)) {
          // ddp-parallax is torch's DDP on the daemons, parallax-* parallax.torch's; the
          // other peers run without them.
          bool on_daemons = peer == "ddp-parallax" || peer.rfind("parallax", 0) == 0;
          std::string daemons = on_daemons ? " --daemon " + daemon : " --no-daemons";
          by_system[peer] =
              collect_results(base + daemons + " -- /usr/bin/python3 " + script + " " + peer +
                                  args + " " + std::to_string(port++) + " " + model,
                              peer.c_str());
        }
        for (auto& [system_name, r] : by_system) {
          StepSummary step = r.steps[system_name + "-sync"];
          StepSummary compute = r.steps[system_name + "-compute"];
          StepSummary ddp = by_system["ddp"].steps["ddp-sync"];
          std::array<double, 3> cs = r.cores[system_name + "-sync"];
          std::array<double, 3> cc = r.cores[system_name + "-compute"];
          double vs_ddp = step.median > 0 && ddp.median > 0 ? ddp.median / step.median : 0;
          if (json) {
            printf(
                "%s{\"system\":\"%s\",\"nodes\":%s,\"workers_per_node\":%s,\"link\":\"%s\","
                "\"step_s\":%.6f,\"step_min_s\":%.6f,\"step_max_s\":%.6f,\"compute_s\":%.6f,"
                "\"compute_min_s\":%.6f,\"compute_max_s\":%.6f,\"ddp_step_over_this\":%.3f,"
                "\"cores_busy\":{\"step\":{\"machine\":%.2f,\"daemons\":%.2f,\"workers\":%.2f},"
                "\"compute\":{\"machine\":%.2f,\"daemons\":%.2f,\"workers\":%.2f}}}",
                first ? "" : ",", system_name.c_str(), n_text.c_str(), w_text.c_str(),
                label.c_str(), step.median, step.min, step.max, compute.median, compute.min,
                compute.max, vs_ddp, cs[0], cs[1], cs[2], cc[0], cc[1], cc[2]);
            first = false;
          } else {
            printf(
                "%-9s N=%s W=%s %-15s step %.3f (%.3f, %.3f)  compute %.3f (%.3f, %.3f)  "
                "ddp/this %.2fx  cores busy in the step: %.2f (daemons %.2f, workers %.2f)\n",
                system_name.c_str(), n_text.c_str(), w_text.c_str(), label.c_str(), step.median,
                step.min, step.max, compute.median, compute.min, compute.max, vs_ddp, cs[0], cs[1],
                cs[2]);
          }
          fflush(stdout);
        }
      }
    }
  }
  if (json) printf("]}\n");
  return 0;
}

}  // namespace

// A Python driver of tools/bench (`px-bench lm`, `px-bench dlrm`): it starts one px-cluster
// per system (and N) and prints one JSON object. Run as is, with this build's daemon.
int bench_python_driver(const std::string& name, int argc, char** argv) {
  std::string script = std::string(PX_SOURCE_DIR) + "/tools/bench/" + name;
  std::string daemon = default_daemon_path();
  std::vector<std::string> args = {"/usr/bin/python3", script, "--daemon", daemon};
  for (int i = 0; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  execv(c_args[0], c_args.data());
  die("cannot run /usr/bin/python3 " + script + ": " + strerror(errno));
}

// A Python driver that starts its own daemons and workers, with this build's daemon and
// library: `px-bench soak`, the demo's language model for 10,000 steps on 2 nodes x 2
// workers, the daemons' RSS and open fds sampled along the way (tools/bench/soak.py);
// `px-bench elastic-lm`, random membership events during it (tools/bench/elastic_lm.py).
int bench_python_with_library(const std::string& name, int argc, char** argv) {
  std::string script = std::string(PX_SOURCE_DIR) + "/tools/bench/" + name;
  std::string library = tools_dir() + "/../clients/c/libparallax.so.1";
  std::vector<std::string> args = {"/usr/bin/python3",    script,  "--daemon",
                                   default_daemon_path(), "--lib", library};
  for (int i = 0; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  execv(c_args[0], c_args.data());
  die("cannot run /usr/bin/python3 " + script + ": " + strerror(errno));
}

// `px-bench faults`: the fault-injection suite (tests/integration/fault_suite.cc) with the
// full count, 200 randomized faults on a 3-node cluster; it prints one JSON object.
int bench_faults(int argc, char** argv) {
  if (!*PX_FAULT_SUITE_PATH) die("px-bench faults: this build has no tests (PX_BUILD_TESTS=OFF)");
  std::vector<std::string> args = {PX_FAULT_SUITE_PATH, "--faults", "200"};
  for (int i = 0; i < argc; ++i)
    if (std::string(argv[i]) != "--json") args.emplace_back(argv[i]);
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  execv(c_args[0], c_args.data());
  die(std::string("cannot run ") + PX_FAULT_SUITE_PATH + ": " + strerror(errno));
}

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    fprintf(
        stderr,
        "usage: px-bench local [--json] [--daemon PATH] [--iterations N]\n"
        "       px-bench allreduce [--json] [--nodes 2,4] [--links 1,5,0,lo] [--sizes B,...]\n"
        "                          [--iterations N] [--peers mpi,gloo] [--workers-per-node W]\n"
        "                          [--mtu N (netns links)] [--wire f32,bf16,f16] [--daemon PATH]\n"
        "       px-bench sparse [--json] [--nodes 2,4] [--workers-per-node 2] [--link-gbit 1]\n"
        "                       [--routes hybrid,ps,allgatherv,allreduce] [--steps N]\n"
        "                       [--rows R] [--dim D] [--lookups L] [--dense-bytes B]\n"
        "                       [--partitions P] [--mtu N] [--peers gloo] [--daemon PATH]\n"
        "       px-bench tables [--json] [--nodes 4] [--workers-per-node 2] [--link-gbit 1]\n"
        "                       [--modes layers,concurrent,group] [--steps N] [--batch B]\n"
        "                       [--dim D] [--max-rows R] [--route ps] [--daemon PATH]\n"
        "       px-bench torch-dense [--json] [--nodes 4] [--workers-per-node 1,2]\n"
        "                            [--links 1,0,lo] [--steps N] [--sleep-ms MS]\n"
        "                            [--peers ddp,ddp-parallax,ddp-copy,parallax-bf16,\n"
        "                             ddp-fp16-hook] [--model resnet50|lm]\n"
        "                            [--daemon PATH]\n"
        "       px-bench lm [--json] [--nodes 2,4] [--workers-per-node 2] [--link-gbit 1]\n"
        "                   [--systems parallax,ddp-dense,ddp-sparse] [--vocab V] [--tokens T]\n"
        "                   [--steps N] (tools/bench/lm.py --help)\n"
        "       px-bench dlrm [--json] [--nodes 4] [--workers-per-node 2] [--link-gbit 1]\n"
        "                     [--systems parallax,parallax-layers,ddp-sparse] [--batch B]\n"
        "                     [--steps N] (tools/bench/dlrm.py --help)\n"
        "       px-bench soak [--json] [--steps 10000] [--sample-at 1000] [--every 250]\n"
        "                     (tools/bench/soak.py --help)\n"
        "       px-bench faults [--json] [--faults 200] [--seed S] [--membership] [--partition]\n"
        "       px-bench elastic-lm [--nodes 4] [--min-nodes 2] [--events 50] [--steps N]\n"
        "                           (tools/bench/elastic_lm.py --help)\n"
        "       px-bench gpu [--json] [--daemon PATH] [--iterations N]\n");
    return argc < 2 ? 2 : 0;
  }
  std::string scenario = argv[1];
  if (scenario == "sparse") return bench_sparse(argc - 2, argv + 2);
  if (scenario == "sparse-worker") return sparse_worker(argc - 2, argv + 2);
  if (scenario == "tables") return bench_tables(argc - 2, argv + 2);
  if (scenario == "tables-worker") return tables_worker(argc - 2, argv + 2);
  if (scenario == "torch-dense") return bench_torch_dense(argc - 2, argv + 2);
  // The language model through Parallax and through torch DDP (dense and sparse embeddings).
  if (scenario == "lm") return bench_python_driver("lm.py", argc - 2, argv + 2);
  // A DLRM-shaped recommender: a collection, per-table layers, DDP + gloo (#36).
  if (scenario == "dlrm") return bench_python_driver("dlrm.py", argc - 2, argv + 2);
  if (scenario == "soak") return bench_python_with_library("soak.py", argc - 2, argv + 2);
  if (scenario == "elastic-lm")
    return bench_python_with_library("elastic_lm.py", argc - 2, argv + 2);
  if (scenario == "faults") return bench_faults(argc - 2, argv + 2);
  if (scenario == "gpu") {  // px-bench-gpu, built with CUDA (bench_gpu.cc)
    // PX_BENCH_GPU: a relocated copy (the GPU kit carries both programs to another machine).
    const char* relocated = getenv("PX_BENCH_GPU");
    std::string program = relocated && *relocated ? relocated : PX_BENCH_GPU_PATH;
    if (program.empty()) die("px-bench gpu: this build has no CUDA (README, Building)");
    argv[1] = program.data();
    execv(argv[1], argv + 1);
    die("cannot run " + program + ": " + strerror(errno));
  }
  if (scenario == "allreduce-worker") {
    if (argc < 4) die("usage: px-bench allreduce-worker SIZES ITERATIONS [WIRE]");
    return allreduce_worker(argv[2], std::max(1, atoi(argv[3])),
                            argc > 4 ? parse_wire(argv[4]) : PX_F32);
  }
  bool json = false;
  std::string nodes = "2,4", links = "1,5,0,lo", peers = "mpi,gloo";
  int per_node = 1;
  int mtu = 0;  // netns links: px-cluster's default
  std::string wires = "f32";
  std::string sizes = "4096,65536,1048576,16777216,67108864,268435456";
  std::string daemon_path = default_daemon_path();
  int iterations = 5000;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json")
      json = true;
    else if (a == "--daemon" && i + 1 < argc)
      daemon_path = argv[++i];
    else if (a == "--iterations" && i + 1 < argc)
      iterations = std::max(1, atoi(argv[++i]));
    else if (a == "--nodes" && i + 1 < argc)
      nodes = argv[++i];
    else if (a == "--links" && i + 1 < argc)
      links = argv[++i];
    else if (a == "--sizes" && i + 1 < argc)
      sizes = argv[++i];
    else if (a == "--peers" && i + 1 < argc)
      peers = argv[++i];
    else if (a == "--workers-per-node" && i + 1 < argc)
      per_node = std::max(1, atoi(argv[++i]));
    else if (a == "--mtu" && i + 1 < argc)
      mtu = std::max(0, atoi(argv[++i]));
    else if (a == "--wire" && i + 1 < argc)
      wires = argv[++i];
    else
      die("unknown option " + a);
  }
  if (scenario == "local") return bench_local(json, daemon_path, iterations);
  if (scenario == "allreduce")
    return bench_allreduce(json, daemon_path, nodes, links, sizes,
                           iterations == 5000 ? 5 : iterations, peers, per_node, mtu, wires);
  die("unknown scenario '" + scenario +
      "' (this build has: local, allreduce, sparse, torch-dense, lm, soak, faults, elastic-lm)");
}
