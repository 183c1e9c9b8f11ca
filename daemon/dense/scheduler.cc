#include "daemon/dense/scheduler.h"

#include <optional>
#include <utility>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/admission.h"
#include "daemon/dense/allreduce_step.h"
#include "daemon/dense/alltoall_step.h"
#include "daemon/dense/copy_step.h"
#include "daemon/dense/cross_node_route.h"
#include "daemon/dense/reduce_scatter_step.h"
#include "daemon/dense/step_matcher.h"
#include "daemon/sparse/device_rows_step.h"

namespace px {

void Scheduler::submit(const std::shared_ptr<Job>& job, int rank,
                       const std::shared_ptr<Completer>& worker, const SubmitEntry& entry) {
  PX_ASSERT_LOOP_THREAD();
  Admission admission = admit(*job, rank, *worker, entry);
  if (admission.status != PX_OK)  // the one place a refused entry is answered
    return worker->complete(entry.request_id, admission.status, admission.message);
  Variable& var = *admission.var;
  if (!admission.step && entry.in.memory_kind == static_cast<uint32_t>(MemoryKind::kCudaDevice))
    return run_device_rows_single(offload_, gpu_, sparse_, job, worker, var, entry);
  if (!admission.step) return sparse_.run_single(job, worker, var, entry);

  std::optional<PendingStep> complete =
      match_step(*job, var, rank, worker, entry, admission.invalid);
  if (!complete) return;  // waits for the other local workers, or failed
  auto opcode = static_cast<Opcode>(entry.opcode);
  if (var.sparse && has_device_rows(*complete))
    return run_device_rows_step(offload_, gpu_, sparse_, job, var, opcode, entry.step,
                                std::move(*complete));
  if (var.sparse) return sparse_.run_step(job, var, opcode, entry.step, std::move(*complete));
  StepContext context = this->context();
  if (opcode == Opcode::kAllreduce || opcode == Opcode::kBarrier)
    return run_allreduce_step(context, job, var, entry.step, std::move(*complete));
  if (opcode == Opcode::kReduceScatter)
    return run_reduce_scatter_step(context, job, var, entry.step, std::move(*complete));
  if (opcode == Opcode::kAlltoall)
    return run_alltoall_step(context, job, var, entry.step, std::move(*complete));
  run_copy_step(context, job, var, entry.opcode, entry.step, std::move(*complete));
}

void Scheduler::fail_variable(Variable& var, px_status status, const std::string& why) {
  fail_pending_steps(var, status, why);
  sparse_.fail_in_flight(var, status, why);
  fail_route_waiters(var, status, why);
}

void Scheduler::fail_job(Job& job, px_status status, const std::string& why) {
  abort_communicators(job);
  for (auto& var : job.variables()) fail_variable(*var, status, why);
}

void Scheduler::route_decided(const std::shared_ptr<Job>& job, Variable& var,
                              const DeviceRoutes::Route& route) {
  px::route_decided(context(), job, var, route);
}

bool Scheduler::turn_arrived(Variable& var, uint64_t step) {
  return px::turn_arrived(var, step);
}

void Scheduler::fail_pending(Variable& var, px_status status, const std::string& why) {
  fail_pending_steps(var, status, why);
}

bool Scheduler::withdraw(Job& job, int local_rank, Completer& worker, uint64_t request_id,
                         const std::string& reason, std::string* message) {
  return withdraw_from_step(job, local_rank, worker, request_id, reason, message);
}

std::vector<StalledStep> Scheduler::fail_stalled(Job& job, int64_t now_ns, int64_t stall_ns) {
  return fail_stalled_steps(job, now_ns, stall_ns);
}

}  // namespace px
