#include "daemon/dense/scheduler.h"

#include <algorithm>
#include <cstring>

#include "daemon/common/log.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/admission.h"
#include "daemon/dense/copy_step.h"
#include "transport/collectives/ring_allreduce.h"
#include "transport/ipc/control_channel.h"
#include "transport/kernels/reduce.h"

namespace px {
namespace {

// Steps up to this many bytes per worker are reduced on the loop thread: handing them to
// the pool would cost more (a thread wake-up each way) than the reduction itself.
constexpr uint64_t kInlineReduceBytes = 64 * 1024;
// Work per pool task chunk: reduce a chunk, then copy it to the other outputs while hot.
constexpr uint64_t kChunkBytes = 128 * 1024;

std::string step_suffix(const Variable& var, uint64_t step) {
  return step_suffix(var, static_cast<uint16_t>(Opcode::kAllreduce), step);
}

// Pending steps hold admitted opcodes only: every one has a name.
const char* op_name(uint16_t opcode) {
  return operation_info(opcode).name;
}

// Fails every contribution of a pending step, and the step's later arrivals, with status.
void fail_pending(PendingStep& pending, px_status status, const std::string& message) {
  pending.failure = status;
  pending.failure_message = message;
  for (auto& c : pending.by_rank) {
    if (c) c->worker->complete(c->request_id, status, message);
    c.reset();
  }
}

}  // namespace

struct Scheduler::Run {
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  uint64_t step = 0;
  std::vector<std::shared_ptr<Completer>> workers;
  std::vector<uint64_t> request_ids;
  std::vector<const char*> inputs;
  std::vector<char*> outputs;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  unsigned mean_divisor = 1;
  int64_t start_ns = 0;
  int32_t barrier_word = 0;  // what a cluster barrier allreduces
};

void Scheduler::submit(const std::shared_ptr<Job>& job_ref, int rank,
                       const std::shared_ptr<Completer>& worker, const SubmitEntry& entry) {
  PX_ASSERT_LOOP_THREAD();
  Job& job = *job_ref;
  Admission admission = admit(job, rank, *worker, entry);
  if (admission.status != PX_OK)  // the one place a refused entry is answered
    return worker->complete(entry.request_id, admission.status, admission.message);
  Variable* var = admission.var;
  if (!admission.step) return sparse_.run_single(job_ref, worker, *var, entry);

  auto key = std::make_pair(entry.opcode, entry.step);
  PendingStep& pending = var->pending[key];
  if (pending.by_rank.empty()) {
    pending.by_rank.resize(static_cast<size_t>(job.local_size()));
    pending.first_ns = monotonic_ns();
  }
  ++pending.arrived;
  bool everyone_arrived = pending.arrived == static_cast<uint32_t>(job.local_size());
  if (pending.failure == PX_OK && !admission.invalid.empty())
    fail_pending(pending, PX_ERR_INVALID, admission.invalid);
  if (pending.failure != PX_OK) {
    worker->complete(entry.request_id, pending.failure, pending.failure_message);
    if (everyone_arrived) var->pending.erase(key);
    return;
  }
  pending.by_rank[static_cast<size_t>(rank)] =
      Contribution{worker, entry.request_id, entry.in, entry.out, entry.root};
  if (!everyone_arrived) return;
  PendingStep complete_step = std::move(pending);
  var->pending.erase(key);
  if (var->sparse) {
    sparse_.run_step(job_ref, *var, static_cast<Opcode>(entry.opcode), entry.step,
                     std::move(complete_step));
    return;
  }
  if (entry.opcode != static_cast<uint16_t>(Opcode::kAllreduce) &&
      entry.opcode != static_cast<uint16_t>(Opcode::kBarrier)) {
    CopyStepContext context{offload_, fabric_, chunk_bytes_};
    return run_copy_step(context, job_ref, *var, entry.opcode, entry.step,
                         std::move(complete_step));
  }
  launch(job_ref, *var, entry.step, std::move(complete_step));
}

void Scheduler::fail_variable(Variable& var, px_status status, const std::string& why) {
  for (auto& [key, pending] : var.pending) {
    std::string message = why + step_suffix(var, key.first, key.second);
    for (auto& c : pending.by_rank)
      if (c) c->worker->complete(c->request_id, status, message);
  }
  var.pending.clear();
  sparse_.fail_in_flight(var, status, why);
}

void Scheduler::fail_job(Job& job, px_status status, const std::string& why) {
  for (auto& var : job.variables()) fail_variable(*var, status, why);
}

bool Scheduler::withdraw(Job& job, int local_rank, Completer& worker, uint64_t request_id,
                         const std::string& reason, std::string* message) {
  size_t rank = static_cast<size_t>(local_rank);
  for (auto& var : job.variables()) {
    for (auto& [key, pending] : var->pending) {
      if (rank >= pending.by_rank.size() || !pending.by_rank[rank] ||
          pending.by_rank[rank]->request_id != request_id)
        continue;
      std::string suffix = var->id == 0 ? " (barrier " + std::to_string(key.second) + ")"
                                        : step_suffix(*var, key.first, key.second);
      *message =
          worker.label() + " withdrew from its " + op_name(key.first) + ": " + reason + suffix;
      worker.complete(request_id, PX_ERR_CANCELLED, std::string("withdrawn: ") + reason + suffix);
      pending.by_rank[rank].reset();
      fail_pending(pending, PX_ERR_CANCELLED, *message);
      return true;
    }
  }
  return false;
}

std::vector<std::string> Scheduler::fail_stalled(Job& job, int64_t now_ns, int64_t stall_ns) {
  std::vector<std::string> failed;
  for (auto& var : job.variables()) {
    for (auto& [key, pending] : var->pending) {
      if (pending.failure != PX_OK || now_ns - pending.first_ns <= stall_ns) continue;
      std::string missing, waiting;
      for (size_t r = 0; r < pending.by_rank.size(); ++r) {
        std::string& list = pending.by_rank[r] ? waiting : missing;
        if (!list.empty()) list += ", ";
        if (pending.by_rank[r]) {
          list += std::to_string(r);
        } else {
          auto& member = job.members()[r];
          list += member ? member->label() : "local rank " + std::to_string(r) + " (gone)";
        }
      }
      std::string suffix = var->id == 0 ? " (barrier " + std::to_string(key.second) + ")"
                                        : step_suffix(*var, key.first, key.second);
      std::string message = std::string(op_name(key.first)) + " stalled: " + missing +
                            " did not submit it within " + std::to_string(stall_ns / 1000000) +
                            " ms of the first local worker (step_stall_ms); local ranks " +
                            waiting + " were waiting" + suffix;
      fail_pending(pending, PX_ERR_TIMEOUT, message);
      failed.push_back(message);
    }
  }
  return failed;
}

void Scheduler::launch(std::shared_ptr<Job> job, Variable& var, uint64_t step,
                       PendingStep pending) {
  auto run = std::make_shared<Run>();
  run->job = std::move(job);
  run->var = &var;
  run->step = step;
  run->dtype = var.fingerprint.dtype;
  run->op = var.fingerprint.op;
  run->count = var.id == 0 ? 0 : var.fingerprint.count;
  run->mean_divisor = static_cast<unsigned>(run->job->world().world_size);
  run->start_ns = monotonic_ns();
  var.stats.wait_ns += static_cast<uint64_t>(run->start_ns - pending.first_ns);
  for (auto& c : pending.by_rank) {
    char* base = c->worker->arena().base();
    run->workers.push_back(c->worker);
    run->request_ids.push_back(c->request_id);
    run->inputs.push_back(base + c->in.offset);
    run->outputs.push_back(base + c->out.offset);
  }
  if (!fabric_) {
    run_sliced(run, reduce_and_fan_out, [run] { finish(*run, PX_OK, ""); });
    return;
  }
  run_sliced(run, reduce_only, [this, run] { cross_node(run); });
}

void Scheduler::run_sliced(const std::shared_ptr<Run>& run, SliceWork work,
                           std::function<void()> then) {
  uint64_t bytes = run->count * dtype_size(run->dtype);
  // Up to one slice per kChunkBytes (and per pool thread), each a whole number of 64-byte
  // lines so no two threads write one line.
  offload_.run_sliced(
      bytes > kInlineReduceBytes, run->count, bytes / kChunkBytes, 64 / dtype_size(run->dtype),
      [run, work](size_t begin, size_t end) { work(*run, begin, end); }, std::move(then));
}

void Scheduler::cross_node(const std::shared_ptr<Run>& run) {
  Variable& var = *run->var;
  Job& job = *run->job;
  if (var.poison_status != PX_OK) return finish(*run, var.poison_status, var.poison_message);
  if (!job.broken().empty())
    return finish(*run, PX_ERR_PEER_LOST, job.broken() + step_suffix(var, run->step));
  uint32_t id = var.id == 0 ? job.barrier_id() : var.global_id;
  if (id == 0) {  // the nodes have not all registered the variable yet
    var.awaiting_global_id.push_back([this, run] { cross_node(run); });
    return;
  }
  RingAllreduceSpec spec;
  if (var.id == 0) {
    spec.buffer = &run->barrier_word;
    spec.count = 1;
    spec.dtype = DType::kI32;
    spec.tag_base = make_tag(operation_info(Opcode::kBarrier).tag, id, run->step);
  } else {
    spec.buffer = run->outputs[0];
    spec.count = run->count;
    spec.dtype = run->dtype;
    spec.op = run->op == ReduceOp::kMean ? ReduceOp::kSum : run->op;
    spec.tag_base = make_tag(operation_info(Opcode::kAllreduce).tag, id, run->step);
  }
  spec.chunk_bytes = chunk_bytes_;
  ThreadPool& pool = offload_.pool();
  start_ring_allreduce(
      *fabric_, spec, [&pool](std::function<void()> fn) { pool.submit(std::move(fn)); },
      [this, run](bool ok, const std::string& error) {
        offload_.post()([this, run, ok, error] { after_cross_node(run, ok, error); });
      });
}

void Scheduler::after_cross_node(const std::shared_ptr<Run>& run, bool ok,
                                 const std::string& error) {
  if (!ok) {
    Job& job = *run->job;
    std::string why =
        !job.broken().empty() ? job.broken() : "the ring allreduce across nodes failed: " + error;
    return finish(*run, PX_ERR_PEER_LOST, why + step_suffix(*run->var, run->step));
  }
  run_sliced(run, scale_and_fan_out, [run] { finish(*run, PX_OK, ""); });
}

void Scheduler::reduce_and_fan_out(Run& run, size_t begin, size_t end) {
  size_t elem = dtype_size(run.dtype);
  size_t chunk = std::max<size_t>(1, kChunkBytes / elem);
  size_t n = run.inputs.size();
  std::vector<const void*> sources(n);
  for (size_t at = begin; at < end; at += chunk) {
    size_t len = std::min(chunk, end - at);
    size_t offset = at * elem;
    for (size_t r = 0; r < n; ++r) sources[r] = run.inputs[r] + offset;
    char* result = run.outputs[0] + offset;
    reduce_buffers(run.dtype, run.op, result, sources.data(), n, len, run.mean_divisor);
    for (size_t r = 1; r < n; ++r) std::memcpy(run.outputs[r] + offset, result, len * elem);
  }
}

void Scheduler::reduce_only(Run& run, size_t begin, size_t end) {
  size_t elem = dtype_size(run.dtype);
  size_t n = run.inputs.size();
  std::vector<const void*> sources(n);
  for (size_t r = 0; r < n; ++r) sources[r] = run.inputs[r] + begin * elem;
  // Means are divided after the cross-node sum, by the global worker count.
  ReduceOp op = run.op == ReduceOp::kMean ? ReduceOp::kSum : run.op;
  reduce_buffers(run.dtype, op, run.outputs[0] + begin * elem, sources.data(), n, end - begin, 1);
}

void Scheduler::scale_and_fan_out(Run& run, size_t begin, size_t end) {
  size_t elem = dtype_size(run.dtype);
  size_t chunk = std::max<size_t>(1, kChunkBytes / elem);
  for (size_t at = begin; at < end; at += chunk) {
    size_t len = std::min(chunk, end - at);
    char* result = run.outputs[0] + at * elem;
    if (run.op == ReduceOp::kMean) {
      const void* self[1] = {result};
      reduce_buffers(run.dtype, ReduceOp::kMean, result, self, 1, len, run.mean_divisor);
    }
    for (size_t r = 1; r < run.outputs.size(); ++r)
      std::memcpy(run.outputs[r] + at * elem, result, len * elem);
  }
}

void Scheduler::finish(Run& run, px_status status, const std::string& message) {
  Variable& var = *run.var;
  if (status == PX_OK) {
    var.stats.ops += 1;
    if (var.id != 0) var.stats.bytes += var.fingerprint.bytes() * run.workers.size();
  }
  var.stats.reduce_ns += static_cast<uint64_t>(monotonic_ns() - run.start_ns);
  for (size_t r = 0; r < run.workers.size(); ++r)
    run.workers[r]->complete(run.request_ids[r], status, message);
}

}  // namespace px
