// The stall report: which operations of this node have waited longer than a threshold, and
// on whom. A step some local workers submitted and others have not names the missing
// workers (node, local and global rank, pid); an operation whose local workers all
// submitted and which has not finished names the stage it waits in (cross_node: the other
// nodes' share; run `pxctl stalls` there to see whose). Read-only: failing stalled steps is
// step_stall_ms's job (step_matcher.h). Loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "daemon/common/job.h"

namespace px {

struct StalledWorker {
  int local_rank = 0;
  int rank = -1;  // global rank; -1 until the job has its world
  int pid = 0;    // 0 if gone
  bool connected = false;
};

struct Stall {
  std::string job;
  std::string variable;  // "<barrier>" for the job's barrier
  std::string operation;
  uint64_t step = 0;
  int node = 0;
  std::string node_label;
  int64_t waited_ms = 0;
  std::string kind;  // "workers": local workers missing; else the stage it is in
  std::vector<StalledWorker> missing;
  std::vector<int> arrived;  // local ranks that submitted
  std::string description;   // one line, as logged
};

// The node a report is made on.
struct StallContext {
  int node = 0;
  std::string node_label;  // "node 1 (10.0.0.2:7070)", "node 0"
  std::function<int(const Completer&)> pid_of;
};

// The job's steps that some local workers submitted more than threshold_ns before now_ns
// and others have not (failed steps excluded).
std::vector<Stall> find_waiting_steps(const Job& job, int64_t now_ns, int64_t threshold_ns,
                                      const StallContext& context);

// An operation past local matching that has not finished (from the observer's in-flight
// table): stalled if it started more than threshold_ns before now_ns.
struct InFlightOperation {
  const Job* job = nullptr;
  const Variable* var = nullptr;
  const char* operation = "";
  uint64_t step = 0;
  int64_t matched_ns = 0;
  const char* stage = "";
  int local_workers = 0;
};
Stall in_flight_stall(const InFlightOperation& op, int64_t now_ns, const StallContext& context);

}  // namespace px
