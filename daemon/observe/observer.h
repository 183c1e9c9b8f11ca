// parallaxd's observability, in one object the server owns: the event counters
// (step_metrics.h) fed by the executors' traces (step_trace.h) and by every completed worker
// request, the Prometheus endpoint (metrics_exposer.h), the timeline (timeline.h) and the
// stall report (stall_report.h), logged once per stalled operation when it passes
// stall_report_ms. It reads the daemon through hooks the front fills, so it knows no
// Server or Session. Loop thread only, except where said.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/common/offload.h"
#include "daemon/observe/daemon_state.h"
#include "daemon/observe/metrics_exposer.h"
#include "daemon/observe/stall_report.h"
#include "daemon/observe/step_metrics.h"
#include "daemon/observe/step_trace.h"
#include "daemon/observe/timeline.h"

namespace px {

struct ObserverOptions {
  std::string metrics_listen;  // empty: no endpoint
  size_t metrics_max_variables = 256;
  int64_t stall_report_ms = 10000;  // 0: no stall log (listings then use 10 s)
};

struct ObserverHooks {
  PostToLoop post;
  // The daemon's state without stalls (the observer adds them); loop thread.
  std::function<DaemonState()> collect;
  // The jobs on this node; loop thread.
  std::function<std::vector<std::shared_ptr<Job>>()> jobs;
  // Where this node is, for stall reports.
  std::function<StallContext()> stall_context;
};

class Observer : public StepSink {
 public:
  Observer(uv_loop_t* loop, ObserverOptions options, ObserverHooks hooks);
  ~Observer() override;
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  // Binds the metrics endpoint if one is configured; false with error set if it cannot.
  bool listen_metrics(std::string* error);
  // On the loop thread before the loop runs: installs the step sink, starts the stall timer.
  void start();
  // At shutdown, on the loop, before it stops taking posts: closes the endpoint and the
  // timer; an open timeline is completed by its writer.
  void stop();

  // Every worker request's completion (Session::complete): errors by kind.
  void request_completed(px_status status) { metrics_.request_completed(status); }

  // The daemon's state with its stalls (waits past the report threshold).
  DaemonState state();
  // Operations that have waited longer than min_wait_ms (< 0: the report threshold).
  std::vector<Stall> stalls(int64_t min_wait_ms);
  // stall_report_ms, or 10 s where the log is off.
  int64_t report_threshold_ms() const;
  const std::string& metrics_url() const;
  Timeline& timeline() { return timeline_; }
  const ObserverOptions& options() const { return options_; }

  // StepSink.
  uint64_t started(const std::shared_ptr<Job>& job, const Variable& var, const char* operation,
                   uint64_t step, int64_t first_ns, int64_t matched_ns) override;
  void staged(uint64_t token, const char* stage, int64_t now_ns) override;
  void finished(const StepTrace& trace, const char* route, px_status status, uint64_t bytes,
                int64_t end_ns) override;

 private:
  struct InFlight {
    std::shared_ptr<Job> job;  // keeps var alive
    const Variable* var = nullptr;
    const char* operation = "";
    uint64_t step = 0;
    int64_t matched_ns = 0;
    const char* stage = "started";
  };
  static void on_stall_timer(uv_timer_t* timer);
  void log_new_stalls();

  uv_loop_t* loop_;
  ObserverOptions options_;
  ObserverHooks hooks_;
  StepMetrics metrics_;
  Timeline timeline_;
  std::unique_ptr<MetricsExposer> exposer_;
  std::unordered_map<uint64_t, InFlight> in_flight_;
  uint64_t next_token_ = 1;
  uv_timer_t stall_timer_{};
  bool timer_running_ = false;
  std::set<std::string> logged_stalls_;  // those still stalled, logged once each
  std::string no_url_;
  int64_t started_ns_;
};

}  // namespace px
