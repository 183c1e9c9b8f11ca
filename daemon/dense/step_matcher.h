// Matching a step across a job's local workers: collects each worker's contribution to
// (variable, opcode, step) in Variable::pending and decides when the step is complete (every
// local worker came) or failed (a bad buffer, a withdrawn request, a stall, a variable or job
// failing). It runs nothing: a complete step goes back to the Scheduler, which hands it to
// its executor (allreduce_step, copy_step or the sparse router). So a new collective needs
// nothing here, and a change to matching touches no executor.
//
// Every function is for the loop thread only; the state is the variable's (job.h), so these
// are free functions and can be tested with a bare Job.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/completer.h"
#include "daemon/common/job.h"
#include "transport/ipc/shm_layout.h"

namespace px {

// Adds an admitted step entry from worker (local rank `rank` of job) to its step of var.
// `invalid` (Admission::invalid) non-empty fails the step for every local worker, while the
// entry still counts as arrived. Returns the step, taken out of var.pending, when this was
// the last local worker to come and the step has not failed; else nullopt: the entry waits
// for the others, or was completed at once with the step's failure.
std::optional<PendingStep> match_step(Job& job, Variable& var, int rank,
                                      const std::shared_ptr<Completer>& worker,
                                      const SubmitEntry& entry, const std::string& invalid);

// Completes every waiting contribution of var with status (the message gets the variable and
// step appended) and forgets those steps.
void fail_pending_steps(Variable& var, px_status status, const std::string& why);

// The request `request_id` of worker (local rank `local_rank`) waiting in a step: completes
// it with PX_ERR_CANCELLED, fails the step for the others with a message naming the worker
// and reason (stored in *message), and returns true. False if it waits in no step.
bool withdraw_from_step(Job& job, int local_rank, Completer& worker, uint64_t request_id,
                        const std::string& reason, std::string* message);

// Fails, with PX_ERR_TIMEOUT naming the workers that never came, every step of the job that
// some local workers submitted more than stall_ns before now_ns. Returns the messages, with
// the variable and step each is about.
struct StalledStep {
  std::string message;
  std::string variable;
  uint64_t step = 0;
};
std::vector<StalledStep> fail_stalled_steps(Job& job, int64_t now_ns, int64_t stall_ns);

}  // namespace px
