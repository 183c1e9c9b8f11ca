// px-bench-gpu: the GPU figures (CUDA builds; `px-bench gpu` runs it).
//
//   px-bench gpu [--json] [--daemon PATH] [--iterations N]
//     On the first GPU, all measured in the same run:
//     * memory bandwidth: cudaMemcpy device to device of 256 MiB (reads + writes per second);
//     * px_allreduce_ex of 256 MiB bf16, in place on px_alloc_ex memory, from 2 and 4
//       workers (processes) of one parallaxd: the step's memory traffic (every worker's
//       input read, every worker's result written: 2 x K x 256 MiB) per second, as a
//       fraction of that bandwidth; a step ends when the result is on its slowest worker's
//       stream (per-step max over workers, median over steps);
//     * the 4 KiB f32 px_allreduce_ex latency between 2 workers (call to result on the
//       stream, per-step max over workers: median and p99), and the host path's
//       px_allreduce of the same size measured the same way (call to result);
//     * the coalescing of an LM1B-shaped push (8,192 indices drawn Zipf(1) from 800,000
//       rows, 128 f32 each) by the CUB kernel (transport/kernels/cuda/device_coalesce)
//       against sharding's coalesce() on one host core, on the same push.
//     and, under "targets", the GPU kit's three ratios with their targets and whether each
//     is met (from this run's figures).
// Without a device it says why and exits 0 ("skipped" in the JSON).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "parallax_c.h"
#include "sharding/coalesce.h"
#include "tools/bench_common.h"
#include "tools/bench_local.h"
#include "transport/kernels/cuda/device_coalesce.h"

namespace {

using namespace pxbench;

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(err));
}

// Seconds between two events recorded around fn on stream, median of `runs` after one
// warm-up.
template <typename Fn>
double timed_on_stream(cudaStream_t stream, int runs, Fn fn) {
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> seconds;
  for (int i = 0; i <= runs; ++i) {
    check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i > 0) seconds.push_back(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return percentile(seconds, 0.5);
}

// [bandwidth GB/s, GPU coalescing s, host coalescing s, unique rows], in one process that
// owns the device.
std::vector<double> kernels(int runs) {
  const size_t bytes = 256ull << 20;
  cudaStream_t stream;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  void *a = nullptr, *b = nullptr;
  check_cuda(cudaMalloc(&a, bytes), "cudaMalloc");
  check_cuda(cudaMalloc(&b, bytes), "cudaMalloc");
  check_cuda(cudaMemset(a, 1, bytes), "cudaMemset");
  double copy_s = timed_on_stream(stream, runs, [&] {
    check_cuda(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream), "copy");
  });
  double bandwidth = 2.0 * static_cast<double>(bytes) / copy_s / 1e9;
  cudaFree(a);
  cudaFree(b);

  // The push: Zipf(1) over the rows by inverse CDF, fixed seed.
  const size_t n = 8192, dim = 128, rows = 800000;
  std::vector<double> cdf(rows);
  double total = 0;
  for (size_t r = 0; r < rows; ++r) cdf[r] = (total += 1.0 / static_cast<double>(r + 1));
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0, total);
  std::vector<int64_t> indices(n);
  for (auto& i : indices)
    i = static_cast<int64_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
  std::vector<float> grads(n * dim);
  std::normal_distribution<float> g(0, 1);
  for (auto& v : grads) v = g(rng);

  std::vector<double> host_s;
  px::CoalescedRows host;
  for (int i = 0; i <= runs; ++i) {
    double t0 = now_s();
    px::coalesce({px::RowBatch{indices.data(), n, grads.data()}}, dim, false, &host);
    if (i > 0) host_s.push_back(now_s() - t0);
  }

  px::gpu::DeviceCoalesceArgs args;
  args.n = n;
  args.dim = dim;
  args.row_limit = rows;
  args.stream = stream;
  std::string why;
  if (!px::gpu::device_coalesce_scratch_bytes(n, rows, &args.scratch_bytes, &why)) die(why);
  void *d_idx, *d_grads, *d_out_idx, *d_out_grads, *d_counts, *scratch;
  check_cuda(cudaMalloc(&d_idx, n * 8), "cudaMalloc");
  check_cuda(cudaMalloc(&d_grads, n * dim * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&d_out_idx, n * 8), "cudaMalloc");
  check_cuda(cudaMalloc(&d_out_grads, n * dim * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&d_counts, 16), "cudaMalloc");
  check_cuda(cudaMalloc(&scratch, args.scratch_bytes), "cudaMalloc");
  check_cuda(cudaMemcpy(d_idx, indices.data(), n * 8, cudaMemcpyHostToDevice), "upload");
  check_cuda(cudaMemcpy(d_grads, grads.data(), n * dim * 4, cudaMemcpyHostToDevice), "upload");
  args.indices = static_cast<const int64_t*>(d_idx);
  args.grads = static_cast<const float*>(d_grads);
  args.out_indices = static_cast<int64_t*>(d_out_idx);
  args.out_grads = static_cast<float*>(d_out_grads);
  args.out_unique = static_cast<int64_t*>(d_counts);
  args.out_first_bad = args.out_unique + 1;
  args.scratch = scratch;
  double gpu_s = timed_on_stream(stream, runs, [&] {
    if (!px::gpu::device_coalesce(args, &why)) die("device_coalesce: " + why);
  });
  int64_t unique = 0;
  check_cuda(cudaMemcpy(&unique, d_counts, 8, cudaMemcpyDeviceToHost), "download");
  if (static_cast<size_t>(unique) != host.rows.size())
    die("the GPU found " + std::to_string(unique) + " unique rows, the host " +
        std::to_string(host.rows.size()));
  for (void* p : {d_idx, d_grads, d_out_idx, d_out_grads, d_counts, scratch}) cudaFree(p);
  cudaStreamDestroy(stream);
  return {bandwidth, gpu_s, percentile(host_s, 0.5), static_cast<double>(unique)};
}

// Seconds of each px_allreduce_ex of `count` elements of dtype on px_alloc_ex memory, in
// place, call to result on the stream; the per-step max over the `workers` workers.
std::vector<double> device_allreduce(const Daemon& d, int workers, px_dtype dtype, uint64_t count,
                                     int warmup, int iterations, bool aligned) {
  std::string job = "gpu" + std::to_string(workers) + "-" + std::to_string(count);
  size_t elem = dtype == PX_F32 ? 4 : 2;
  return run_workers(workers, [&](int rank) {
    px_client* c = connect_worker(d, job, rank, workers);
    px_var* var = nullptr;
    check(px_register_dense(c, "x", dtype, count, PX_SUM, &var), "register");
    px_alloc_options ao;
    px_alloc_options_init(&ao);
    ao.memory_kind = PX_MEMORY_CUDA;
    void* buf = nullptr;
    check(px_alloc_ex(c, count * elem, &ao, &buf), "px_alloc_ex");
    check_cuda(cudaMemset(buf, 0, count * elem), "cudaMemset");
    cudaStream_t stream;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    px_op_options o;
    px_op_options_init(&o);
    o.memory_kind = PX_MEMORY_CUDA;
    o.stream = stream;
    std::vector<double> seconds;
    for (int i = 0; i < warmup + iterations; ++i) {
      if (aligned) check(px_barrier(c, 300000), "px_barrier");
      px_request* r = nullptr;
      double t0 = now_s();
      check(px_allreduce_ex(var, buf, buf, &o, &r), "px_allreduce_ex");
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      double t = now_s() - t0;
      check(px_wait(r, 300000), "px_wait");
      px_request_free(r);
      if (i >= warmup) seconds.push_back(t);
    }
    max_over_ranks(c, "times", seconds);
    check(px_free(c, buf), "px_free");
    cudaStreamDestroy(stream);
    px_disconnect(c);
    return seconds;
  });
}

// The host path's peer of the 4 KiB device round trip, measured the same way in the same
// run: px_allreduce of `count` f32 on px_alloc arena memory, in place, call to result;
// the per-step max over the workers.
std::vector<double> host_allreduce(const Daemon& d, int workers, uint64_t count, int warmup,
                                   int iterations) {
  std::string job = "host" + std::to_string(workers) + "-" + std::to_string(count);
  return run_workers(workers, [&](int rank) {
    px_client* c = connect_worker(d, job, rank, workers);
    px_var* var = nullptr;
    check(px_register_dense(c, "x", PX_F32, count, PX_SUM, &var), "register");
    void* buf = nullptr;
    check(px_alloc(c, count * 4, &buf), "px_alloc");
    std::memset(buf, 0, count * 4);
    std::vector<double> seconds = timed_allreduces(c, var, buf, warmup, iterations, false);
    max_over_ranks(c, "times", seconds);
    px_disconnect(c);
    return seconds;
  });
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::string daemon_path = default_daemon_path();
  int iterations = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json")
      json = true;
    else if (a == "--daemon" && i + 1 < argc)
      daemon_path = argv[++i];
    else if (a == "--iterations" && i + 1 < argc)
      iterations = std::max(1, std::atoi(argv[++i]));
    else
      die("usage: px-bench gpu [--json] [--daemon PATH] [--iterations N]");
  }
  // Asked in a child: CUDA in this process would not survive the workers' forks.
  std::vector<double> devices = run_workers(1, [](int) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    return std::vector<double>{static_cast<double>(n)};
  });
  if (devices.empty() || devices[0] < 1) {
    if (json)
      printf("{\"scenario\":\"gpu\",\"skipped\":\"no CUDA device\"}\n");
    else
      printf("px-bench gpu: skipped: no CUDA device\n");
    return 0;
  }
  std::vector<double> k = run_workers(1, [&](int) { return kernels(iterations); });
  double bandwidth = k[0];
  Daemon daemon;
  start_daemon(daemon, daemon_path);
  const uint64_t big = 128ull << 20;  // bf16: 256 MiB
  struct Row {
    int workers;
    StepSummary s;
    double fraction;
  };
  std::vector<Row> rows;
  for (int workers : {2, 4}) {
    StepSummary s = summarize(
        device_allreduce(daemon, workers, PX_BF16, big, 2, std::max(3, iterations / 4), true));
    double traffic = 2.0 * workers * 2.0 * static_cast<double>(big);
    rows.push_back({workers, s, traffic / s.median / 1e9 / bandwidth});
  }
  std::vector<double> latency =
      device_allreduce(daemon, 2, PX_F32, 1024, 20, 10 * iterations, false);
  for (double& t : latency) t *= 1e6;
  std::vector<double> host_latency = host_allreduce(daemon, 2, 1024, 20, 10 * iterations);
  for (double& t : host_latency) t *= 1e6;
  // The GPU kit's targets (issue 33), from this run's own figures.
  double fraction_2w = rows.empty() ? 0 : rows[0].fraction;
  double latency_ratio = percentile(latency, 0.5) / percentile(host_latency, 0.5);
  double coalesce_speedup = k[2] / k[1];
  if (json) {
    printf("{\"scenario\":\"gpu\",\"timing\":\"%s\",\"memory_bandwidth_gbps\":%.1f,", kTimingMethod,
           bandwidth);
    printf("\"allreduce_256mib_bf16\":[");
    for (size_t i = 0; i < rows.size(); ++i)
      printf(
          "%s{\"workers\":%d,\"seconds\":{\"median\":%.5f,\"min\":%.5f,\"max\":%.5f},"
          "\"fraction_of_bandwidth\":%.3f}",
          i ? "," : "", rows[i].workers, rows[i].s.median, rows[i].s.min, rows[i].s.max,
          rows[i].fraction);
    printf("],\"allreduce_4k_2_workers_us\":{\"median\":%.1f,\"p99\":%.1f},",
           percentile(latency, 0.5), percentile(latency, 0.99));
    printf("\"allreduce_4k_2_workers_host_us\":{\"median\":%.1f,\"p99\":%.1f},",
           percentile(host_latency, 0.5), percentile(host_latency, 0.99));
    printf(
        "\"coalesce_8192x128\":{\"unique_rows\":%.0f,\"gpu_ms\":%.3f,\"host_ms\":%.3f,"
        "\"speedup\":%.1f},",
        k[3], k[1] * 1e3, k[2] * 1e3, coalesce_speedup);
    printf(
        "\"targets\":{\"allreduce_256mib_bf16_2_workers_fraction\":{\"value\":%.3f,"
        "\"target\":\">= 0.60\",\"met\":%s},"
        "\"coalesce_speedup\":{\"value\":%.1f,\"target\":\">= 10\",\"met\":%s},"
        "\"allreduce_4k_device_over_host\":{\"value\":%.2f,\"target\":\"<= 2\",\"met\":%s}}}\n",
        fraction_2w, fraction_2w >= 0.6 ? "true" : "false", coalesce_speedup,
        coalesce_speedup >= 10 ? "true" : "false", latency_ratio,
        latency_ratio <= 2 ? "true" : "false");
  } else {
    printf("device-to-device copy (256 MiB):   %.1f GB/s (reads + writes)\n", bandwidth);
    for (const Row& r : rows)
      printf(
          "256 MiB bf16 allreduce, %d workers: median %.2f ms (min %.2f, max %.2f), %.0f%% of "
          "the bandwidth\n",
          r.workers, r.s.median * 1e3, r.s.min * 1e3, r.s.max * 1e3, 100 * r.fraction);
    printf("4 KiB allreduce, 2 workers:        median %.1f us, p99 %.1f us\n",
           percentile(latency, 0.5), percentile(latency, 0.99));
    printf("4 KiB allreduce, host memory:      median %.1f us, p99 %.1f us (device/host %.2f)\n",
           percentile(host_latency, 0.5), percentile(host_latency, 0.99), latency_ratio);
    printf("coalescing 8192 x 128 (%.0f unique): GPU %.3f ms, host %.3f ms (%.1fx)\n", k[3],
           k[1] * 1e3, k[2] * 1e3, k[2] / k[1]);
  }
  return 0;
}
