#include "daemon/dense/allreduce_step.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/admission.h"
#include "daemon/dense/cross_node_allreduce.h"
#include "daemon/dense/cross_node_route.h"
#include "daemon/dense/device_allreduce_step.h"
#include "daemon/observe/step_trace.h"
#include "transport/ipc/control_channel.h"
#include "transport/kernels/reduce.h"

namespace px {
namespace {

// Steps up to this many bytes per worker are reduced on the loop thread: handing them to
// the pool would cost more (a thread wake-up each way) than the reduction itself.
constexpr uint64_t kInlineReduceBytes = 64 * 1024;
// Work per pool task chunk: reduce a chunk, then copy it to the other outputs while hot.
constexpr uint64_t kChunkBytes = 128 * 1024;

struct Run {
  explicit Run(const StepContext& c) : context(c) {}
  StepContext context;
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  uint64_t step = 0;
  uint8_t priority = 0;  // of the step's sends on the fabric (PendingStep::priority)
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
  StepTrace trace;           // metrics, timeline, stall report (observe/)
};

// The three kinds of slice work; a plain function pointer, so a slice calls no
// std::function.
using SliceWork = void (*)(Run& run, size_t begin, size_t end);

// Single node: each chunk is reduced into the first output, then copied to the others
// while it is still in cache.
void reduce_and_fan_out(Run& run, size_t begin, size_t end) {
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

// Cluster, before the ring: the local sum (or min, max, product) into the first output.
void reduce_only(Run& run, size_t begin, size_t end) {
  size_t elem = dtype_size(run.dtype);
  size_t n = run.inputs.size();
  std::vector<const void*> sources(n);
  for (size_t r = 0; r < n; ++r) sources[r] = run.inputs[r] + begin * elem;
  // Means are divided after the cross-node sum, by the global worker count.
  ReduceOp op = run.op == ReduceOp::kMean ? ReduceOp::kSum : run.op;
  reduce_buffers(run.dtype, op, run.outputs[0] + begin * elem, sources.data(), n, end - begin, 1);
}

// Cluster, after the ring: a mean divided, then the result copied to the other outputs.
void scale_and_fan_out(Run& run, size_t begin, size_t end) {
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

void finish(Run& run, px_status status, const std::string& message) {
  Variable& var = *run.var;
  uint64_t bytes = var.id == 0 ? 0 : var.fingerprint.bytes() * run.workers.size();
  if (status == PX_OK) {
    var.stats.ops += 1;
    var.stats.bytes += bytes;
  }
  var.stats.route = "";  // the plain host allreduce (device steps name theirs)
  var.stats.reduce_ns += static_cast<uint64_t>(monotonic_ns() - run.start_ns);
  trace_finished(run.trace, var.id == 0 ? "barrier" : "allreduce", status,
                 status == PX_OK ? bytes : 0);
  for (size_t r = 0; r < run.workers.size(); ++r)
    run.workers[r]->complete(run.request_ids[r], status, message);
}

// Runs work over [0, count) (inline when small, else in slices on the pool), then `then`
// on the loop thread.
void run_sliced(const std::shared_ptr<Run>& run, SliceWork work, std::function<void()> then) {
  uint64_t bytes = run->count * dtype_size(run->dtype);
  // Up to one slice per kChunkBytes (and per pool thread), each a whole number of 64-byte
  // lines so no two threads write one line.
  run->context.offload.run_sliced(
      bytes > kInlineReduceBytes, run->count, bytes / kChunkBytes, 64 / dtype_size(run->dtype),
      [run, work](size_t begin, size_t end) { work(*run, begin, end); }, std::move(then));
}

void ring(const std::shared_ptr<Run>& run) {
  CrossNodeAllreduce spec;
  if (run->var->id == 0) {
    spec.buffer = &run->barrier_word;
    spec.count = 1;
    spec.dtype = DType::kI32;
  } else {
    spec.buffer = run->outputs[0];
    spec.count = run->count;
    spec.dtype = run->dtype;
    spec.op = run->op == ReduceOp::kMean ? ReduceOp::kSum : run->op;
  }
  spec.priority = run->priority;
  start_cross_node_allreduce(run->context, run->job, *run->var, run->step, spec,
                             [run](px_status status, const std::string& message) {
                               if (status != PX_OK) return finish(*run, status, message);
                               trace_stage(run->trace, "fan_out");
                               run_sliced(run, scale_and_fan_out,
                                          [run] { finish(*run, PX_OK, ""); });
                             });
}

// The step once its route is known: the ring, or a refusal (nothing is built on the way to
// the ring: this is every host step's path).
void after_route(const std::shared_ptr<Run>& run, px_status status, const std::string& message) {
  Variable& var = *run->var;
  if (status == PX_OK && var.route.state != CrossNodeRoute::State::kNccl) return ring(run);
  std::string suffix = step_suffix(var, static_cast<uint16_t>(Opcode::kAllreduce), run->step);
  if (status != PX_OK) return finish(*run, status, message + suffix);
  std::string why =
      "this node gave host memory, but the variable crosses nodes over NCCL (agreed on "
      "its first step, in device memory on every node)" +
      suffix;
  finish(*run, PX_ERR_INVALID, why);
  end_job_for_local_failure(run->context, *run->job, why);
}

// In a job whose nodes can all run NCCL the variable's route is agreed first (this node's
// part is host memory: the host ring, unless the route was agreed as NCCL by an earlier
// step in device memory on every node, which this step cannot join).
void cross_node(const std::shared_ptr<Run>& run) {
  if (!route_pending(run->context, *run->job, *run->var)) return after_route(run, PX_OK, "");
  with_cross_node_route(
      run->context, run->job, *run->var, -1,
      [run](px_status status, const std::string& message) { after_route(run, status, message); });
}

}  // namespace

void run_allreduce_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                        uint64_t step, PendingStep pending) {
  PX_ASSERT_LOOP_THREAD();
  for (auto& c : pending.by_rank)
    if (c->in.memory_kind == static_cast<uint32_t>(MemoryKind::kCudaDevice))
      return run_device_allreduce_step(context, std::move(job), var, step, std::move(pending));
  auto run = std::make_shared<Run>(context);
  run->job = std::move(job);
  run->var = &var;
  run->step = step;
  run->priority = pending.priority;
  run->dtype = var.fingerprint.dtype;
  run->op = var.fingerprint.op;
  run->count = var.id == 0 ? 0 : var.fingerprint.count;  // a barrier reduces no data
  run->mean_divisor = static_cast<unsigned>(run->job->world().world_size);
  run->start_ns = monotonic_ns();
  var.stats.wait_ns += static_cast<uint64_t>(run->start_ns - pending.first_ns);
  trace_started(run->trace, run->job, var, var.id == 0 ? "barrier" : "allreduce", step,
                pending.first_ns);
  for (auto& c : pending.by_rank) {
    char* base = c->worker->arena().base();
    run->workers.push_back(c->worker);
    run->request_ids.push_back(c->request_id);
    run->inputs.push_back(base + c->in.offset);
    run->outputs.push_back(base + c->out.offset);
  }
  if (!run->context.fabric) {
    trace_stage(run->trace, "reduce_fan_out");
    run_sliced(run, reduce_and_fan_out, [run] { finish(*run, PX_OK, ""); });
    return;
  }
  trace_stage(run->trace, "local_reduce");
  run_sliced(run, reduce_only, [run] {
    trace_stage(run->trace, "cross_node");
    cross_node(run);
  });
}

}  // namespace px
