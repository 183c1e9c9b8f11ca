// What the executors (allreduce_step, copy_step, the sparse router) tell the observer about
// each operation they run: when its first and last local workers came, which stages it went
// through (local reduce, cross-node exchange, fan-out, ...) and how it ended. The observer
// turns that into metrics, timeline events and stall reports (observer.h); with no observer
// installed (unit tests of a bare scheduler) every call is a no-op. Loop thread only, like
// the executors. Every name passed here must be a string literal (kept by pointer).
#pragma once

#include <cstdint>
#include <memory>

#include "daemon/common/job.h"
#include "parallax_c.h"

namespace px {

// Carried by an executor's run, from the start of the operation to its end.
struct StepTrace {
  static constexpr int kMaxStages = 6;  // more are folded into the last
  int64_t first_ns = 0;                 // the first local worker submitted (the step was opened)
  int64_t matched_ns = 0;               // the last one did: the executor starts
  const char* stage_name[kMaxStages] = {};
  int64_t stage_ns[kMaxStages] = {};  // when each stage began; it ends where the next begins
  int stages = 0;
  uint64_t token = 0;  // its place among the operations in flight; 0: not traced
  // A sparse step through a hot-row cache: the rows a pull served from it or a push held
  // (the timeline's cache_rows); -1: no cache.
  int64_t cache_rows = -1;
};

// Where traces go (implemented by Observer).
class StepSink {
 public:
  virtual ~StepSink() = default;
  virtual uint64_t started(const std::shared_ptr<Job>& job, const Variable& var,
                           const char* operation, uint64_t step, int64_t first_ns,
                           int64_t matched_ns) = 0;
  virtual void staged(uint64_t token, const char* stage, int64_t now_ns) = 0;
  virtual void finished(const StepTrace& trace, const char* route, px_status status, uint64_t bytes,
                        int64_t end_ns) = 0;
};

// The process's sink (null: none). The daemon installs its observer before its loop runs
// and removes it after.
void set_step_sink(StepSink* sink);

// An operation starts now (operation: "allreduce", "pull", ...; step: its number, 0 for
// those that are no steps; first_ns: when its first local worker submitted it, 0: now).
void trace_started(StepTrace& trace, const std::shared_ptr<Job>& job, const Variable& var,
                   const char* operation, uint64_t step, int64_t first_ns);
// The operation enters stage `stage` now ("local_reduce", "cross_node", "fan_out", ...).
void trace_stage(StepTrace& trace, const char* stage);
// The operation ended with status; route: "allreduce", "ps", "broadcast", ... (the
// metrics' route label); bytes: what it moved, as VarStats counts them (0 on failure).
void trace_finished(StepTrace& trace, const char* route, px_status status, uint64_t bytes);

}  // namespace px
