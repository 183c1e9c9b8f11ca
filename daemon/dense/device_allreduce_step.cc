#include "daemon/dense/device_allreduce_step.h"

#include <string>
#include <vector>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/admission.h"
#include "daemon/observe/step_trace.h"
#include "transport/ipc/control_channel.h"  // monotonic_ns

namespace px {
namespace {

struct DeviceRun {
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  uint64_t step = 0;
  std::vector<std::shared_ptr<Completer>> workers;
  std::vector<uint64_t> request_ids;
  // The workers' mappings, held until the step ends: a px_free meanwhile cannot close them.
  std::vector<std::shared_ptr<gpu::DeviceMapping>> held;
  gpu::DeviceAllreduce args;
  bool ok = false;
  std::string why;
  int64_t start_ns = 0;
  StepTrace trace;
};

void finish(DeviceRun& run, px_status status, const std::string& message) {
  Variable& var = *run.var;
  uint64_t bytes = var.fingerprint.bytes() * run.workers.size();
  if (status == PX_OK) {
    var.stats.ops += 1;
    var.stats.bytes += bytes;
  }
  var.stats.reduce_ns += static_cast<uint64_t>(monotonic_ns() - run.start_ns);
  trace_finished(run.trace, "allreduce", status, status == PX_OK ? bytes : 0);
  run.held.clear();  // on the loop, before the workers hear: a px_free after it may close them
  for (size_t r = 0; r < run.workers.size(); ++r)
    run.workers[r]->complete(run.request_ids[r], status, message);
}

// The device pointer of ref in worker's regions, held in run; null with why.
void* resolve(DeviceRun& run, const Completer& worker, const BufferRef& ref, std::string* why) {
  const gpu::DeviceRegions* regions = worker.device_regions();
  auto mapping = regions ? regions->find(ref.region, ref.offset, ref.bytes, why) : nullptr;
  if (!mapping) {
    if (!regions) *why = "no device memory registered";
    return nullptr;
  }
  void* p = static_cast<char*>(mapping->pointer()) + ref.offset;
  if (run.held.empty()) run.args.device = mapping->device();
  if (mapping->device() != run.args.device) {
    *why = "its buffer is on another GPU than the first worker's (one GPU per node's step so far)";
    return nullptr;
  }
  run.held.push_back(std::move(mapping));
  return p;
}

}  // namespace

void run_device_allreduce_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                               uint64_t step, PendingStep pending) {
  PX_ASSERT_LOOP_THREAD();
  auto run = std::make_shared<DeviceRun>();
  run->job = std::move(job);
  run->var = &var;
  run->step = step;
  run->start_ns = monotonic_ns();
  var.stats.wait_ns += static_cast<uint64_t>(run->start_ns - pending.first_ns);
  trace_started(run->trace, run->job, var, "allreduce", step, pending.first_ns);
  std::string suffix = step_suffix(var, static_cast<uint16_t>(Opcode::kAllreduce), step);
  std::string problem;
  px_status status = PX_ERR_INVALID;
  for (auto& c : pending.by_rank) {
    run->workers.push_back(c->worker);
    run->request_ids.push_back(c->request_id);
    if (!problem.empty()) continue;
    if (c->in.memory_kind != static_cast<uint32_t>(MemoryKind::kCudaDevice)) {
      problem = c->worker->label() +
                " gave host memory where the other local workers gave "
                "device memory (all or none)";
      continue;
    }
    std::string why;
    const void* in = resolve(*run, *c->worker, c->in, &why);
    void* out = in ? resolve(*run, *c->worker, c->out, &why) : nullptr;
    if (!out) {
      problem = c->worker->label() + ": " + why;
      continue;
    }
    run->args.inputs.push_back(in);
    run->args.outputs.push_back(out);
  }
  if (problem.empty() && !context.gpu) {
    status = PX_ERR_NOT_IMPLEMENTED;
    problem = "this parallaxd has no usable GPU";
  }
  if (problem.empty() && context.fabric) {
    status = PX_ERR_NOT_IMPLEMENTED;
    problem =
        "device memory across nodes (NCCL, or the host ring through pinned memory) is "
        "not built yet: one node only (README, Limits)";
  }
  if (!problem.empty()) return finish(*run, status, problem + suffix);
  run->args.dtype = var.fingerprint.dtype;
  run->args.op = var.fingerprint.op;
  run->args.count = var.fingerprint.count;
  run->args.mean_divisor = static_cast<unsigned>(run->job->world().world_size);
  trace_stage(run->trace, "gpu_reduce_fan_out");
  gpu::GpuBackend* backend = context.gpu;
  context.offload.run(
      true, [run, backend] { run->ok = backend->allreduce_local(run->args, &run->why); },
      [run, suffix] {
        if (!run->ok) return finish(*run, PX_ERR_INTERNAL, "gpu allreduce: " + run->why + suffix);
        finish(*run, PX_OK, "");
      });
}

}  // namespace px
