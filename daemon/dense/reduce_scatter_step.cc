#include "daemon/dense/reduce_scatter_step.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/observe/step_trace.h"
#include "transport/collectives/ring_reduce_scatter.h"
#include "transport/collectives/scratch_pool.h"
#include "transport/ipc/control_channel.h"  // monotonic_ns
#include "transport/kernels/reduce.h"

namespace px {
namespace {

// Steps up to this many bytes per worker stay on the loop thread (a pool hop costs more).
constexpr uint64_t kInlineBytes = 64 * 1024;
constexpr uint64_t kSliceBytes = 128 * 1024;

struct ReduceScatterRun {
  explicit ReduceScatterRun(const StepContext& c) : context(c) {}
  StepContext context;
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  uint64_t step = 0;
  uint8_t priority = 0;
  std::vector<std::shared_ptr<Completer>> workers;  // by local rank
  std::vector<uint64_t> request_ids;
  std::vector<const char*> inputs;  // world_size blocks each
  std::vector<char*> outputs;       // one block each
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;  // elements of a block
  int64_t start_ns = 0;
  ScratchBuffer reduced;  // cluster: the node's workers reduced, every block
  StepTrace trace;

  size_t elem() const { return dtype_size(dtype); }
  unsigned world_size() const { return static_cast<unsigned>(job->world().world_size); }
  std::string what() const {
    return "reduce_scatter of '" + var->name + "' step " + std::to_string(step);
  }
};

void finish(ReduceScatterRun& run, px_status status, const std::string& message) {
  Variable& var = *run.var;
  uint64_t bytes = var.fingerprint.bytes() * run.workers.size();
  if (status == PX_OK) {
    var.stats.ops += 1;
    var.stats.bytes += bytes;
  }
  var.stats.reduce_ns += static_cast<uint64_t>(monotonic_ns() - run.start_ns);
  trace_finished(run.trace, "reduce_scatter", status, status == PX_OK ? bytes : 0);
  for (size_t r = 0; r < run.workers.size(); ++r)
    run.workers[r]->complete(run.request_ids[r], status, message);
}

// One node: output r's elements [begin, end) reduced from every worker's block of rank r.
void reduce_blocks(ReduceScatterRun& run, size_t begin, size_t end) {
  size_t n = run.inputs.size(), elem = run.elem();
  int first_rank = run.job->world().rank_offset;
  std::vector<const void*> sources(n);
  for (size_t r = 0; r < run.outputs.size(); ++r) {
    size_t block = (static_cast<size_t>(first_rank) + r) * run.count;
    for (size_t w = 0; w < n; ++w) sources[w] = run.inputs[w] + (block + begin) * elem;
    reduce_buffers(run.dtype, run.op, run.outputs[r] + begin * elem, sources.data(), n, end - begin,
                   run.world_size());
  }
}

// Cluster, before the ring: every block of the node's workers reduced into run.reduced.
void reduce_local(ReduceScatterRun& run, size_t begin, size_t end) {
  size_t n = run.inputs.size(), elem = run.elem();
  std::vector<const void*> sources(n);
  for (size_t w = 0; w < n; ++w) sources[w] = run.inputs[w] + begin * elem;
  ReduceOp op = run.op == ReduceOp::kMean ? ReduceOp::kSum : run.op;  // divided at the end
  reduce_buffers(run.dtype, op, run.reduced.data() + begin * elem, sources.data(), n, end - begin,
                 1);
}

// Cluster, after the ring: each local worker's block (this node's segment) to its output, a
// mean divided on the way.
void scatter_local(ReduceScatterRun& run, size_t begin, size_t end) {
  size_t elem = run.elem();
  int first_rank = run.job->world().rank_offset;
  for (size_t r = 0; r < run.outputs.size(); ++r) {
    const char* block =
        run.reduced.data() + ((static_cast<size_t>(first_rank) + r) * run.count + begin) * elem;
    char* out = run.outputs[r] + begin * elem;
    if (run.op == ReduceOp::kMean) {
      const void* self[1] = {block};
      reduce_buffers(run.dtype, ReduceOp::kMean, out, self, 1, end - begin, run.world_size());
    } else {
      std::memcpy(out, block, (end - begin) * elem);
    }
  }
}

using ScatterSliceWork = void (*)(ReduceScatterRun& run, size_t begin, size_t end);

// work over [0, count) inline when small, else in slices on the pool; then `then` on the loop.
void run_scatter_sliced(const std::shared_ptr<ReduceScatterRun>& run, size_t count,
                        ScatterSliceWork work, std::function<void()> then) {
  uint64_t bytes = count * run->elem() * std::max<size_t>(1, run->workers.size());
  run->context.offload.run_sliced(
      bytes > kInlineBytes, count, bytes / kSliceBytes, std::max<size_t>(1, 64 / run->elem()),
      [run, work](size_t begin, size_t end) { work(*run, begin, end); }, std::move(then));
}

void across_nodes(const std::shared_ptr<ReduceScatterRun>& run) {
  Job& job = *run->job;
  Variable& var = *run->var;
  if (var.poison_status != PX_OK) return finish(*run, var.poison_status, var.poison_message);
  if (!job.broken().empty())
    return finish(*run, PX_ERR_PEER_LOST, job.broken() + " (" + run->what() + ")");
  if (var.global_id == 0) {  // the nodes have not all registered the variable yet
    var.awaiting_global_id.push_back([run] { across_nodes(run); });
    return;
  }
  RingReduceScatterSpec spec;
  spec.buffer = run->reduced.data();
  for (int size : job.world().node_sizes)
    spec.segment_count.push_back(static_cast<size_t>(size) * run->count);
  spec.dtype = run->dtype;
  spec.op = run->op;
  spec.tag_base = make_tag(TagKind::kReduceScatter, var.global_id, run->step);
  spec.priority = run->priority;
  spec.chunk_bytes = run->context.chunk_bytes;
  ThreadPool& pool = run->context.offload.pool();  // the received chunks are reduced there
  start_ring_reduce_scatter(
      *run->context.fabric, spec, [&pool](std::function<void()> fn) { pool.submit(std::move(fn)); },
      [run](bool ok, const std::string& error) {
        run->context.offload.post()([run, ok, error] {
          Job& job = *run->job;
          if (!ok) {
            std::string why = !job.broken().empty() ? job.broken() : "across nodes: " + error;
            return finish(*run, PX_ERR_PEER_LOST, why + " (" + run->what() + ")");
          }
          trace_stage(run->trace, "fan_out");
          run_scatter_sliced(run, run->count, scatter_local, [run] { finish(*run, PX_OK, ""); });
        });
      });
}

}  // namespace

void run_reduce_scatter_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                             uint64_t step, PendingStep pending) {
  PX_ASSERT_LOOP_THREAD();
  auto run = std::make_shared<ReduceScatterRun>(context);
  run->job = std::move(job);
  run->var = &var;
  run->step = step;
  run->priority = pending.priority;
  run->dtype = var.fingerprint.dtype;
  run->op = var.fingerprint.op;
  run->count = var.fingerprint.count;
  run->start_ns = monotonic_ns();
  var.stats.wait_ns += static_cast<uint64_t>(run->start_ns - pending.first_ns);
  trace_started(run->trace, run->job, var, "reduce_scatter", step, pending.first_ns);
  for (auto& c : pending.by_rank) {
    char* base = c->worker->arena().base();
    run->workers.push_back(c->worker);
    run->request_ids.push_back(c->request_id);
    run->inputs.push_back(base + c->in.offset);
    run->outputs.push_back(base + c->out.offset);
  }
  const JobWorld& world = run->job->world();
  if (!context.fabric || world.node_count <= 1) {
    trace_stage(run->trace, "reduce");
    return run_scatter_sliced(run, run->count, reduce_blocks, [run] { finish(*run, PX_OK, ""); });
  }
  run->reduced =
      ScratchBuffer::take(static_cast<size_t>(world.world_size) * run->count * run->elem());
  trace_stage(run->trace, "local_reduce");
  run_scatter_sliced(run, static_cast<size_t>(world.world_size) * run->count, reduce_local, [run] {
    trace_stage(run->trace, "cross_node");
    across_nodes(run);
  });
}

}  // namespace px
