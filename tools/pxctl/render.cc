#include "tools/pxctl/render.h"

#include <cstdio>
#include <initializer_list>

namespace pxctl {
namespace {

namespace control = px::control;

// Concatenation without operator+ chains, which GCC 12's -O3 -Wrestrict misreads.
std::string cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) out += p;
  return out;
}

std::string str(const flatbuffers::String* s) {
  return s ? s->str() : "";
}

std::string worker_json(const control::AdminWorker& w) {
  return JsonObject()
      .add("local_rank", w.local_rank())
      .add("rank", w.rank())
      .add("pid", w.pid())
      .add("connected", w.connected())
      .str();
}

std::string workers_json(const flatbuffers::Vector<flatbuffers::Offset<control::AdminWorker>>* v) {
  std::vector<std::string> items;
  if (v)
    for (const control::AdminWorker* w : *v) items.push_back(worker_json(*w));
  return json_array(items);
}

std::string fixed(double v, int digits) {
  char text[40];
  snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

}  // namespace

std::string status_json(const control::AdminStatus& s) {
  return JsonObject()
      .add("version", str(s.version()))
      .add("abi", str(s.abi()))
      .add("pid", s.pid())
      .add("uptime_ms", s.uptime_ms())
      .add("socket", str(s.socket()))
      .add("cluster", str(s.cluster()))
      .add("cluster_state", str(s.cluster_state()))
      .add("node_index", s.node_index())
      .add("node_count", s.node_count())
      .add("node_label", str(s.node_label()))
      .add("nodes_up", s.nodes_up())
      .add("workers", s.workers())
      .add("jobs", s.jobs())
      .add("variables", s.variables())
      .add("stalls", s.stalls())
      .add("metrics_url", str(s.metrics_url()))
      .add("timeline_path", str(s.timeline_path()))
      .add("timeline_events", s.timeline_events())
      .add("timeline_dropped", s.timeline_dropped())
      .add("step_stall_ms", s.step_stall_ms())
      .add("stall_report_ms", s.stall_report_ms())
      .add("gpu_mode", str(s.gpu_mode()))
      .add("gpu_devices", s.gpu_devices())
      .add("gpu", str(s.gpu()))
      .add("nccl", str(s.nccl()))
      .add("gpu_cross_node", str(s.gpu_cross_node()))
      .add("membership", str(s.membership()))
      .add("coordinator_node", s.coordinator_node())
      .add("coordinator_term", s.coordinator_term())
      .add_raw("memory", JsonObject()
                             .add("resident", s.memory_resident())
                             .add("shards", s.memory_shards())
                             .add("arenas", s.memory_arenas())
                             .add("fabric_buffers", s.memory_fabric_buffers())
                             .add("rings", s.memory_rings())
                             .add("scratch", s.memory_scratch())
                             .add("staging", s.memory_staging())
                             .add("caches", s.memory_caches())
                             .str())
      .str();
}

std::string status_text(const control::AdminStatus& s) {
  std::string out = cat({"parallaxd ", str(s.version()), " (ABI ", str(s.abi()), "), pid ",
                         std::to_string(s.pid()), ", up ", human_ms(s.uptime_ms()), "\n"});
  Table t({"", ""});
  t.row({"socket", str(s.socket())});
  std::string cluster = str(s.cluster_state()) == "single"
                            ? "single node"
                            : cat({"'", str(s.cluster()), "': ", str(s.node_label()), " of ",
                                   std::to_string(s.node_count()), ", ", str(s.cluster_state()),
                                   ", ", std::to_string(s.nodes_up()), " of ",
                                   std::to_string(s.node_count()), " nodes up"});
  t.row({"cluster", cluster});
  if (!str(s.membership()).empty())
    t.row({"membership",
           cat({str(s.membership()), "; coordinator node ", std::to_string(s.coordinator_node()),
                ", term ", std::to_string(s.coordinator_term())})});
  t.row({"workers", std::to_string(s.workers()) + " connected"});
  t.row({"jobs",
         cat({std::to_string(s.jobs()), " (", std::to_string(s.variables()), " variables)"})});
  t.row({"memory",
         cat({human_bytes(s.memory_resident()), " resident; shards ",
              human_bytes(s.memory_shards()), ", workers' arenas ", human_bytes(s.memory_arenas()),
              " mapped, rings ", human_bytes(s.memory_rings()), ", scratch ",
              human_bytes(s.memory_scratch()), ", staging ", human_bytes(s.memory_staging()),
              ", caches ", human_bytes(s.memory_caches()), ", fabric buffers ~",
              human_bytes(s.memory_fabric_buffers())})});
  std::string threshold = s.stall_report_ms() > 0
                              ? std::to_string(s.stall_report_ms()) + " ms"
                              : "10000 ms (stall log off: timeouts.stall_report_ms = 0)";
  t.row({"stalls", cat({std::to_string(s.stalls()), " waiting longer than ", threshold,
                        s.stalls() ? " (pxctl stalls)" : ""})});
  t.row({"metrics", s.metrics_url() && s.metrics_url()->size() ? str(s.metrics_url())
                                                               : "off (metrics.listen)"});
  std::string timeline = "off";
  if (s.timeline_path() && s.timeline_path()->size())
    timeline = cat({"writing ", str(s.timeline_path()), " (", std::to_string(s.timeline_events()),
                    " operations, ", std::to_string(s.timeline_dropped()), " dropped)"});
  t.row({"timeline", timeline});
  t.row({"gpu", cat({str(s.gpu()), " (gpu.mode ", str(s.gpu_mode()), ")"})});
  t.row({"cross-node", cat({str(s.gpu_cross_node()), " (device allreduces)"})});
  t.row({"step stall", s.step_stall_ms() > 0 ? cat({std::to_string(s.step_stall_ms()),
                                                    " ms (a step waiting this long fails)"})
                                             : "off"});
  std::string table = t.str();
  return out + table.substr(table.find('\n') + 1);  // no header
}

Table job_table() {
  return Table({"JOB", "STATE", "LOCAL", "WORLD", "NODES", "RANKS", "VARS", "PIDS"});
}

std::string job_json(const control::AdminJob& j) {
  return JsonObject()
      .add("name", str(j.name()))
      .add("state", str(j.state()))
      .add("broken", str(j.broken()))
      .add("local_size", j.local_size())
      .add("connected", j.connected())
      .add("node_count", j.node_count())
      .add("world_size", j.world_size())
      .add("rank_offset", j.rank_offset())
      .add("variables", j.variables())
      .add_raw("workers", workers_json(j.workers()))
      .str();
}

void job_row(Table& t, const control::AdminJob& j) {
  std::string pids;
  if (j.workers())
    for (const control::AdminWorker* w : *j.workers())
      pids += cat({pids.empty() ? "" : ",", w->connected() ? std::to_string(w->pid()) : "-"});
  std::string ranks = j.world_size() > 0
                          ? cat({std::to_string(j.rank_offset()), "..",
                                 std::to_string(j.rank_offset() + j.local_size() - 1)})
                          : "-";
  t.row({str(j.name()), str(j.state()),
         cat({std::to_string(j.connected()), "/", std::to_string(j.local_size())}),
         j.world_size() > 0 ? std::to_string(j.world_size()) : "-", std::to_string(j.node_count()),
         ranks, std::to_string(j.variables()), pids});
}

std::string job_notes(const control::AdminJob& j) {
  return j.broken() && j.broken()->size()
             ? cat({"job '", str(j.name()), "' broke: ", str(j.broken())})
             : "";
}

Table variable_table() {
  return Table({"JOB", "VARIABLE", "KIND", "ROUTE", "SHAPE", "OPS", "BYTES", "ALPHA", "CACHE HITS",
                "PENDING"});
}

std::string variable_json(const control::AdminVariable& v) {
  return JsonObject()
      .add("job", str(v.job()))
      .add("name", str(v.name()))
      .add("id", v.id())
      .add("kind", str(v.kind()))
      .add("shape", str(v.shape()))
      .add("route", str(v.route()))
      .add("route_reason", str(v.route_reason()))
      .add("ops", v.ops())
      .add("bytes", v.bytes())
      .add("wait_ns", v.wait_ns())
      .add("reduce_ns", v.reduce_ns())
      .add("pull_steps", v.pull_steps())
      .add("push_steps", v.push_steps())
      .add("rows_pulled", v.rows_pulled())
      .add("rows_unique", v.rows_unique())
      .add("rows_applied", v.rows_applied())
      .add("bytes_sent", v.bytes_sent())
      .add("bytes_received", v.bytes_received())
      .add("alpha", v.alpha())
      .add("unique_alpha", v.unique_alpha())
      .add("pending_steps", v.pending_steps())
      .add("cache_hits", v.cache_hits())
      .add("cache_misses", v.cache_misses())
      .add("cache_rows", v.cache_rows())
      .add("cache_bytes_saved", v.cache_bytes_saved())
      .add("cache_rows_flushed", v.cache_rows_flushed())
      .add("failed", str(v.failed()))
      .str();
}

// A hot-row cache's share of the rows it looked at: "-" without one.
std::string cache_hit_ratio(const control::AdminVariable& v) {
  uint64_t looked = v.cache_hits() + v.cache_misses();
  if (looked == 0) return "-";
  return fixed(100.0 * static_cast<double>(v.cache_hits()) / static_cast<double>(looked), 1) + "%";
}

void variable_row(Table& t, const control::AdminVariable& v) {
  bool sparse = str(v.kind()) == "sparse";
  std::string shape = str(v.shape());
  if (shape.size() > 40) shape = shape.substr(0, 37) + "...";
  t.row({str(v.job()), cat({str(v.name()), v.failed() && v.failed()->size() ? " (failed)" : ""}),
         str(v.kind()), str(v.route()).empty() ? "-" : str(v.route()), shape,
         std::to_string(v.ops()), human_bytes(v.bytes()), sparse ? fixed(v.alpha(), 4) : "-",
         cache_hit_ratio(v), std::to_string(v.pending_steps())});
}

Table peer_table() {
  return Table({"NODE", "ADDRESS", "STATE"});
}

std::string peer_json(const control::AdminPeer& p) {
  return JsonObject()
      .add("index", p.index())
      .add("address", str(p.address()))
      .add("state", str(p.state()))
      .str();
}

void peer_row(Table& t, const control::AdminPeer& p) {
  t.row({std::to_string(p.index()), p.address() && p.address()->size() ? str(p.address()) : "-",
         str(p.state())});
}

std::string stall_json(const control::AdminStall& s) {
  std::vector<std::string> arrived;
  if (s.arrived())
    for (int32_t r : *s.arrived()) arrived.push_back(std::to_string(r));
  return JsonObject()
      .add("job", str(s.job()))
      .add("variable", str(s.variable()))
      .add("operation", str(s.operation()))
      .add("step", s.step())
      .add("node", s.node())
      .add("node_label", str(s.node_label()))
      .add("waited_ms", s.waited_ms())
      .add("kind", str(s.kind()))
      .add_raw("missing", workers_json(s.missing()))
      .add_raw("arrived", json_array(arrived))
      .add("description", str(s.description()))
      .str();
}

std::string stall_text(const control::AdminStall& s) {
  return str(s.description());
}

}  // namespace pxctl
