// The observer's pure parts: histogram buckets, the Prometheus families (serialized as the
// endpoint serves them), the timeline's events and its writer, the stall finder on a bare
// job, and the observability config keys.
#include <doctest/doctest.h>
#include <prometheus/text_serializer.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>

#include "daemon/front/config.h"
#include "daemon/observe/metric_families.h"
#include "daemon/observe/stall_report.h"
#include "daemon/observe/step_metrics.h"
#include "daemon/observe/timeline.h"
#include "tests/unit/temp_dir.h"
#include "transport/ipc/control_channel.h"

using namespace px;

namespace {

std::string serialize(const std::vector<prometheus::MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class FakeWorker : public Completer {
 public:
  explicit FakeWorker(int rank) : rank_(rank) {}
  void complete(uint64_t, px_status, const std::string&) override {}
  std::string label() const override { return "fake rank " + std::to_string(rank_); }
  const SharedArena& arena() const override { return arena_; }

 private:
  int rank_;
  SharedArena arena_;
};

}  // namespace

TEST_CASE("observe: latency histogram buckets are upper bounds, +Inf last") {
  LatencyHistogram h;
  h.observe(0.00005);  // on the first bound: counts there
  h.observe(0.003);    // between 0.0025 and 0.005
  h.observe(1000);     // past the last: +Inf
  const auto& bounds = LatencyHistogram::bounds();
  CHECK(h.count() == 3);
  CHECK(h.counts()[0] == 1);
  size_t at = 0;
  while (bounds[at] < 0.005) ++at;
  CHECK(h.counts()[at] == 1);
  CHECK(h.counts().back() == 1);
  CHECK(h.sum() == doctest::Approx(1000.00305));
}

TEST_CASE("observe: families carry routes, statuses, per-variable series up to the cap") {
  StepMetrics m;
  m.operation_finished("allreduce", "allreduce", PX_OK, 4000, 0, 1000, 2000000);
  m.operation_finished("allreduce", "allreduce", PX_ERR_PEER_LOST, 0, 0, 0, 1000);
  m.operation_finished("ps", "pull", PX_OK, 400, 0, 0, 1000);
  m.request_completed(PX_ERR_TIMEOUT);
  m.request_completed(PX_ERR_TIMEOUT);
  m.request_completed(static_cast<px_status>(999));
  DaemonState s;
  s.version = "0.1.0";
  s.node_count = 2;
  s.nodes_up = 2;
  s.workers = 3;
  JobState running;
  running.state = "running";
  s.jobs = {running};
  VariableState dense, sparse;
  dense.job = sparse.job = "j";
  dense.name = "w";
  dense.ops = 7;
  sparse.name = "emb";
  sparse.sparse = true;
  sparse.alpha = 0.25;
  s.variables = {dense, sparse};
  std::string text = serialize(build_metric_families(s, m, 256));
  CHECK(has(text, "parallax_operations_total{route=\"allreduce\",operation=\"allreduce\"} 1"));
  CHECK(has(text,
            "parallax_operation_failures_total{route=\"allreduce\",operation=\"allreduce\"} 1"));
  CHECK(has(text, "parallax_operation_bytes_total{route=\"ps\",operation=\"pull\"} 400"));
  CHECK(has(text, "parallax_request_errors_total{status=\"PX_ERR_TIMEOUT\"} 2"));
  CHECK(has(text, "parallax_request_errors_total{status=\"PX_STATUS_UNKNOWN\"} 1"));
  CHECK(has(text, "parallax_step_latency_seconds_count{route=\"allreduce\"} 2"));
  CHECK(has(text, "parallax_step_wait_seconds_bucket{route=\"allreduce\",le=\"+Inf\"} 2"));
  CHECK(has(text, "parallax_cluster_nodes_up 2"));
  CHECK(has(text, "parallax_workers_connected 3"));
  CHECK(has(text, "parallax_jobs{state=\"running\"} 1"));
  CHECK(has(text, "parallax_variable_operations_total{job=\"j\",variable=\"w\",kind=\"dense\"} 7"));
  CHECK(has(text, "parallax_variable_alpha{job=\"j\",variable=\"emb\",kind=\"sparse\"} 0.25"));
  CHECK(!has(text, "parallax_variable_alpha{job=\"j\",variable=\"w\""));  // dense: no alpha
  CHECK(has(text, "parallax_variables_unlabeled 0"));

  std::string capped = serialize(build_metric_families(s, m, 1));
  CHECK(has(capped, "parallax_variables_unlabeled 1"));
  CHECK(!has(capped, "variable=\"emb\""));
}

TEST_CASE("observe: a timeline record is an operation with its stages nested inside") {
  TimelineRecord r;
  r.job = "j\"1";
  r.variable = "v";
  r.operation = "allreduce";
  r.route = "allreduce";
  r.step = 7;
  r.trace.first_ns = 1000;
  r.trace.matched_ns = 3000;
  r.trace.stage_name[0] = "local_reduce";
  r.trace.stage_ns[0] = 3000;
  r.trace.stage_name[1] = "cross_node";
  r.trace.stage_ns[1] = 5500;
  r.trace.stages = 2;
  r.end_ns = 9000;
  std::string e = format_timeline_events(r, 0, 3, 1);
  CHECK(has(e,
            "{\"name\":\"allreduce\",\"ph\":\"X\",\"ts\":1.000,\"dur\":8.000,\"pid\":3,\"tid\":1,"
            "\"args\":{\"job\":\"j\\\"1\",\"variable\":\"v\",\"step\":7,\"route\":\"allreduce\","
            "\"status\":\"PX_OK\"}}"));
  CHECK(has(e, "{\"name\":\"wait_workers\",\"ph\":\"X\",\"ts\":1.000,\"dur\":2.000,"));
  CHECK(has(e, "{\"name\":\"local_reduce\",\"ph\":\"X\",\"ts\":3.000,\"dur\":2.500,"));
  CHECK(has(e, "{\"name\":\"cross_node\",\"ph\":\"X\",\"ts\":5.500,\"dur\":3.500,"));
  CHECK(json_escape("a\\b\n\x01") == "a\\\\b\\n\\u0001");
}

TEST_CASE("observe: the timeline writer completes the file it was given, off the loop") {
  test::TempDir dir;
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::function<void()>> posted;
  PostToLoop post = [&](std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex);
    posted.push_back(std::move(fn));
    cv.notify_all();
  };
  auto run_posted = [&] {  // what the loop would do: one posted callback
    std::unique_lock<std::mutex> lock(mutex);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return !posted.empty(); }));
    auto fn = std::move(posted.front());
    posted.erase(posted.begin());
    lock.unlock();
    fn();
  };
  Timeline timeline(post);
  std::string path = dir.path() + "/t.json";
  px_status opened = PX_ERR_INTERNAL;
  timeline.start(path, [&](px_status s, const std::string&) { opened = s; });
  run_posted();
  CHECK(opened == PX_OK);
  CHECK(timeline.on());
  TimelineRecord r;
  r.job = "j";
  r.variable = "v";
  r.operation = "pull";
  r.route = "ps";
  r.trace.first_ns = r.trace.matched_ns = monotonic_ns();
  r.end_ns = r.trace.first_ns + 1000;
  timeline.record(r);
  std::string stopped;
  timeline.stop([&](px_status, const std::string& message) { stopped = message; });
  run_posted();
  CHECK(!timeline.on());
  CHECK(has(stopped, "4 events in " + path));  // 2 metadata, the operation, wait_workers
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str().front() == '[');
  CHECK(has(text.str(), "\"process_name\""));
  CHECK(has(text.str(), "\n]\n"));

  px_status bad = PX_OK;
  timeline.start(dir.path() + "/no/such/dir/t.json",
                 [&](px_status s, const std::string&) { bad = s; });
  run_posted();
  CHECK(bad == PX_ERR_INVALID);
  CHECK(!timeline.on());
}

TEST_CASE("observe: a step waiting on a local worker names it; failed steps do not") {
  Job job("j", 3);
  auto w0 = std::make_shared<FakeWorker>(0), w2 = std::make_shared<FakeWorker>(2);
  job.members()[0] = w0;
  job.members()[2] = w2;  // local rank 1 left
  Fingerprint f;
  f.count = 4;
  Variable& var = job.add("grad", f, "test");
  PendingStep& waiting = var.pending[{static_cast<uint16_t>(Opcode::kAllreduce), 5}];
  waiting.by_rank.resize(3);
  waiting.by_rank[0] = Contribution{w0, 1, {}, {}, 0, nullptr};
  waiting.first_ns = 1000;
  PendingStep& failed = var.pending[{static_cast<uint16_t>(Opcode::kAllreduce), 6}];
  failed.by_rank.resize(3);
  failed.first_ns = 1000;
  failed.failure = PX_ERR_TIMEOUT;
  StallContext context;
  context.node = 1;
  context.node_label = "node 1 (h:1)";
  context.pid_of = [](const Completer& c) { return c.label() == "fake rank 2" ? 4242 : 0; };
  std::vector<Stall> stalls = find_waiting_steps(job, 1000 + 2000000000, 1000000000, context);
  REQUIRE(stalls.size() == 1);
  const Stall& s = stalls[0];
  CHECK(s.variable == "grad");
  CHECK(s.operation == "allreduce");
  CHECK(s.step == 5);
  CHECK(s.node == 1);
  CHECK(s.waited_ms == 2000);
  CHECK(s.arrived == std::vector<int>{0});
  REQUIRE(s.missing.size() == 2);
  CHECK((s.missing[0].local_rank == 1 && !s.missing[0].connected));
  CHECK((s.missing[1].local_rank == 2 && s.missing[1].pid == 4242 && s.missing[1].rank == 2));
  CHECK(s.description ==
        "stall: job 'j', variable 'grad', allreduce step 5, node 1 (h:1): waiting 2000 ms for "
        "local rank 1 (global rank 1, gone), local rank 2 (global rank 2, pid 4242) to submit "
        "it; local ranks 0 did");
  CHECK(find_waiting_steps(job, 1000 + 500000000, 1000000000, context).empty());
}

TEST_CASE("observe: config keys for the metrics endpoint and the stall report") {
  test::TempDir dir;
  auto load = [&](const std::string& text, DaemonConfig* c, std::string* error) {
    std::string path = dir.path() + "/c.toml";
    std::ofstream(path) << text;
    return load_config_file(path, c, error);
  };
  DaemonConfig c;
  std::string error;
  CHECK(c.metrics_listen.empty());  // off by default
  REQUIRE(
      load("[metrics]\nlisten = \"127.0.0.1:9464\"\nmax_variables = 10\n"
           "[timeouts]\nstall_report_ms = 250\n",
           &c, &error));
  CHECK(c.metrics_listen == "127.0.0.1:9464");
  CHECK(c.metrics_max_variables == 10);
  CHECK(c.stall_report_ms == 250);
  CHECK(load("[metrics]\nlisten = \"[::1]:0\"\n", &c, &error));
  for (const char* bad : {"9464", "host:", "127.0.0.1:70000", "::1:80", "[::1:80"}) {
    CAPTURE(bad);
    DaemonConfig d;
    CHECK(!load(std::string("[metrics]\nlisten = \"") + bad + "\"\n", &d, &error));
    CHECK(has(error, "metrics.listen"));
  }
  CHECK(!load("[metrics]\nport = 1\n", &c, &error));
  CHECK(has(error, "unknown setting 'metrics.port'"));
}

TEST_CASE("observe: a stalled pull names the local workers whose push it waits for") {
  Job job("j", 2);
  Fingerprint f;
  f.count = 100;
  f.sparse = true;
  f.dim = 4;
  Variable& var = job.add("emb", f, "test");
  constexpr uint16_t kPush = static_cast<uint16_t>(Opcode::kPushRows);
  var.next_step(0, kPush) = 3;  // rank 0 pushed steps 0, 1 and 2
  var.next_step(1, kPush) = 2;  // rank 1 pulled step 2 but never pushed it
  InFlightOperation op;
  op.job = &job;
  op.var = &var;
  op.operation = "pull";
  op.step = 3;
  op.matched_ns = 1000;
  op.stage = "sent";
  op.local_workers = 2;
  StallContext context;
  context.node_label = "node 0";
  Stall s = in_flight_stall(op, 1000 + 5000000000, context);
  CHECK(s.description ==
        "stall: job 'j', variable 'emb', pull step 3, node 0: all 2 local workers submitted it "
        "5000 ms ago; it is in stage 'sent' (push step 2 has not come from local rank 1 (pushed "
        "up to step 1): a pull waits for the push steps before it, so a worker that pulls again "
        "before pushing the step it pulled, as in a training forward whose backward never "
        "came, holds every worker's next pull)");
  // Every local push in: on one node it waits for them to be applied, never for "other
  // nodes"; on a cluster, for the other nodes'.
  var.next_step(1, kPush) = 3;
  s = in_flight_stall(op, 1000 + 5000000000, context);
  CHECK(s.description.find("the push steps before it to be applied on this node") !=
        std::string::npos);
  CHECK(s.description.find("other nodes") == std::string::npos);
  JobWorld world;
  world.node_count = 2;
  world.world_size = 4;
  world.node_sizes = {2, 2};
  job.set_world(world);
  s = in_flight_stall(op, 1000 + 5000000000, context);
  CHECK(s.description.find("`pxctl stalls` on the other nodes names whose") != std::string::npos);
}
