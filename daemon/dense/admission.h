// The checks a submitted entry gets where it arrives, before it is matched with the other
// local workers' entries: all of them in one place, so a refused entry is answered from one
// spot (Scheduler::submit) and the checks can be tested without a session.
#pragma once

#include <cstdint>
#include <string>

#include "daemon/common/completer.h"
#include "daemon/common/job.h"
#include "transport/ipc/shm_layout.h"

namespace px {

struct Admission {
  // Not PX_OK: the entry is refused with message and goes no further.
  px_status status = PX_OK;
  std::string message;
  Variable* var = nullptr;
  // A step (matched across local workers); else a single sparse load or read.
  bool step = false;
  // A step whose buffers are bad: it still takes its place in the step, which then fails
  // for every local worker with this message (the others must not wait for it).
  std::string invalid;
};

// Checks entry from worker (local rank `rank` of job) and, for a step in order, advances
// the worker's step counter. Loop thread only.
Admission admit(Job& job, int rank, const Completer& worker, const SubmitEntry& entry);

// " (variable 'v', push step 3)", appended to a step's messages.
std::string step_suffix(const Variable& var, uint16_t opcode, uint64_t step);

}  // namespace px
