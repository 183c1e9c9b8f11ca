#include "clients/python/c10d/process_group.h"

#include <ATen/ATen.h>

#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>

namespace pxc10d {
namespace {

constexpr uint64_t kHeaderBytes = 8;  // a moved block's own byte count, checked on arrival
// The alltoall variable's count, in 4-byte words: the most one block may hold (512 GiB).
constexpr uint64_t kAlltoallWords = uint64_t{1} << 37;

uint64_t words_of(uint64_t bytes) {
  return (bytes + 3) / 4;
}

[[noreturn]] void refuse(const std::string& message) {
  throw std::runtime_error("parallax backend: " + message);
}

std::optional<px_dtype> reduction_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return PX_F32;
    case at::kDouble:
      return PX_F64;
    case at::kHalf:
      return PX_F16;
    case at::kBFloat16:
      return PX_BF16;
    case at::kInt:
      return PX_I32;
    case at::kLong:
      return PX_I64;
    default:
      return std::nullopt;
  }
}

px_reduce_op reduction_op(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return PX_SUM;
    case c10d::ReduceOp::AVG:
      return PX_MEAN;
    case c10d::ReduceOp::MIN:
      return PX_MIN;
    case c10d::ReduceOp::MAX:
      return PX_MAX;
    case c10d::ReduceOp::PRODUCT:
      return PX_PROD;
    default:
      refuse(std::string(name) + " with ReduceOp " + std::to_string(int(op.op_)) +
             " (a bitwise or premultiplied sum): the daemons reduce with sum, avg, min, max "
             "and product");
  }
}

void check_tensor(const at::Tensor& t, const char* name) {
  if (!t.defined()) refuse(std::string(name) + ": an undefined tensor");
  if (t.is_sparse()) refuse(std::string(name) + ": a sparse tensor (dense tensors only)");
  if (!t.device().is_cpu())
    refuse(std::string(name) + ": a tensor on " + t.device().str() +
           ": this build of the backend moves CPU tensors only (docs/torch-backend.md)");
}

void check_tensors(const std::vector<at::Tensor>& tensors, const char* name) {
  for (const auto& t : tensors) check_tensor(t, name);
}

const at::Tensor& only_tensor(const std::vector<at::Tensor>& tensors, const char* name) {
  if (tensors.size() != 1)
    refuse(std::string(name) + ": " + std::to_string(tensors.size()) +
           " tensors given, one expected (one device per process)");
  check_tensor(tensors[0], name);
  return tensors[0];
}

uint64_t total_bytes(const std::vector<at::Tensor>& tensors) {
  uint64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.nbytes();
  return bytes;
}

// t's elements, in row-major order, to/from bytes at p (t may be non-contiguous).
void copy_in(void* p, const at::Tensor& t) {
  at::NoGradGuard no_grad;
  if (t.numel() == 0) return;
  at::from_blob(p, t.sizes(), at::TensorOptions().dtype(t.scalar_type())).copy_(t);
}
void copy_out(at::Tensor& t, const void* p) {
  at::NoGradGuard no_grad;
  if (t.numel() == 0) return;
  t.copy_(
      at::from_blob(const_cast<void*>(p), t.sizes(), at::TensorOptions().dtype(t.scalar_type())));
}
// The tensors' bytes one after another.
void pack(char* p, const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    copy_in(p, t);
    p += t.nbytes();
  }
}
void unpack(std::vector<at::Tensor>& tensors, const char* p) {
  for (auto& t : tensors) {
    copy_out(t, p);
    p += t.nbytes();
  }
}

// Words (4 bytes, the variables' element) of a moved block: its header and bytes, rounded
// up to the block's size class.
uint64_t block_words(uint64_t bytes) {
  return size_class((kHeaderBytes + bytes + 3) / 4);
}

void write_header(char* block, uint64_t bytes) {
  std::memcpy(block, &bytes, sizeof bytes);
}
uint64_t read_header(const char* block) {
  uint64_t bytes;
  std::memcpy(&bytes, block, sizeof bytes);
  return bytes;
}

}  // namespace

ProcessGroupParallax::ProcessGroupParallax(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const GroupOptions& options)
    : ProcessGroup(rank, size),
      px_(PxLibrary::open(options.library_path)),
      client_(reinterpret_cast<px_client*>(options.client)),
      timeout_(options.timeout),
      vars_(px_, client_, "c10d." + options.group_id, options.max_variables),
      engine_(px_, client_) {
  px_world_info world{};
  world.struct_size = sizeof world;
  if (px_.world(client_, &world) != PX_OK) refuse(std::string("px_world: ") + px_.last_error());
  if (!options.global_ranks.empty() && static_cast<int>(options.global_ranks.size()) != size)
    refuse("inconsistent group: " + std::to_string(options.global_ranks.size()) +
           " ranks named, size " + std::to_string(size));
  if (size != world.world_size)
    refuse("group '" + options.group_id + "' has " + std::to_string(size) +
           " ranks but the daemons' job has " + std::to_string(world.world_size) +
           " workers: a parallax group spans the whole job (every worker of it, on every "
           "node); make subgroups with backend=\"gloo\", and check that WORLD_SIZE matches "
           "the workers the daemons were told about (PARALLAX_LOCAL_SIZE and the nodes)");
  // Every rank's daemon rank, through the group's store (its keys are the group's own).
  store->set("parallax/daemon_rank/" + std::to_string(rank),
             std::vector<uint8_t>{static_cast<uint8_t>(world.rank & 0xff),
                                  static_cast<uint8_t>((world.rank >> 8) & 0xff),
                                  static_cast<uint8_t>((world.rank >> 16) & 0xff),
                                  static_cast<uint8_t>((world.rank >> 24) & 0xff)});
  daemon_rank_.resize(size);
  std::set<int> seen;
  for (int r = 0; r < size; ++r) {
    std::string key = "parallax/daemon_rank/" + std::to_string(r);
    try {
      store->wait({key}, timeout_);
    } catch (const std::exception& e) {
      refuse("torch rank " + std::to_string(r) + " did not join group '" + options.group_id +
             "' within " + std::to_string(timeout_.count()) +
             " ms (the group's timeout): did it call init_process_group? (" + e.what() + ")");
    }
    auto value = store->get(key);
    if (value.size() != 4)
      refuse("a malformed daemon rank in the store for rank " + std::to_string(r));
    int daemon = value[0] | (value[1] << 8) | (value[2] << 16) | (value[3] << 24);
    if (daemon < 0 || daemon >= size || !seen.insert(daemon).second)
      refuse("torch rank " + std::to_string(r) + " is the daemons' rank " + std::to_string(daemon) +
             ", which " +
             (daemon < 0 || daemon >= size ? "is out of range" : "another torch rank has too") +
             ": are the ranks of this group in one parallax job (PARALLAX_JOB)?");
    daemon_rank_[r] = daemon;
  }
  torch_rank_.resize(size);
  for (int r = 0; r < size; ++r) torch_rank_[daemon_rank_[r]] = r;
}

px_var* ProcessGroupParallax::variable(const Operation& run, Kind kind, px_dtype dtype,
                                       px_reduce_op op, uint64_t count) {
  try {
    return vars_.get(kind, dtype, op, count);
  } catch (const std::exception& e) {
    refuse(run.work->what() + ": " + e.what());
  }
}

void* ProcessGroupParallax::arena(uint64_t bytes) {
  void* p = nullptr;
  if (px_.alloc(client_, bytes ? bytes : 1, &p) != PX_OK)
    refuse(std::string(px_.last_error()) +
           " (the tensors of a collective are staged in the "
           "arena: set PARALLAX_ARENA_BYTES)");
  return p;
}

std::chrono::milliseconds ProcessGroupParallax::timeout_of(
    std::chrono::milliseconds op_timeout) const {
  return op_timeout.count() > 0 ? op_timeout : timeout_;
}

std::string ProcessGroupParallax::describe(const char* name,
                                           const std::vector<at::Tensor>& tensors) const {
  std::string what =
      std::string(name) + " (torch rank " + std::to_string(rank_) + " of " + std::to_string(size_);
  if (!tensors.empty())
    what +=
        ", " + std::to_string(tensors[0].numel()) + " " + c10::toString(tensors[0].scalar_type()) +
        (tensors.size() > 1 ? " and " + std::to_string(tensors.size() - 1) + " more tensors" : "");
  return what + ")";
}

void ProcessGroupParallax::submit(Operation op, px_status status, const char* call) {
  if (status != PX_OK) {
    std::string message = px_.last_error();
    for (void* block : op.arena) px_.free(client_, block);
    refuse(op.work->what() + ": " + call + " failed with " + px_.status_name(status) + ": " +
           message);
  }
  engine_.add(std::move(op));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::reduce_impl(
    c10d::OpType type, const char* name, std::vector<at::Tensor> inputs,
    std::vector<at::Tensor> outputs, c10d::ReduceOp reduce_op, int root_only, bool scatter,
    std::chrono::milliseconds timeout) {
  check_tensors(inputs, name);
  check_tensors(outputs, name);
  auto dtype = reduction_dtype(inputs[0].scalar_type());
  if (!dtype)
    refuse(std::string(name) + " of " + c10::toString(inputs[0].scalar_type()) +
           ": the daemons reduce float32, float64, float16, bfloat16, int32 and int64");
  for (const auto& t : inputs)
    if (t.scalar_type() != inputs[0].scalar_type())
      refuse(std::string(name) + ": tensors of " + c10::toString(inputs[0].scalar_type()) +
             " and " + c10::toString(t.scalar_type()) + " together (one dtype per call)");
  px_reduce_op op = reduction_op(reduce_op, name);
  uint64_t bytes = total_bytes(inputs);
  uint64_t count = bytes / inputs[0].element_size();
  Operation run;
  run.work = c10::make_intrusive<ParallaxWork>(type, outputs, describe(name, inputs));
  run.timeout = timeout_of(timeout);
  auto work = run.work;
  if (count == 0) {  // nothing to reduce: no step (every rank sees the same sizes)
    engine_.add(std::move(run));
    return work;
  }
  px_var* var = variable(run, Kind::kAllreduce, *dtype, op, count);
  char* stage = static_cast<char*>(arena(bytes));
  run.arena.push_back(stage);
  pack(stage, inputs);
  bool deliver = root_only < 0 || root_only == rank_;
  // outputs: the inputs themselves (allreduce, reduce), or this rank's block (scatter).
  uint64_t offset = scatter ? rank_ * total_bytes(outputs) : 0;
  run.deliver = [outputs, stage, offset, deliver]() mutable {
    if (deliver) unpack(outputs, stage + offset);
  };
  px_request* request = nullptr;
  px_status status = px_.allreduce_ex(var, stage, stage, nullptr, &request);
  run.request = request;
  submit(std::move(run), status, "px_allreduce_ex");
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::gather_impl(
    c10d::OpType type, const char* name, std::vector<at::Tensor> inputs,
    std::vector<std::vector<at::Tensor>> outputs, int root_only,
    std::chrono::milliseconds timeout) {
  check_tensors(inputs, name);
  for (const auto& per_rank : outputs) check_tensors(per_rank, name);
  bool deliver = root_only < 0 || root_only == rank_;
  uint64_t bytes = total_bytes(inputs);
  if (deliver) {
    if (static_cast<int>(outputs.size()) != size_)
      refuse(std::string(name) + ": " + std::to_string(outputs.size()) +
             " output lists, one per rank (" + std::to_string(size_) + ") expected");
    for (int r = 0; r < size_; ++r)
      if (total_bytes(outputs[r]) != bytes)
        refuse(std::string(name) + ": the output for rank " + std::to_string(r) + " holds " +
               std::to_string(total_bytes(outputs[r])) + " bytes, the input " +
               std::to_string(bytes));
  }
  std::vector<at::Tensor> flat_outputs;
  for (const auto& per_rank : outputs)
    flat_outputs.insert(flat_outputs.end(), per_rank.begin(), per_rank.end());
  Operation run;
  run.work = c10::make_intrusive<ParallaxWork>(type, flat_outputs, describe(name, inputs));
  run.timeout = timeout_of(timeout);
  uint64_t words = block_words(bytes);
  px_var* var = variable(run, Kind::kAllgather, PX_I32, PX_SUM, words);
  char* in = static_cast<char*>(arena(words * 4));
  run.arena.push_back(in);
  char* out = static_cast<char*>(arena(words * 4 * size_));
  run.arena.push_back(out);
  write_header(in, bytes);
  pack(in + kHeaderBytes, inputs);
  std::vector<int> daemon_rank = daemon_rank_;
  run.deliver = [outputs, out, words, bytes, daemon_rank, deliver, name]() mutable {
    if (!deliver) return;
    for (size_t r = 0; r < outputs.size(); ++r) {
      const char* block = out + daemon_rank[r] * words * 4;
      uint64_t got = read_header(block);
      if (got != bytes)
        throw std::runtime_error("rank " + std::to_string(r) + " gave " + std::to_string(got) +
                                 " bytes to " + name + ", this rank " + std::to_string(bytes) +
                                 " (every rank's tensors must have the same size and dtype)");
      unpack(outputs[r], block + kHeaderBytes);
    }
  };
  auto work = run.work;
  px_request* request = nullptr;
  px_status status = px_.allgather_ex(var, in, out, nullptr, &request);
  run.request = request;
  submit(std::move(run), status, "px_allgather_ex");
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::broadcast_impl(
    c10d::OpType type, const char* name, std::vector<at::Tensor> inputs,
    std::vector<at::Tensor> outputs, size_t blocks, size_t pick, int root,
    std::chrono::milliseconds timeout) {
  check_tensors(inputs, name);
  check_tensors(outputs, name);
  if (root < 0 || root >= size_)
    refuse(std::string(name) + ": root rank " + std::to_string(root) + " is not in [0, " +
           std::to_string(size_) + ")");
  // blocks of one size, each the size of every rank's output: the root's inputs.
  uint64_t block_bytes = total_bytes(outputs);
  bool is_root = rank_ == root;
  if (is_root) {
    if (inputs.size() != blocks)
      refuse(std::string(name) + ": the root gave " + std::to_string(inputs.size()) + " tensors, " +
             std::to_string(blocks) + " expected");
    for (const auto& t : inputs)
      if (t.nbytes() != block_bytes)
        refuse(std::string(name) + ": the root's tensors hold " + std::to_string(t.nbytes()) +
               " bytes, the output " + std::to_string(block_bytes));
  }
  Operation run;
  run.work = c10::make_intrusive<ParallaxWork>(type, outputs, describe(name, outputs));
  run.timeout = timeout_of(timeout);
  uint64_t words = block_words(block_bytes);
  px_var* var = variable(run, Kind::kBroadcast, PX_I32, PX_SUM, words * blocks);
  char* stage = static_cast<char*>(arena(words * 4 * blocks));
  run.arena.push_back(stage);
  if (is_root)
    for (size_t b = 0; b < blocks; ++b) {
      write_header(stage + b * words * 4, block_bytes);
      copy_in(stage + b * words * 4 + kHeaderBytes, inputs[b]);
    }
  run.deliver = [outputs, stage, words, block_bytes, pick, root, name]() mutable {
    const char* block = stage + pick * words * 4;
    uint64_t got = read_header(block);
    if (got != block_bytes)
      throw std::runtime_error("the root, rank " + std::to_string(root) + ", sent " +
                               std::to_string(got) + " bytes by " + name + ", this rank expects " +
                               std::to_string(block_bytes) +
                               " (every rank's tensors must have the same size and dtype)");
    unpack(outputs, block + kHeaderBytes);
  };
  px_op_options options;
  px_.op_options_init(&options);
  options.root = daemon_rank_[root];
  auto work = run.work;
  px_request* request = nullptr;
  px_status status = px_.broadcast_ex(var, is_root ? stage : nullptr, stage, &options, &request);
  run.request = request;
  submit(std::move(run), status, "px_broadcast_ex");
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::broadcast(std::vector<at::Tensor>& tensors,
                                                               const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = only_tensor(tensors, "broadcast");
  return broadcast_impl(c10d::OpType::BROADCAST, "broadcast", {t}, {t}, 1, 0,
                        static_cast<int>(opts.rootRank), opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::allreduce(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = only_tensor(tensors, "all_reduce");
  return reduce_impl(c10d::OpType::ALLREDUCE, "all_reduce", {t}, {t}, opts.reduceOp, -1, false,
                     opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) refuse("all_reduce_coalesced: no tensors");
  return reduce_impl(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors, tensors,
                     opts.reduceOp, -1, false, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  const at::Tensor& t = only_tensor(tensors, "reduce");
  if (opts.rootRank < 0 || opts.rootRank >= size_)
    refuse("reduce: root rank " + std::to_string(opts.rootRank) + " is not in [0, " +
           std::to_string(size_) + ")");
  // An allreduce whose result only the root keeps (the others' tensors are left as given).
  return reduce_impl(c10d::OpType::REDUCE, "reduce", {t}, {t}, opts.reduceOp,
                     static_cast<int>(opts.rootRank), false, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const at::Tensor& t = only_tensor(inputs, "all_gather");
  if (outputs.size() != 1) refuse("all_gather: one output list expected");
  std::vector<std::vector<at::Tensor>> per_rank;
  for (const auto& o : outputs[0]) per_rank.push_back({o});
  return gather_impl(c10d::OpType::ALLGATHER, "all_gather", {t}, per_rank, -1, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  check_tensor(output, "all_gather_into_tensor");
  check_tensor(input, "all_gather_into_tensor");
  if (!output.is_contiguous()) refuse("all_gather_into_tensor: the output is not contiguous");
  if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type())
    refuse("all_gather_into_tensor: the output holds " + std::to_string(output.numel()) + " " +
           c10::toString(output.scalar_type()) + ", world size x the input is " +
           std::to_string(input.numel() * size_) + " " + c10::toString(input.scalar_type()));
  std::vector<std::vector<at::Tensor>> per_rank;
  at::Tensor flat = output.view({-1});
  for (int r = 0; r < size_; ++r)
    per_rank.push_back({flat.narrow(0, r * input.numel(), input.numel()).view(input.sizes())});
  auto work = gather_impl(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {input},
                          per_rank, -1, opts.timeout);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  if (inputs.empty()) refuse("all_gather_coalesced: no tensors");
  return gather_impl(c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced", inputs, outputs, -1,
                     opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const at::Tensor& t = only_tensor(inputs, "gather");
  int root = static_cast<int>(opts.rootRank);
  if (root < 0 || root >= size_)
    refuse("gather: root rank " + std::to_string(root) + " is not in [0, " + std::to_string(size_) +
           ")");
  std::vector<std::vector<at::Tensor>> per_rank;
  if (rank_ == root) {
    if (outputs.size() != 1) refuse("gather: the root needs one output list");
    for (const auto& o : outputs[0]) per_rank.push_back({o});
  }
  // An all_gather whose result only the root keeps.
  return gather_impl(c10d::OpType::GATHER, "gather", {t}, per_rank, root, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const at::Tensor& t = only_tensor(outputs, "scatter");
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> blocks;
  if (rank_ == root) {
    if (inputs.size() != 1) refuse("scatter: the root needs one input list");
    blocks = inputs[0];
  }
  // A broadcast of the root's blocks, of which each rank keeps its own.
  return broadcast_impl(c10d::OpType::SCATTER, "scatter", blocks, {t}, size_, rank_, root,
                        opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::scatter_reduce_impl(
    c10d::OpType type, const char* name, std::vector<at::Tensor> blocks, at::Tensor out,
    c10d::ReduceOp reduce_op, std::chrono::milliseconds timeout) {
  check_tensors(blocks, name);
  check_tensor(out, name);
  if (static_cast<int>(blocks.size()) != size_)
    refuse(std::string(name) + ": " + std::to_string(blocks.size()) + " input blocks for " +
           std::to_string(size_) + " ranks");
  for (const auto& t : blocks)
    if (t.numel() != out.numel() || t.scalar_type() != out.scalar_type())
      refuse(std::string(name) + ": every input block must match the output (" +
             std::to_string(out.numel()) + " " + c10::toString(out.scalar_type()) + "), one is " +
             std::to_string(t.numel()) + " " + c10::toString(t.scalar_type()));
  auto dtype = reduction_dtype(out.scalar_type());
  if (!dtype)
    refuse(std::string(name) + " of " + c10::toString(out.scalar_type()) +
           ": the daemons reduce float32, float64, float16, bfloat16, int32 and int64");
  px_reduce_op op = reduction_op(reduce_op, name);
  Operation run;
  run.work =
      c10::make_intrusive<ParallaxWork>(type, std::vector<at::Tensor>{out}, describe(name, {out}));
  run.timeout = timeout_of(timeout);
  auto work = run.work;
  uint64_t count = static_cast<uint64_t>(out.numel()), bytes = out.nbytes();
  if (count == 0) {
    engine_.add(std::move(run));
    return work;
  }
  px_var* var = variable(run, Kind::kReduceScatter, *dtype, op, count);
  char* in = static_cast<char*>(arena(bytes * static_cast<uint64_t>(size_)));
  run.arena.push_back(in);
  char* result = static_cast<char*>(arena(bytes));
  run.arena.push_back(result);
  // The daemons' block r is their rank r's: torch rank t's block goes to t's daemon rank.
  for (int t = 0; t < size_; ++t) copy_in(in + daemon_rank_[t] * bytes, blocks[t]);
  run.deliver = [out, result]() mutable { copy_out(out, result); };
  px_request* request = nullptr;
  px_status status = px_.reduce_scatter_ex(var, in, result, nullptr, &request);
  run.request = request;
  submit(std::move(run), status, "px_reduce_scatter_ex");
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::alltoall_impl(
    c10d::OpType type, const char* name, std::vector<at::Tensor> sends,
    std::vector<at::Tensor> receives, std::chrono::milliseconds timeout) {
  check_tensors(sends, name);
  check_tensors(receives, name);
  if (static_cast<int>(sends.size()) != size_ || static_cast<int>(receives.size()) != size_)
    refuse(std::string(name) + ": " + std::to_string(sends.size()) + " blocks to send and " +
           std::to_string(receives.size()) + " to receive for " + std::to_string(size_) + " ranks");
  for (const auto& t : receives)
    if (t.scalar_type() != sends[0].scalar_type())
      refuse(std::string(name) + ": tensors of " + c10::toString(sends[0].scalar_type()) + " and " +
             c10::toString(t.scalar_type()) + " together (one dtype per call)");
  Operation run;
  run.work = c10::make_intrusive<ParallaxWork>(type, receives, describe(name, sends));
  run.timeout = timeout_of(timeout);
  auto work = run.work;
  px_var* var = variable(run, Kind::kAlltoall, PX_I32, PX_SUM, kAlltoallWords);
  // Blocks in the daemons' rank order, each padded to whole 4-byte words.
  std::vector<uint64_t> send_words(size_), recv_words(size_), send_at(size_), recv_at(size_);
  uint64_t sent = 0, received = 0;
  for (int j = 0; j < size_; ++j) {
    int t = torch_rank_[j];
    send_at[j] = sent;
    recv_at[j] = received;
    sent += send_words[j] = words_of(sends[t].nbytes());
    received += recv_words[j] = words_of(receives[t].nbytes());
  }
  char* in = static_cast<char*>(arena(sent * 4));
  run.arena.push_back(in);
  char* out = static_cast<char*>(arena(received * 4));
  run.arena.push_back(out);
  for (int j = 0; j < size_; ++j) copy_in(in + send_at[j] * 4, sends[torch_rank_[j]]);
  std::vector<int> torch_rank = torch_rank_;
  run.deliver = [receives, out, recv_at, torch_rank]() mutable {
    for (size_t j = 0; j < torch_rank.size(); ++j)
      copy_out(receives[torch_rank[j]], out + recv_at[j] * 4);
  };
  px_request* request = nullptr;
  px_status status =
      px_.alltoallv_ex(var, in, send_words.data(), out, recv_words.data(), nullptr, &request);
  run.request = request;
  submit(std::move(run), status, "px_alltoallv_ex");
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = only_tensor(outputs, "reduce_scatter");
  if (inputs.size() != 1) refuse("reduce_scatter: one input list expected");
  return scatter_reduce_impl(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", inputs[0], out,
                             opts.reduceOp, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor(output, "reduce_scatter_tensor");
  check_tensor(input, "reduce_scatter_tensor");
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
    refuse("reduce_scatter_tensor: the input holds " + std::to_string(input.numel()) + " " +
           c10::toString(input.scalar_type()) + ", world size x the output is " +
           std::to_string(output.numel() * size_) + " " + c10::toString(output.scalar_type()));
  std::vector<at::Tensor> blocks;
  at::Tensor flat = input.reshape({-1});
  for (int r = 0; r < size_; ++r)
    blocks.push_back(flat.narrow(0, r * output.numel(), output.numel()).view(output.sizes()));
  return scatter_reduce_impl(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", blocks,
                             output, opts.reduceOp, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  check_tensor(output, "all_to_all_single");
  check_tensor(input, "all_to_all_single");
  // Blocks are rows of the first dimension: equal ones without splits, as torch defines.
  auto cut = [&](at::Tensor& t, std::vector<int64_t>& splits, const char* which) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    std::vector<int64_t> counts = splits;
    if (counts.empty()) {
      if (rows % size_ != 0)
        refuse("all_to_all_single: the " + std::string(which) + "'s " + std::to_string(rows) +
               " rows do not split into " + std::to_string(size_) + " equal blocks");
      counts.assign(size_, rows / size_);
    }
    if (static_cast<int>(counts.size()) != size_)
      refuse("all_to_all_single: " + std::to_string(counts.size()) + " " + which + " splits for " +
             std::to_string(size_) + " ranks");
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    if (total != rows)
      refuse("all_to_all_single: the " + std::string(which) + " splits add up to " +
             std::to_string(total) + " rows, the " + which + " has " + std::to_string(rows));
    std::vector<at::Tensor> blocks;
    at::Tensor whole = t.dim() == 0 ? t.reshape({1}) : t;
    for (int64_t r = 0, at = 0; r < size_; at += counts[r++])
      blocks.push_back(whole.narrow(0, at, counts[r]));
    return blocks;
  };
  std::vector<at::Tensor> sends = cut(input, input_splits, "input");
  std::vector<at::Tensor> receives = cut(output, output_splits, "output");
  return alltoall_impl(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", sends, receives,
                       opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::alltoall(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllToAllOptions& opts) {
  return alltoall_impl(c10d::OpType::ALLTOALL, "all_to_all", inputs, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::barrier(const c10d::BarrierOptions& opts) {
  // A one-element reduction of a variable of its own: complete once every rank entered.
  Operation run;
  run.work = c10::make_intrusive<ParallaxWork>(c10d::OpType::BARRIER, std::vector<at::Tensor>{},
                                               describe("barrier", {}));
  run.timeout = timeout_of(opts.timeout);
  px_var* var = variable(run, Kind::kBarrier, PX_I32, PX_SUM, 1);
  void* stage = arena(4);
  std::memset(stage, 0, 4);
  run.arena.push_back(stage);
  auto work = run.work;
  px_request* request = nullptr;
  px_status status = px_.allreduce_ex(var, stage, stage, nullptr, &request);
  run.request = request;
  submit(std::move(run), status, "px_allreduce_ex");
  return work;
}

void ProcessGroupParallax::monitoredBarrier(const c10d::BarrierOptions& opts, bool) {
  barrier(opts)->wait(timeout_of(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::send(std::vector<at::Tensor>&, int, int) {
  refuse(
      "send is not supported: the daemons run collectives of the whole job, not "
      "point-to-point messages; use a group of backend=\"gloo\" for send/recv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::recv(std::vector<at::Tensor>&, int, int) {
  refuse(
      "recv is not supported: the daemons run collectives of the whole job, not "
      "point-to-point messages; use a group of backend=\"gloo\" for send/recv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupParallax::recvAnysource(std::vector<at::Tensor>&, int) {
  refuse(
      "recv (from any source) is not supported: the daemons run collectives of the whole "
      "job, not point-to-point messages; use a group of backend=\"gloo\" for send/recv");
}

}  // namespace pxc10d
