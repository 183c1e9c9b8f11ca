#include "daemon/observe/observer.h"

#include <algorithm>

#include "daemon/common/log.h"
#include "daemon/observe/metric_families.h"
#include "transport/ipc/control_channel.h"  // monotonic_ns

namespace px {

Observer::Observer(uv_loop_t* loop, ObserverOptions options, ObserverHooks hooks)
    : loop_(loop),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      timeline_(hooks_.post),
      started_ns_(monotonic_ns()) {}

Observer::~Observer() {
  set_step_sink(nullptr);
}

bool Observer::listen_metrics(std::string* error) {
  if (!options_.metrics_listen.empty()) {
    exposer_ = MetricsExposer::start(
        options_.metrics_listen, hooks_.post,
        [this] {
          DaemonState s = state();
          return build_metric_families(s, metrics_, options_.metrics_max_variables);
        },
        error);
    if (!exposer_) return false;
    PX_LOG_INFO("metrics on %s", exposer_->url().c_str());
  }
  return true;
}

int64_t Observer::report_threshold_ms() const {
  return options_.stall_report_ms > 0 ? options_.stall_report_ms : 10000;
}

void Observer::start() {
  set_step_sink(this);
  uv_timer_init(loop_, &stall_timer_);
  stall_timer_.data = this;
  timer_running_ = true;
  if (options_.stall_report_ms > 0) {
    // A quarter of the threshold between checks (100 ms to 1 s): a stall is logged at most
    // 25% (or 1 s) after it passes the threshold; the check walks only pending steps.
    uint64_t every =
        static_cast<uint64_t>(std::clamp<int64_t>(options_.stall_report_ms / 4, 100, 1000));
    uv_timer_start(&stall_timer_, on_stall_timer, every, every);
  }
}

void Observer::stop() {
  if (exposer_) exposer_->stop();
  timeline_.detach_from_loop();
  if (timer_running_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&stall_timer_), nullptr);
    timer_running_ = false;
  }
}

const std::string& Observer::metrics_url() const {
  return exposer_ ? exposer_->url() : no_url_;
}

uint64_t Observer::started(const std::shared_ptr<Job>& job, const Variable& var,
                           const char* operation, uint64_t step, int64_t, int64_t matched_ns) {
  uint64_t token = next_token_++;
  InFlight& f = in_flight_[token];
  f.job = job;
  f.var = &var;
  f.operation = operation;
  f.step = step;
  f.matched_ns = matched_ns;
  return token;
}

void Observer::staged(uint64_t token, const char* stage, int64_t) {
  auto it = in_flight_.find(token);
  if (it != in_flight_.end()) it->second.stage = stage;
}

void Observer::finished(const StepTrace& trace, const char* route, px_status status, uint64_t bytes,
                        int64_t end_ns) {
  auto it = in_flight_.find(trace.token);
  if (it == in_flight_.end()) return;
  InFlight f = std::move(it->second);
  in_flight_.erase(it);
  metrics_.operation_finished(route, f.operation, status, bytes, trace.first_ns, trace.matched_ns,
                              end_ns);
  if (!timeline_.on()) return;
  TimelineRecord r;
  r.job = f.job->name();
  r.variable = f.var->name;
  r.operation = f.operation;
  r.route = route;
  r.step = f.step;
  r.status = status;
  r.trace = trace;
  r.end_ns = end_ns;
  timeline_.record(std::move(r));
}

std::vector<Stall> Observer::stalls(int64_t min_wait_ms) {
  int64_t threshold_ms = min_wait_ms >= 0 ? min_wait_ms : report_threshold_ms();
  int64_t threshold_ns = threshold_ms * 1000000;
  int64_t now = monotonic_ns();
  StallContext context = hooks_.stall_context();
  std::vector<Stall> out;
  for (const std::shared_ptr<Job>& job : hooks_.jobs()) {
    if (!job->broken().empty()) continue;  // failed: nothing waits any more
    for (Stall& s : find_waiting_steps(*job, now, threshold_ns, context))
      out.push_back(std::move(s));
  }
  for (const auto& [token, f] : in_flight_) {
    if (now - f.matched_ns <= threshold_ns || !f.job->broken().empty()) continue;
    InFlightOperation op;
    op.job = f.job.get();
    op.var = f.var;
    op.operation = f.operation;
    op.step = f.step;
    op.matched_ns = f.matched_ns;
    op.stage = f.stage;
    op.local_workers = f.job->local_size();
    out.push_back(in_flight_stall(op, now, context));
  }
  std::sort(out.begin(), out.end(),
            [](const Stall& a, const Stall& b) { return a.waited_ms > b.waited_ms; });
  return out;
}

DaemonState Observer::state() {
  DaemonState s = hooks_.collect();
  s.uptime_ms = (monotonic_ns() - started_ns_) / 1000000;
  s.metrics_url = metrics_url();
  s.timeline_path = timeline_.on() ? timeline_.path() : "";
  s.timeline_events = timeline_.recorded();
  s.timeline_dropped = timeline_.dropped();
  s.stall_report_ms = options_.stall_report_ms;
  s.stalls = stalls(-1);
  return s;
}

void Observer::on_stall_timer(uv_timer_t* timer) {
  static_cast<Observer*>(timer->data)->log_new_stalls();
}

void Observer::log_new_stalls() {
  std::set<std::string> still;
  for (const Stall& s : stalls(-1)) {
    std::string key = s.job + '\0' + s.variable + '\0' + s.operation + '\0' +
                      std::to_string(s.step) + '\0' + s.kind;
    if (!logged_stalls_.count(key)) {
      LogFields fields = job_fields(s.job, s.variable);
      fields.step = static_cast<int64_t>(s.step);
      // One worker it waits for, when there is one on this node (all of them are in the text).
      if (!s.missing.empty()) {
        fields.rank = s.missing.front().local_rank;
        if (s.missing.front().pid > 0) fields.pid = s.missing.front().pid;
      }
      PX_LOG_WARN_AT(fields, "%s", s.description.c_str());
    }
    still.insert(std::move(key));
  }
  logged_stalls_.swap(still);  // a stall that ended and comes back is logged again
}

}  // namespace px
