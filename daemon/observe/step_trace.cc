#include "daemon/observe/step_trace.h"

#include "transport/ipc/control_channel.h"  // monotonic_ns

namespace px {
namespace {
// Set before the loop runs and read on the loop thread only.
StepSink* g_sink = nullptr;
}  // namespace

void set_step_sink(StepSink* sink) {
  g_sink = sink;
}

void trace_started(StepTrace& trace, const std::shared_ptr<Job>& job, const Variable& var,
                   const char* operation, uint64_t step, int64_t first_ns) {
  if (!g_sink) return;
  trace.matched_ns = monotonic_ns();
  trace.first_ns = first_ns ? first_ns : trace.matched_ns;
  trace.token = g_sink->started(job, var, operation, step, trace.first_ns, trace.matched_ns);
}

void trace_stage(StepTrace& trace, const char* stage) {
  if (!trace.token) return;
  if (trace.stages > 0 && trace.stage_name[trace.stages - 1] == stage) return;  // re-entered
  int64_t now = monotonic_ns();
  if (trace.stages < StepTrace::kMaxStages) {
    trace.stage_name[trace.stages] = stage;
    trace.stage_ns[trace.stages] = now;
    ++trace.stages;
  }
  if (g_sink) g_sink->staged(trace.token, stage, now);
}

void trace_finished(StepTrace& trace, const char* route, px_status status, uint64_t bytes) {
  if (!g_sink || !trace.token) return;
  g_sink->finished(trace, route, status, bytes, monotonic_ns());
  trace.token = 0;  // once: a run finished twice is counted once
}

}  // namespace px
