#include "daemon/dense/copy_step.h"

#include <cstring>
#include <string>
#include <vector>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/device_staging.h"
#include "daemon/dense/host_copies.h"
#include "daemon/observe/step_trace.h"
#include "transport/collectives/chain_broadcast.h"
#include "transport/collectives/ring_allgatherv.h"

namespace px {
namespace {

struct CopyRun {
  explicit CopyRun(const StepContext& c) : context(c) {}
  StepContext context;
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  Opcode opcode = Opcode::kBroadcast;
  uint64_t step = 0;
  uint8_t priority = 0;  // of the step's sends on the fabric (PendingStep::priority)
  std::vector<std::shared_ptr<Completer>> workers;  // by local rank
  std::vector<uint64_t> request_ids;
  std::vector<const char*> inputs;
  std::vector<uint64_t> input_bytes;
  std::vector<char*> outputs;
  std::vector<uint64_t> output_bytes;
  uint64_t out_bytes = 0;
  int root = 0;                      // broadcast: global rank
  std::vector<uint64_t> rank_bytes;  // allgather(v): each global rank's block
  StepTrace trace;                   // metrics, timeline, stall report (observe/)
  // Where the whole result is assembled before the fan-out: outputs[0], or (device memory
  // across nodes) the pinned staging the chain broadcast runs on.
  char* result = nullptr;
  // A broadcast on device memory (px_alloc_ex regions the daemon mapped): inputs and
  // outputs are device pointers on `device`, copied by the GPU backend; the workers'
  // mappings are held until the step ends.
  bool on_device = false;
  int device = 0;
  std::vector<std::shared_ptr<gpu::DeviceMapping>> held;
  std::shared_ptr<gpu::HostStaging> staging;
  bool crossed = false;  // the cross-node stage ran (a failure after it leaves no node waiting)

  std::string what() const {
    return std::string(operation_info(opcode).name) + " of '" + var->name + "' step " +
           std::to_string(step);
  }
};

void finish(CopyRun& run, px_status status, const std::string& message) {
  uint64_t bytes = run.out_bytes * run.workers.size();
  if (status == PX_OK) {
    run.var->stats.ops += 1;
    run.var->stats.bytes += bytes;
  }
  const char* name = operation_info(run.opcode).name;  // the route is the collective
  trace_finished(run.trace, name, status, status == PX_OK ? bytes : 0);
  keep_staging(*run.var, &run.staging);
  run.held.clear();  // on the loop, before the workers hear: a px_free after it may close them
  for (size_t r = 0; r < run.workers.size(); ++r)
    run.workers[r]->complete(run.request_ids[r], status, message);
}

// A device step that failed here (before the cross-node stage: end_job_for_local_failure).
void fail_on_device(CopyRun& run, px_status status, const std::string& why) {
  std::string message = why + " (" + run.what() + ")";
  finish(run, status, message);
  if (!run.crossed) end_job_for_local_failure(run.context, *run.job, message);
}

// Runs the copies inline when small, else as one pool task, then `then` on the loop.
void run_copies(const std::shared_ptr<CopyRun>& run, std::vector<HostCopy> copies,
                std::function<void()> then) {
  if (run->on_device) {  // through the GPU backend, on the pool
    auto why = std::make_shared<std::string>();
    gpu::GpuBackend* gpu = run->context.gpu;
    run->context.offload.run(
        true,
        [run, gpu, why, copies = std::move(copies)] {
          for (const HostCopy& c : copies)
            if (c.to != c.from && c.bytes > 0 &&
                !gpu->copy(run->device, c.to, c.from, c.bytes, why.get()))
              return;
          why->clear();
        },
        [run, why, then = std::move(then)] {
          if (!why->empty()) return fail_on_device(*run, PX_ERR_INTERNAL, *why);
          then();
        });
    return;
  }
  run_host_copies(run->context.offload, std::move(copies), std::move(then));
}

// Where each global rank's block starts in the output.
uint64_t block_offset(const CopyRun& run, int rank) {
  uint64_t at = 0;
  for (int k = 0; k < rank; ++k) at += run.rank_bytes[static_cast<size_t>(k)];
  return at;
}

// Every local worker's output gets the whole result (the first's holds it already, unless
// it was assembled in staging).
void fan_out(const std::shared_ptr<CopyRun>& run) {
  run->crossed = true;
  trace_stage(run->trace, "fan_out");
  std::vector<HostCopy> copies;
  for (size_t r = 0; r < run->outputs.size(); ++r)
    if (run->outputs[r] != run->result)
      copies.push_back({run->outputs[r], run->result, run->out_bytes});
  run_copies(run, std::move(copies), [run] { finish(*run, PX_OK, ""); });
}

void across_nodes(const std::shared_ptr<CopyRun>& run) {
  Job& job = *run->job;
  Variable& var = *run->var;
  if (var.poison_status != PX_OK) return finish(*run, var.poison_status, var.poison_message);
  if (!job.broken().empty())
    return finish(*run, PX_ERR_PEER_LOST, job.broken() + " (" + run->what() + ")");
  if (var.global_id == 0) {  // the nodes have not all registered the variable yet
    var.awaiting_global_id.push_back([run] { across_nodes(run); });
    return;
  }
  auto done = [run](bool ok, const std::string& error) {
    run->context.offload.post()([run, ok, error] {
      if (ok) return fan_out(run);
      Job& job = *run->job;
      std::string why = !job.broken().empty() ? job.broken() : "across nodes: " + error;
      finish(*run, PX_ERR_PEER_LOST, why + " (" + run->what() + ")");
    });
  };
  const JobWorld& world = job.world();
  if (run->opcode == Opcode::kBroadcast) {
    BroadcastSpec spec;
    spec.buffer = run->result;
    spec.bytes = run->out_bytes;
    spec.root = world.node_of_rank(run->root);
    spec.tag_base = make_tag(operation_info(run->opcode).tag, var.global_id, run->step);
    spec.chunk_bytes = run->context.chunk_bytes;
    spec.priority = run->priority;
    return start_chain_broadcast(*run->context.fabric, spec, done);
  }
  AllgathervSpec spec;
  spec.buffer = run->result;
  int first = 0;
  for (int size : world.node_sizes) {
    uint64_t bytes = 0;
    for (int k = first; k < first + size; ++k) bytes += run->rank_bytes[static_cast<size_t>(k)];
    spec.block_bytes.push_back(bytes);
    first += size;
  }
  // Allgather and allgatherv count their steps apart: their tags differ (operation.h).
  spec.tag_base = make_tag(operation_info(run->opcode).tag, var.global_id, run->step);
  spec.chunk_bytes = run->context.chunk_bytes;
  spec.priority = run->priority;
  start_ring_allgatherv(*run->context.fabric, spec, done);
}

// Reads and checks each local worker's counts header (allgatherv); empty if all agree.
std::string read_counts(CopyRun& run, uint64_t elem) {
  size_t world = static_cast<size_t>(run.job->world().world_size);
  uint64_t header = world * sizeof(uint64_t);
  for (size_t r = 0; r < run.inputs.size(); ++r) {
    if (run.input_bytes[r] < header) return run.workers[r]->label() + " sent no counts";
    std::vector<uint64_t> counts(world);
    std::memcpy(counts.data(), run.inputs[r], header);  // a copy: the client may scribble
    if (r == 0) {
      run.rank_bytes.resize(world);
      for (size_t k = 0; k < world; ++k) {
        if (counts[k] > run.var->fingerprint.count)
          return run.workers[r]->label() + " gave counts[" + std::to_string(k) +
                 "] = " + std::to_string(counts[k]) + ", above the variable's count " +
                 std::to_string(run.var->fingerprint.count);
        run.rank_bytes[k] = counts[k] * elem;
      }
    } else {
      for (size_t k = 0; k < world; ++k)
        if (counts[k] * elem != run.rank_bytes[k])
          return run.workers[r]->label() + " gave other counts than " + run.workers[0]->label() +
                 " (counts[" + std::to_string(k) + "])";
    }
  }
  int offset = run.job->world().rank_offset;
  for (size_t r = 0; r < run.inputs.size(); ++r) {
    if (run.input_bytes[r] != header + run.rank_bytes[static_cast<size_t>(offset) + r])
      return run.workers[r]->label() + " sent a block of another size than its count";
    run.inputs[r] += header;
    run.input_bytes[r] -= header;
  }
  uint64_t total = 0;
  for (uint64_t b : run.rank_bytes) total += b;
  for (size_t r = 0; r < run.outputs.size(); ++r)
    if (run.output_bytes[r] != total)
      return run.workers[r]->label() + "'s output holds " + std::to_string(run.output_bytes[r]) +
             " bytes, the blocks its counts name " + std::to_string(total);
  return "";
}

// The local stage into run->result (the root's input, or every local worker's block),
// then the cross-node stage or the fan-out.
void start_copies(const std::shared_ptr<CopyRun>& run, bool cluster) {
  const JobWorld& world = run->job->world();
  std::vector<HostCopy> local;
  if (run->opcode == Opcode::kBroadcast) {
    int root_local = run->root - world.rank_offset;
    if (root_local >= 0 && root_local < static_cast<int>(run->inputs.size()))
      local.push_back({run->result, run->inputs[static_cast<size_t>(root_local)], run->out_bytes});
  } else {
    for (size_t r = 0; r < run->inputs.size(); ++r)
      local.push_back({run->result + block_offset(*run, world.rank_offset + static_cast<int>(r)),
                       run->inputs[r], run->input_bytes[r]});
  }
  trace_stage(run->trace, "local_copy");
  run_copies(run, std::move(local), [run, cluster] {
    if (cluster) {
      trace_stage(run->trace, "cross_node");
      return across_nodes(run);
    }
    fan_out(run);
  });
}

// Device memory: every contribution's buffers resolved in its worker's regions (one
// device), or what is wrong. Empty if none is device memory.
std::string resolve_device(CopyRun& run, const PendingStep& pending) {
  auto kind = static_cast<uint32_t>(MemoryKind::kCudaDevice);
  run.on_device = pending.by_rank[0]->in.memory_kind == kind;
  if (!run.on_device) {
    for (const auto& c : pending.by_rank)
      if (c->in.memory_kind == kind)
        return c->worker->label() + " gave device memory where local rank 0 gave host memory";
    return "";
  }
  if (!run.context.gpu) return "this parallaxd has no usable GPU";
  for (size_t r = 0; r < pending.by_rank.size(); ++r) {
    const Contribution& c = *pending.by_rank[r];
    if (c.in.memory_kind != kind)
      return c.worker->label() + " gave host memory where local rank 0 gave device memory";
    std::string why;
    auto in = find_device_buffer(*c.worker, c.in, &why);
    auto out = in ? find_device_buffer(*c.worker, c.out, &why) : nullptr;
    if (!out) return c.worker->label() + ": " + why;
    // Workers may sit on different GPUs: the backend's copies go between them (peer
    // copies); the staging copies are made on local rank 0's.
    if (r == 0) run.device = in->device();
    run.inputs[r] = static_cast<const char*>(in->pointer()) + c.in.offset;
    run.outputs[r] = static_cast<char*>(out->pointer()) + c.out.offset;
    run.held.push_back(std::move(in));
    run.held.push_back(std::move(out));
  }
  return "";
}

}  // namespace

void run_copy_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                   uint16_t opcode, uint64_t step, PendingStep pending) {
  PX_ASSERT_LOOP_THREAD();
  auto run = std::make_shared<CopyRun>(context);
  run->job = std::move(job);
  run->var = &var;
  run->opcode = static_cast<Opcode>(opcode);
  run->step = step;
  run->priority = pending.priority;
  trace_started(run->trace, run->job, var, operation_info(opcode).name, step, pending.first_ns);
  const JobWorld& world = run->job->world();
  uint64_t elem = dtype_size(var.fingerprint.dtype);
  std::string invalid;
  for (auto& c : pending.by_rank) {
    char* base = c->worker->arena().base();
    run->workers.push_back(c->worker);
    run->request_ids.push_back(c->request_id);
    run->inputs.push_back(base + c->in.offset);
    run->input_bytes.push_back(c->in.bytes);
    run->outputs.push_back(base + c->out.offset);
    // (allgatherv: read_counts names the counts that differ first)
    if (invalid.empty() && c->out.bytes != pending.by_rank[0]->out.bytes &&
        run->opcode != Opcode::kAllgatherv)
      invalid = c->worker->label() + "'s output has another size than local rank 0's";
    run->output_bytes.push_back(c->out.bytes);
    if (invalid.empty() && run->opcode == Opcode::kBroadcast && c->root != pending.by_rank[0]->root)
      invalid = c->worker->label() + " named root " + std::to_string(c->root) +
                ", local rank 0 root " + std::to_string(pending.by_rank[0]->root);
  }
  run->out_bytes = pending.by_rank[0]->out.bytes;
  // Known before any check fails: a device step refused here ends the job on a cluster.
  run->on_device =
      pending.by_rank[0]->in.memory_kind == static_cast<uint32_t>(MemoryKind::kCudaDevice);
  run->root = static_cast<int>(pending.by_rank[0]->root);
  if (invalid.empty() && run->opcode == Opcode::kAllgatherv) invalid = read_counts(*run, elem);
  if (run->opcode == Opcode::kAllgather)
    run->rank_bytes.assign(static_cast<size_t>(world.world_size), var.fingerprint.bytes());
  if (invalid.empty()) invalid = resolve_device(*run, pending);
  if (!invalid.empty()) {
    if (run->on_device) return fail_on_device(*run, PX_ERR_INVALID, invalid);
    return finish(*run, PX_ERR_INVALID, invalid + " (" + run->what() + ")");
  }

  bool cluster = context.fabric && world.node_count > 1;
  run->result = run->outputs[0];
  if (!run->on_device || !cluster) return start_copies(run, cluster);
  // Device memory across nodes: the chain broadcast runs on pinned host memory.
  run->staging = take_staging(var, run->out_bytes);
  auto why = std::make_shared<std::string>();
  context.offload.run(
      true,
      [run, why] {
        ensure_staging(*run->context.gpu, run->device, run->out_bytes, &run->staging, why.get());
      },
      [run, why] {
        if (!why->empty()) return fail_on_device(*run, PX_ERR_INTERNAL, *why);
        run->result = static_cast<char*>(run->staging->data());
        start_copies(run, true);
      });
}

}  // namespace px
