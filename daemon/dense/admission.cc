#include "daemon/dense/admission.h"

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/sparse/sparse_router.h"  // a sparse variable's learning rates

namespace px {
namespace {

bool overlaps(const BufferRef& a, const BufferRef& b) {
  return a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

bool opcode_valid_for(const Variable& var, uint16_t opcode) {
  const OperationInfo& op = operation_info(opcode);
  OperandKind kind = var.id == 0  ? OperandKind::kBarrier
                     : var.sparse ? OperandKind::kSparse
                                  : OperandKind::kDense;
  return op.name && op.operand == kind;
}

bool host_arena_refs(const SubmitEntry& entry) {
  return entry.in.memory_kind == static_cast<uint32_t>(MemoryKind::kHostArena) &&
         entry.out.memory_kind == static_cast<uint32_t>(MemoryKind::kHostArena);
}

bool device_ref(const BufferRef& ref) {
  return ref.memory_kind == static_cast<uint32_t>(MemoryKind::kCudaDevice);
}

// A sparse pull's or push's indices (in) and rows (out) in device memory: n indices, n x dim
// f32 rows, each inside a region, on one device. Empty if so; else what is wrong.
std::string check_device_rows(const Variable& var, const gpu::DeviceRegions& regions,
                              const SubmitEntry& entry) {
  uint64_t n = entry.in.bytes / sizeof(int64_t);
  uint64_t want = n * var.fingerprint.dim * sizeof(float);
  if (entry.in.bytes % sizeof(int64_t) != 0 || entry.out.bytes != want)
    return "index buffer of " + std::to_string(entry.in.bytes) + " bytes and row buffer of " +
           std::to_string(entry.out.bytes) + " bytes do not match (" + std::to_string(n) +
           " rows of " + std::to_string(var.fingerprint.dim) + " f32 need " + std::to_string(want) +
           ")";
  if (n == 0) return "";
  if (entry.in.offset % alignof(int64_t) != 0 || entry.out.offset % alignof(float) != 0)
    return "misaligned buffers";
  std::string why;
  auto in = regions.find(entry.in.region, entry.in.offset, entry.in.bytes, &why);
  if (!in) return "indices: " + why;
  auto out = regions.find(entry.out.region, entry.out.offset, entry.out.bytes, &why);
  if (!out) return "rows: " + why;
  if (in->device() != out->device()) return "indices and rows are on different devices";
  if (entry.in.region == entry.out.region && overlaps(entry.in, entry.out))
    return "indices and rows overlap";
  return "";
}

// Device memory (px_alloc_ex regions): an allreduce's in and out, each inside a region the
// worker registered, on one device. Empty if so; else what is wrong.
std::string check_device_buffers(const Variable& var, const JobWorld& world,
                                 const Completer& worker, const SubmitEntry& entry) {
  auto opcode = static_cast<Opcode>(entry.opcode);
  bool sparse_step = var.sparse && (opcode == Opcode::kPullRows || opcode == Opcode::kPushRows ||
                                    opcode == Opcode::kLoadRows || opcode == Opcode::kReadRows);
  if (!sparse_step &&
      (var.sparse || (opcode != Opcode::kAllreduce && opcode != Opcode::kBroadcast &&
                      opcode != Opcode::kAllgather)))
    return "device memory is taken by allreduce, broadcast, allgather and sparse pulls, pushes, "
           "loads and reads only so far (README, Limits)";
  if (!device_ref(entry.in) || !device_ref(entry.out))
    return "in and out must both be device memory, or both host memory";
  const gpu::DeviceRegions* regions = worker.device_regions();
  if (!regions) return "device memory from a worker that registered none";
  if (sparse_step) return check_device_rows(var, *regions, entry);
  if (opcode == Opcode::kBroadcast && entry.root >= static_cast<uint32_t>(world.world_size))
    return "root " + std::to_string(entry.root) + " is not a rank of the job";
  uint64_t bytes = var.fingerprint.bytes();
  // An allgather's output holds every worker's block; its input must lie apart from it.
  bool gather = opcode == Opcode::kAllgather;
  uint64_t out_bytes = gather ? bytes * static_cast<uint64_t>(world.world_size) : bytes;
  if (entry.in.bytes != bytes || entry.out.bytes != out_bytes)
    return "buffer sizes " + std::to_string(entry.in.bytes) + "/" +
           std::to_string(entry.out.bytes) + " bytes, the step needs " + std::to_string(bytes) +
           "/" + std::to_string(out_bytes);
  std::string why;
  auto in = regions->find(entry.in.region, entry.in.offset, bytes, &why);
  if (!in) return "in: " + why;
  auto out = regions->find(entry.out.region, entry.out.offset, out_bytes, &why);
  if (!out) return "out: " + why;
  if (in->device() != out->device()) return "in and out are on different devices";
  if (entry.in.region == entry.out.region && (gather || entry.in.offset != entry.out.offset) &&
      overlaps(entry.in, entry.out))
    return gather ? "in lies in out (device memory: apart)"
                  : "in and out overlap without being equal";
  return "";
}

// Empty if the entry's buffers suit the variable; else what is wrong.
std::string check_buffers(const Variable& var, const JobWorld& world, const Completer& worker,
                          const SubmitEntry& entry) {
  if (var.id == 0) return "";
  if (device_ref(entry.in) || device_ref(entry.out))
    return check_device_buffers(var, world, worker, entry);
  if (!host_arena_refs(entry)) return "an unknown memory kind";
  const SharedArena& arena = worker.arena();
  if (var.sparse) {
    uint64_t n = entry.in.bytes / sizeof(int64_t);
    uint64_t want = n * var.fingerprint.dim * sizeof(float);
    if (entry.in.bytes % sizeof(int64_t) != 0 || entry.out.bytes != want)
      return "index buffer of " + std::to_string(entry.in.bytes) + " bytes and row buffer of " +
             std::to_string(entry.out.bytes) + " bytes do not match (" + std::to_string(n) +
             " rows of " + std::to_string(var.fingerprint.dim) + " f32 need " +
             std::to_string(want) + ")";
    if (entry.in.offset % alignof(int64_t) != 0 || entry.out.offset % alignof(float) != 0)
      return "misaligned buffers";
    if ((n > 0 && !arena.heap_contains(entry.in.offset, entry.in.bytes)) ||
        (n > 0 && !arena.heap_contains(entry.out.offset, entry.out.bytes)))
      return "a buffer lies outside the shared arena";
    if (n > 0 && overlaps(entry.in, entry.out)) return "indices and rows overlap";
    return "";
  }
  uint64_t bytes = var.fingerprint.bytes();
  auto opcode = static_cast<Opcode>(entry.opcode);
  if (opcode == Opcode::kAllgather || opcode == Opcode::kAllgatherv) {
    uint64_t world_size = static_cast<uint64_t>(world.world_size);
    uint64_t most_in = opcode == Opcode::kAllgather ? bytes : world_size * 8 + bytes;
    uint64_t most_out = world_size * bytes;
    if ((opcode == Opcode::kAllgather &&
         (entry.in.bytes != bytes || entry.out.bytes != most_out)) ||
        entry.in.bytes > most_in || entry.out.bytes > most_out)
      return "buffer sizes " + std::to_string(entry.in.bytes) + "/" +
             std::to_string(entry.out.bytes) + " bytes do not fit the variable (" +
             std::to_string(bytes) + " bytes per worker, " + std::to_string(world_size) +
             " workers)";
    if ((entry.in.bytes > 0 && !arena.heap_contains(entry.in.offset, entry.in.bytes)) ||
        (entry.out.bytes > 0 && !arena.heap_contains(entry.out.offset, entry.out.bytes)))
      return "a buffer lies outside the shared arena";
    return "";  // the input may lie in the output: the client puts ordinary input in its slice
  }
  if (opcode == Opcode::kReduceScatter || opcode == Opcode::kAlltoall) {
    uint64_t world_size = static_cast<uint64_t>(world.world_size);
    bool scatter = opcode == Opcode::kReduceScatter;
    // alltoall: the counts (read by the step itself) and at most a full block per rank.
    uint64_t want_in = scatter ? world_size * bytes : 0;
    if ((scatter && (entry.in.bytes != want_in || entry.out.bytes != bytes)) ||
        (!scatter &&
         (entry.in.bytes < world_size * 16 || entry.in.bytes > world_size * (16 + bytes) ||
          entry.out.bytes > world_size * bytes)))
      return "buffer sizes " + std::to_string(entry.in.bytes) + "/" +
             std::to_string(entry.out.bytes) + " bytes do not fit the variable (" +
             std::to_string(bytes) + " bytes per block, " + std::to_string(world_size) +
             " workers)";
    if ((entry.in.bytes > 0 && !arena.heap_contains(entry.in.offset, entry.in.bytes)) ||
        (entry.out.bytes > 0 && !arena.heap_contains(entry.out.offset, entry.out.bytes)))
      return "a buffer lies outside the shared arena";
    if (entry.in.bytes > 0 && entry.out.bytes > 0 && overlaps(entry.in, entry.out))
      return "in and out overlap";
    if (!scatter && entry.in.offset % alignof(uint64_t) != 0) return "misaligned counts";
    return "";
  }
  if (opcode == Opcode::kBroadcast && entry.root >= static_cast<uint32_t>(world.world_size))
    return "root " + std::to_string(entry.root) + " is not a rank of the job";
  if (entry.in.bytes != bytes || entry.out.bytes != bytes)
    return "buffer sizes " + std::to_string(entry.in.bytes) + "/" +
           std::to_string(entry.out.bytes) + " bytes, variable has " + std::to_string(bytes);
  if (!arena.heap_contains(entry.in.offset, bytes) || !arena.heap_contains(entry.out.offset, bytes))
    return "a buffer lies outside the shared arena";
  if (entry.in.offset != entry.out.offset && overlaps(entry.in, entry.out))
    return "in and out overlap without being equal";
  return "";
}

Admission refuse(px_status status, std::string message) {
  Admission a;
  a.status = status;
  a.message = std::move(message);
  return a;
}

}  // namespace

std::string step_suffix(const Variable& var, uint16_t opcode, uint64_t step) {
  // Sparse steps say which (a variable has pull steps and push steps); dense ones do not.
  const OperationInfo& op = operation_info(opcode);
  std::string what =
      op.operand == OperandKind::kSparse && op.step ? std::string(op.name) + " step " : "step ";
  return " (variable '" + var.name + "', " + what + std::to_string(step) + ")";
}

// A push step another local worker set a new learning rate for, and this one did not
// (px_set_sparse_lr): "" or why, naming both.
std::string unset_learning_rate(const Variable& var, int rank, const SubmitEntry& entry) {
  if (entry.opcode != static_cast<uint16_t>(Opcode::kPushRows) || !var.sparse ||
      !var.sparse->learning_rates)
    return "";
  std::string why = var.sparse->learning_rates->check_push(entry.step, rank);
  return why.empty() ? "" : why + step_suffix(var, entry.opcode, entry.step);
}

// The order of the checks is part of the protocol: the first that fails names the cause.
Admission admit(Job& job, int rank, const Completer& worker, const SubmitEntry& entry) {
  PX_ASSERT_LOOP_THREAD();
  Variable* var = job.find(entry.var_id);
  if (!var || !var->registered[static_cast<size_t>(rank)])
    return refuse(PX_ERR_NOT_FOUND, "variable id " + std::to_string(entry.var_id) +
                                        " is not registered by " + worker.label());
  if (!opcode_valid_for(*var, entry.opcode))
    return refuse(PX_ERR_PROTOCOL, "opcode " + std::to_string(entry.opcode) +
                                       " is not valid for variable '" + var->name + "' from " +
                                       worker.label());
  bool step_op = operation_info(entry.opcode).step;
  std::string suffix = step_suffix(*var, entry.opcode, entry.step);
  if (step_op) {
    uint64_t& expected_step = var->next_step(rank, entry.opcode);
    if (entry.step != expected_step)
      return refuse(PX_ERR_PROTOCOL, worker.label() + " submitted step " +
                                         std::to_string(entry.step) + " but step " +
                                         std::to_string(expected_step) + " was next" + suffix);
    ++expected_step;
  }
  // A mismatch is reported before a lost peer: it is the first cause, and peers that
  // learnt of it may have exited since.
  if (var->poison_status != PX_OK) return refuse(var->poison_status, var->poison_message);
  if (!job.broken().empty()) return refuse(PX_ERR_PEER_LOST, job.broken() + suffix);
  if (step_op && job.needs_departed(*var)) return refuse(PX_ERR_PEER_LOST, job.departed() + suffix);
  std::string invalid = check_buffers(*var, job.world(), worker, entry);
  Admission a;
  a.var = var;
  a.step = step_op;
  if (invalid.empty()) {
    // Such a step still takes its place and then fails for every local worker.
    if (step_op) a.invalid = unset_learning_rate(*var, rank, entry);
    return a;
  }
  if (!step_op)
    return refuse(PX_ERR_INVALID, worker.label() + " gave an invalid buffer: " + invalid +
                                      " (variable '" + var->name + "')");
  a.invalid = worker.label() + " gave an invalid buffer: " + invalid + suffix;
  return a;
}

}  // namespace px
