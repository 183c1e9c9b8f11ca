#include "daemon/observe/metric_families.h"

#include <limits>
#include <string>
#include <utility>

namespace px {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

MetricFamily family(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void gauge(MetricFamily& f, double value, Labels labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  f.metric.push_back(std::move(m));
}

void counter(MetricFamily& f, double value, Labels labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = value;
  f.metric.push_back(std::move(m));
}

void histogram(MetricFamily& f, const LatencyHistogram& h, Labels labels) {
  ClientMetric m;
  m.label = std::move(labels);
  m.histogram.sample_count = h.count();
  m.histogram.sample_sum = h.sum();
  uint64_t cumulative = 0;
  const std::vector<double>& bounds = LatencyHistogram::bounds();
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += h.counts()[i];
    m.histogram.bucket.push_back({cumulative, bounds[i]});
  }
  m.histogram.bucket.push_back({h.count(), std::numeric_limits<double>::infinity()});
  f.metric.push_back(std::move(m));
}

MetricFamily single_gauge(const char* name, const char* help, double value) {
  MetricFamily f = family(name, help, MetricType::Gauge);
  gauge(f, value);
  return f;
}

}  // namespace

std::vector<MetricFamily> build_metric_families(const DaemonState& s, const StepMetrics& metrics,
                                                size_t max_variables) {
  std::vector<MetricFamily> out;

  MetricFamily info = family("parallax_node_info",
                             "This daemon: 1, labelled with its version, cluster and node index",
                             MetricType::Gauge);
  gauge(info, 1,
        {{"version", s.version},
         {"abi", s.abi},
         {"cluster", s.cluster},
         {"node", std::to_string(s.node_index)}});
  out.push_back(std::move(info));
  out.push_back(single_gauge("parallax_uptime_seconds", "Seconds since the daemon started",
                             static_cast<double>(s.uptime_ms) / 1000.0));
  out.push_back(single_gauge("parallax_cluster_nodes", "Nodes in the cluster (1: single node)",
                             s.node_count));
  out.push_back(single_gauge("parallax_cluster_nodes_up",
                             "Nodes of the cluster this daemon sees up, itself included",
                             s.nodes_up));
  out.push_back(single_gauge("parallax_workers_connected",
                             "Worker processes connected to this daemon", s.workers));
  out.push_back(single_gauge(
      "parallax_gpu_devices",
      "CUDA devices this daemon's GPU backend found (0: none, or no backend)", s.gpu_devices));

  MetricFamily jobs = family("parallax_jobs", "Jobs on this node by state", MetricType::Gauge);
  for (const char* state : {"waiting", "running", "broken"}) {
    double n = 0;
    for (const JobState& j : s.jobs) n += j.state == state ? 1 : 0;
    gauge(jobs, n, {{"state", state}});
  }
  out.push_back(std::move(jobs));

  MetricFamily vars =
      family("parallax_variables", "Variables registered on this node by kind", MetricType::Gauge);
  for (bool sparse : {false, true}) {
    double n = 0;
    for (const VariableState& v : s.variables) n += v.sparse == sparse ? 1 : 0;
    gauge(vars, n, {{"kind", sparse ? "sparse" : "dense"}});
  }
  out.push_back(std::move(vars));

  MetricFamily ops = family("parallax_operations_total",
                            "Operations this node completed (a step of all its local workers "
                            "counts once), by route and operation",
                            MetricType::Counter);
  MetricFamily failures =
      family("parallax_operation_failures_total",
             "Operations this node ran that failed, by route and operation", MetricType::Counter);
  MetricFamily bytes = family("parallax_operation_bytes_total",
                              "Bytes of the completed operations (local workers' input bytes; "
                              "sparse: rows x (8 + 4 x dim)), by route and operation",
                              MetricType::Counter);
  for (const auto& [key, c] : metrics.operations()) {
    Labels labels = {{"route", key.first}, {"operation", key.second}};
    counter(ops, static_cast<double>(c.ok), labels);
    counter(failures, static_cast<double>(c.failed), labels);
    counter(bytes, static_cast<double>(c.bytes), labels);
  }
  out.push_back(std::move(ops));
  out.push_back(std::move(failures));
  out.push_back(std::move(bytes));

  MetricFamily latency = family("parallax_step_latency_seconds",
                                "Operation time from its first local submission to its end, "
                                "by route",
                                MetricType::Histogram);
  for (const auto& [route, h] : metrics.latency()) histogram(latency, h, {{"route", route}});
  out.push_back(std::move(latency));
  MetricFamily wait = family("parallax_step_wait_seconds",
                             "Time from the first to the last local worker's submission of an "
                             "operation, by route",
                             MetricType::Histogram);
  for (const auto& [route, h] : metrics.wait()) histogram(wait, h, {{"route", route}});
  out.push_back(std::move(wait));

  MetricFamily errors =
      family("parallax_request_errors_total", "Worker requests completed with an error, by status",
             MetricType::Counter);
  for (size_t slot = 1; slot < kStatusSlots; ++slot)
    counter(errors, static_cast<double>(metrics.requests_by_status()[slot]),
            {{"status", status_label(slot)}});
  out.push_back(std::move(errors));

  MetricFamily var_ops =
      family("parallax_variable_operations_total",
             "Operations completed on the variable on this node", MetricType::Counter);
  MetricFamily var_bytes =
      family("parallax_variable_bytes_total",
             "Bytes of the variable's completed operations on this node", MetricType::Counter);
  MetricFamily alpha = family("parallax_variable_alpha",
                              "Sparse: mean density of a worker's pull, rows_pulled / "
                              "(pull_steps x local workers x rows)",
                              MetricType::Gauge);
  MetricFamily unique_alpha = family("parallax_variable_unique_alpha",
                                     "Sparse: density of this node's union of pulled rows, "
                                     "rows_unique / (pull_steps x rows)",
                                     MetricType::Gauge);
  MetricFamily rows_pulled =
      family("parallax_variable_rows_pulled_total",
             "Sparse: rows the local workers pulled, duplicates included", MetricType::Counter);
  MetricFamily rows_unique =
      family("parallax_variable_rows_unique_total",
             "Sparse: rows this node asked the shards for (the union)", MetricType::Counter);
  MetricFamily sent =
      family("parallax_variable_bytes_sent_total",
             "Sparse: payload bytes this node sent to other nodes", MetricType::Counter);
  MetricFamily received =
      family("parallax_variable_bytes_received_total",
             "Sparse: payload bytes this node received from other nodes", MetricType::Counter);
  MetricFamily cache_hits =
      family("parallax_variable_cache_hits_total",
             "Sparse, hot-row cache: rows of this node's pulls served from its cache",
             MetricType::Counter);
  MetricFamily cache_misses =
      family("parallax_variable_cache_misses_total",
             "Sparse, hot-row cache: rows asked of their owners while the cache looked",
             MetricType::Counter);
  MetricFamily cache_rows =
      family("parallax_variable_cache_rows", "Sparse, hot-row cache: rows kept", MetricType::Gauge);
  MetricFamily cache_saved =
      family("parallax_variable_cache_bytes_saved",
             "Sparse, hot-row cache: payload bytes kept off the wire so far (rows not pulled, "
             "gradient rows not pushed, less held sums sent later: it can fall)",
             MetricType::Gauge);
  MetricFamily cache_flushed = family(
      "parallax_variable_cache_rows_flushed_total",
      "Sparse, hot-row cache: held gradient rows sent (in a push or a flush)", MetricType::Counter);
  MetricFamily pending = family("parallax_variable_pending_steps",
                                "Steps of the variable some local workers submitted and others "
                                "have not yet",
                                MetricType::Gauge);
  size_t labelled = 0;
  for (const VariableState& v : s.variables) {
    if (labelled == max_variables) break;
    ++labelled;
    Labels labels = {{"job", v.job}, {"variable", v.name}, {"kind", v.sparse ? "sparse" : "dense"}};
    counter(var_ops, static_cast<double>(v.ops), labels);
    counter(var_bytes, static_cast<double>(v.bytes), labels);
    gauge(pending, v.pending_steps, labels);
    if (!v.sparse) continue;
    gauge(alpha, v.alpha, labels);
    gauge(unique_alpha, v.unique_alpha, labels);
    counter(rows_pulled, static_cast<double>(v.rows_pulled), labels);
    counter(rows_unique, static_cast<double>(v.rows_unique), labels);
    counter(sent, static_cast<double>(v.bytes_sent), labels);
    counter(received, static_cast<double>(v.bytes_received), labels);
    if (v.cache_hits + v.cache_misses == 0) continue;  // no cache (or it has not looked yet)
    counter(cache_hits, static_cast<double>(v.cache_hits), labels);
    counter(cache_misses, static_cast<double>(v.cache_misses), labels);
    gauge(cache_rows, static_cast<double>(v.cache_rows), labels);
    gauge(cache_saved, static_cast<double>(v.cache_bytes_saved), labels);
    counter(cache_flushed, static_cast<double>(v.cache_rows_flushed), labels);
  }
  for (MetricFamily* f :
       {&var_ops, &var_bytes, &alpha, &unique_alpha, &rows_pulled, &rows_unique, &sent, &received,
        &cache_hits, &cache_misses, &cache_rows, &cache_saved, &cache_flushed, &pending})
    out.push_back(std::move(*f));
  out.push_back(
      single_gauge("parallax_variables_unlabeled",
                   "Variables left out of the per-variable series (metrics.max_variables)",
                   static_cast<double>(s.variables.size() - labelled)));

  MetricFamily memory = family("parallax_memory_bytes",
                               "The daemon's memory by part: resident (the kernel's count), "
                               "shards, arenas (heaps mapped), rings, scratch, staging, "
                               "caches (hot-row), fabric_buffers (estimated)",
                               MetricType::Gauge);
  gauge(memory, static_cast<double>(s.memory.resident), {{"part", "resident"}});
  gauge(memory, static_cast<double>(s.memory.shards), {{"part", "shards"}});
  gauge(memory, static_cast<double>(s.memory.arenas), {{"part", "arenas"}});
  gauge(memory, static_cast<double>(s.memory.fabric_buffers), {{"part", "fabric_buffers"}});
  gauge(memory, static_cast<double>(s.memory.rings), {{"part", "rings"}});
  gauge(memory, static_cast<double>(s.memory.scratch), {{"part", "scratch"}});
  gauge(memory, static_cast<double>(s.memory.staging), {{"part", "staging"}});
  gauge(memory, static_cast<double>(s.memory.caches), {{"part", "caches"}});
  out.push_back(std::move(memory));

  out.push_back(single_gauge("parallax_stalled_operations",
                             "Operations waiting longer than timeouts.stall_report_ms",
                             static_cast<double>(s.stalls.size())));
  out.push_back(single_gauge("parallax_timeline_enabled", "1 while the timeline is being written",
                             s.timeline_path.empty() ? 0 : 1));
  MetricFamily overtakes =
      family("parallax_fabric_priority_overtakes_total",
             "Sends to other nodes that went ahead of earlier ones by their priority",
             MetricType::Counter);
  counter(overtakes, static_cast<double>(s.fabric_priority_overtakes));
  out.push_back(std::move(overtakes));
  MetricFamily dropped = family("parallax_timeline_dropped_events_total",
                                "Timeline events dropped since it was switched on (the writer "
                                "fell behind)",
                                MetricType::Counter);
  counter(dropped, static_cast<double>(s.timeline_dropped));
  out.push_back(std::move(dropped));
  return out;
}

}  // namespace px
