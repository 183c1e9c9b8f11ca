#include "daemon/dense/cross_node_allreduce.h"

#include <utility>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/admission.h"
#include "transport/collectives/recursive_doubling_allreduce.h"
#include "transport/collectives/ring_allreduce.h"

namespace px {

void start_cross_node_allreduce(const StepContext& context, const std::shared_ptr<Job>& job,
                                Variable& var, uint64_t step, const CrossNodeAllreduce& spec,
                                CrossNodeDone done) {
  PX_ASSERT_LOOP_THREAD();
  Opcode opcode = var.id == 0 ? Opcode::kBarrier : Opcode::kAllreduce;
  // Named in failures only: no message is built on a step that succeeds.
  auto suffix = [](const Variable& v, uint64_t s) {
    return step_suffix(v, static_cast<uint16_t>(Opcode::kAllreduce), s);
  };
  if (var.poison_status != PX_OK) return done(var.poison_status, var.poison_message);
  if (!job->broken().empty()) return done(PX_ERR_PEER_LOST, job->broken() + suffix(var, step));
  uint32_t id = var.id == 0 ? job->barrier_id() : var.global_id;
  if (id == 0) {  // the nodes have not all registered the variable yet
    var.awaiting_global_id.push_back([context, job, &var, step, spec, done = std::move(done)] {
      start_cross_node_allreduce(context, job, var, step, spec, done);
    });
    return;
  }
  uint64_t tag_base = make_tag(operation_info(opcode).tag, id, step);
  // The transport calls back once, on its own thread: the rest happens on the loop. The
  // scheduler's Offload outlives every step; job keeps var alive.
  const Offload* offload = &context.offload;
  Variable* v = &var;
  auto finished = [offload, job, v, step, suffix, done = std::move(done)](
                      bool ok, const std::string& error) mutable {
    offload->post()([job, v, step, suffix, done = std::move(done), ok, error] {
      if (ok) return done(PX_OK, "");
      std::string why =
          !job->broken().empty() ? job->broken() : "the allreduce across nodes failed: " + error;
      done(PX_ERR_PEER_LOST, why + suffix(*v, step));
    });
  };
  // The variable's 16-bit wire (px_dense_options.wire_dtype) carries f32 sums only; the
  // barrier's word and the device path's staging of other dtypes stay exact.
  DType wire = var.id != 0 && spec.dtype == DType::kF32 ? dense_wire(var.fingerprint) : DType::kF32;
  if (spec.count * dtype_size(spec.dtype) <= kRecursiveDoublingMaxBytes) {
    // Small: a few whole-buffer exchanges, reduced inline on the fabric's thread (no pool
    // hop).
    RecursiveDoublingSpec small;
    small.buffer = spec.buffer;
    small.count = spec.count;
    small.dtype = spec.dtype;
    small.op = spec.op;
    small.tag_base = tag_base;
    small.priority = spec.priority;
    small.wire = wire;
    return start_recursive_doubling_allreduce(*context.fabric, small, finished);
  }
  RingAllreduceSpec ring;
  ring.buffer = spec.buffer;
  ring.count = spec.count;
  ring.dtype = spec.dtype;
  ring.op = spec.op;
  ring.tag_base = tag_base;
  ring.chunk_bytes = context.chunk_bytes;
  ring.priority = spec.priority;
  ring.wire = wire;
  ThreadPool& pool = context.offload.pool();
  start_ring_allreduce(
      *context.fabric, ring, [&pool](std::function<void()> fn) { pool.submit(std::move(fn)); },
      finished);
}

}  // namespace px
