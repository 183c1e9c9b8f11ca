#include "daemon/dense/device_allreduce_step.h"

#include <string>
#include <vector>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/admission.h"
#include "daemon/dense/cross_node_allreduce.h"
#include "daemon/dense/cross_node_route.h"
#include "daemon/dense/device_staging.h"
#include "daemon/observe/step_trace.h"
#include "transport/ipc/control_channel.h"  // monotonic_ns
#include "transport/kernels/reduce.h"

namespace px {
namespace {

// The route labels of device steps (metrics, timeline, pxctl vars): the node's reduction
// on the GPU, alone or with the host ring across nodes.
constexpr const char* kGpuLocal = "gpu-local";
constexpr const char* kGpuHostRing = "gpu-host-ring";
constexpr const char* kGpuNccl = "gpu-nccl";

struct DeviceRun {
  explicit DeviceRun(const StepContext& c) : context(c) {}
  StepContext context;
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  uint64_t step = 0;
  std::vector<std::shared_ptr<Completer>> workers;
  std::vector<uint64_t> request_ids;
  // The workers' mappings, held until the step ends: a px_free meanwhile cannot close them.
  std::vector<std::shared_ptr<gpu::DeviceMapping>> held;
  gpu::DeviceAllreduce args;
  // Cross-node: the node's sum in pinned host memory, for the ring. Taken from the variable
  // and given back at the end (a step still running keeps its own).
  std::shared_ptr<gpu::HostStaging> staging;
  ReduceOp op = ReduceOp::kSum;  // the variable's (args.op is kSum for a cross-node mean)
  uint8_t priority = 0;
  const char* route = kGpuLocal;
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
  var.stats.route = run.route;
  trace_finished(run.trace, run.route, status, status == PX_OK ? bytes : 0);
  keep_staging(var, &run.staging);
  run.held.clear();  // on the loop, before the workers hear: a px_free after it may close them
  for (size_t r = 0; r < run.workers.size(); ++r)
    run.workers[r]->complete(run.request_ids[r], status, message);
}

// Failed here before the cross-node stage (end_job_for_local_failure).
void fail_before_cross_node(DeviceRun& run, px_status status, const std::string& message) {
  finish(run, status, message);
  end_job_for_local_failure(run.context, *run.job, message);
}

// The device pointer of ref in worker's regions, held in run, and its device; null with
// why. (Workers may sit on different GPUs; admission keeps each one's in and out on one.)
void* resolve(DeviceRun& run, const Completer& worker, const BufferRef& ref, int* device,
              std::string* why) {
  auto mapping = find_device_buffer(worker, ref, why);
  if (!mapping) return nullptr;
  void* p = static_cast<char*>(mapping->pointer()) + ref.offset;
  *device = mapping->device();
  run.held.push_back(std::move(mapping));
  return p;
}

// Over NCCL: the node's sum reduced into the first worker's output on the GPU; once every
// node's is ready, the step's turn (the order every node issues NCCL operations in) puts it
// on the job's communicator, summed in place across nodes; then a mean divided and the
// result copied to the other workers, on the GPU.
void nccl_cross_node(const std::shared_ptr<DeviceRun>& run, const std::string& suffix) {
  run->route = kGpuNccl;
  Job& job = *run->job;
  uint32_t comm = run->var->route.comm;
  int comm_device = communicator_device(job, comm);
  if (comm_device < 0)  // made with the variable's route: gone, the run ended here
    return finish(*run, PX_ERR_PEER_LOST,
                  "the job's NCCL communicators are gone (its run ended here)" + suffix);
  if (comm_device != run->args.device)
    return fail_before_cross_node(
        *run, PX_ERR_INVALID,
        "the variable crosses nodes over NCCL on GPU " + std::to_string(comm_device) +
            " (where its first step's sum was) but this step's sum is on GPU " +
            std::to_string(run->args.device) + suffix);
  trace_stage(run->trace, "gpu_reduce");
  gpu::GpuBackend* backend = run->context.gpu;
  run->args.fan_out = false;
  run->context.offload.run(
      true, [run, backend] { run->ok = backend->allreduce_local(run->args, &run->why); },
      [run, suffix, comm] {
        if (!run->ok) return fail_before_cross_node(*run, PX_ERR_INTERNAL, run->why + suffix);
        trace_stage(run->trace, "nccl_turn");
        await_turn(
            run->context, run->job, *run->var, run->step,
            [run, suffix, comm](px_status status, const std::string& message) {
              if (status != PX_OK) return finish(*run, status, message + suffix);
              trace_stage(run->trace, "nccl_allreduce");
              int timeout = run->context.nccl_timeout_ms;
              run_on_communicator(
                  run->job, comm,
                  [run, timeout](gpu::NcclCommunicator& c, std::string* why) {
                    return c.allreduce(run->args.outputs[0], run->args.count, run->args.dtype,
                                       run->args.op, timeout, why);
                  },
                  [run, suffix](bool ok, bool aborted, const std::string& why) {
                    std::string message = "the allreduce across nodes over NCCL failed: " + why;
                    // Aborted: the job failed or its run ended (each ends it everywhere).
                    if (!ok && aborted) return finish(*run, PX_ERR_PEER_LOST, message + suffix);
                    // Else the communicator is gone for every later step too: the job ends.
                    if (!ok)
                      return fail_before_cross_node(*run, PX_ERR_PEER_LOST, message + suffix);
                    trace_stage(run->trace, "gpu_fan_out");
                    run->args.op = run->op;
                    gpu::GpuBackend* backend = run->context.gpu;
                    run->context.offload.run(
                        true,
                        [run, backend] {
                          run->ok = backend->finish_on_device(run->args, &run->why);
                        },
                        [run, suffix] {
                          if (!run->ok) return finish(*run, PX_ERR_INTERNAL, run->why + suffix);
                          finish(*run, PX_OK, "");
                        });
                  });
            });
      });
}

// Across nodes, through the host: the node's sum on the GPU, copied to pinned memory; the
// host ring (or recursive doubling) on it; a mean divided there as the host path divides it
// (bitwise the same results on host and device nodes); then copied to every worker.
void host_ring_cross_node(const std::shared_ptr<DeviceRun>& run, const std::string& suffix) {
  gpu::GpuBackend* backend = run->context.gpu;
  size_t bytes = run->args.count * dtype_size(run->args.dtype);
  run->staging = take_staging(*run->var, bytes);
  trace_stage(run->trace, "gpu_reduce_to_host");
  run->context.offload.run(
      true,
      [run, backend, bytes] {
        run->ok = ensure_staging(*backend, run->args.device, bytes, &run->staging, &run->why) &&
                  backend->reduce_local_to_host(run->args, run->staging->data(), &run->why);
      },
      [run, suffix] {
        if (!run->ok) return fail_before_cross_node(*run, PX_ERR_INTERNAL, run->why + suffix);
        trace_stage(run->trace, "cross_node");
        CrossNodeAllreduce spec;
        spec.buffer = run->staging->data();
        spec.count = run->args.count;
        spec.dtype = run->args.dtype;
        spec.op = run->args.op;
        spec.priority = run->priority;
        start_cross_node_allreduce(
            run->context, run->job, *run->var, run->step, spec,
            [run, suffix](px_status status, const std::string& message) {
              if (status != PX_OK) return finish(*run, status, message);
              trace_stage(run->trace, "gpu_fan_out");
              gpu::GpuBackend* backend = run->context.gpu;
              run->context.offload.run(
                  true,
                  [run, backend] {
                    void* result = run->staging->data();
                    if (run->op == ReduceOp::kMean) {
                      const void* self[1] = {result};
                      reduce_buffers(run->args.dtype, ReduceOp::kMean, result, self, 1,
                                     run->args.count, run->args.mean_divisor);
                    }
                    run->ok = backend->copy_from_host(run->args, result, &run->why);
                  },
                  [run, suffix] {
                    if (!run->ok) return finish(*run, PX_ERR_INTERNAL, run->why + suffix);
                    finish(*run, PX_OK, "");
                  });
            });
      });
}

// Across nodes: the variable's route (agreed on its first step where every node could run
// NCCL, else the host ring).
void cross_node(const std::shared_ptr<DeviceRun>& run, const std::string& suffix) {
  with_cross_node_route(run->context, run->job, *run->var, run->args.device,
                        [run, suffix](px_status status, const std::string& message) {
                          if (status != PX_OK) return finish(*run, status, message + suffix);
                          if (run->var->route.state == CrossNodeRoute::State::kNccl)
                            return nccl_cross_node(run, suffix);
                          host_ring_cross_node(run, suffix);
                        });
}

}  // namespace

void run_device_allreduce_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                               uint64_t step, PendingStep pending) {
  PX_ASSERT_LOOP_THREAD();
  auto run = std::make_shared<DeviceRun>(context);
  run->job = std::move(job);
  run->var = &var;
  run->step = step;
  run->priority = pending.priority;
  run->route = context.fabric ? kGpuHostRing : kGpuLocal;
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
    int device = 0;
    const void* in = resolve(*run, *c->worker, c->in, &device, &why);
    void* out = in ? resolve(*run, *c->worker, c->out, &device, &why) : nullptr;
    if (!out) {
      problem = c->worker->label() + ": " + why;
      continue;
    }
    run->args.inputs.push_back(in);
    run->args.outputs.push_back(out);
    run->args.devices.push_back(device);
  }
  if (problem.empty() && !context.gpu) {
    status = PX_ERR_NOT_IMPLEMENTED;
    problem = "this parallaxd has no usable GPU";
  }
  if (!problem.empty()) return fail_before_cross_node(*run, status, problem + suffix);
  run->op = var.fingerprint.op;
  run->args.device = run->args.devices[0];  // the first worker's GPU reduces
  run->args.dtype = var.fingerprint.dtype;
  run->args.count = var.fingerprint.count;
  run->args.mean_divisor = static_cast<unsigned>(run->job->world().world_size);
  if (context.fabric) {
    // Summed here and across nodes; a mean is divided once, at the end.
    run->args.op = run->op == ReduceOp::kMean ? ReduceOp::kSum : run->op;
    return cross_node(run, suffix);
  }
  run->args.op = run->op;
  trace_stage(run->trace, "gpu_reduce_fan_out");
  gpu::GpuBackend* backend = context.gpu;
  context.offload.run(
      true, [run, backend] { run->ok = backend->allreduce_local(run->args, &run->why); },
      [run, suffix] {
        if (!run->ok) return finish(*run, PX_ERR_INTERNAL, run->why + suffix);
        finish(*run, PX_OK, "");
      });
}

}  // namespace px
