#include "daemon/front/session.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "daemon/common/log.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/loop_timer.h"
#include "daemon/dense/scheduler.h"
#include "daemon/front/admin.h"
#include "daemon/front/server.h"
#include "daemon/sparse/sparse_router.h"
#include "parallax_c.h"
#include "transport/kernels/wire16.h"

namespace px {
namespace {

constexpr size_t kMaxNameBytes = 255;
constexpr int kMaxLocalSize = 4096;
constexpr uint64_t kMinArenaBytes = 1ull << 20;
constexpr uint64_t kMaxVariableBytes = 1ull << 40;

std::string abi_string(uint32_t v) {
  return std::to_string(v >> 16) + "." + std::to_string(v & 0xffff);
}

}  // namespace

Session::Session(Server& server, int fd, uint64_t id, pid_t pid, uid_t uid)
    : server_(server), fd_(fd), id_(id), pid_(pid), uid_(uid) {}

Session::~Session() {
  if (fd_ >= 0) ::close(fd_);
}

LogFields Session::log_fields(const std::string& variable) const {
  LogFields fields;
  fields.job = job_name_;
  fields.variable = variable;
  fields.rank = local_rank_;
  fields.pid = pid_;
  return fields;
}

std::string Session::label() const {
  std::string rank = local_rank_ >= 0 ? "local rank " + std::to_string(local_rank_) + " " : "";
  std::string job = job_name_.empty() ? "" : " of job '" + job_name_ + "'";
  std::string node = server_.node_label();
  return "worker " + rank + "(pid " + std::to_string(pid_) + ")" + job +
         (node.empty() ? "" : " on " + node);
}

void Session::start() {
  uv_poll_init(server_.loop(), &socket_poll_, fd_);
  socket_poll_.data = this;
  ++open_handles_;
  update_socket_poll();
}

void Session::update_socket_poll() {
  int events = UV_READABLE | UV_DISCONNECT;
  if (!output_.empty()) events |= UV_WRITABLE;
  uv_poll_start(&socket_poll_, events, on_socket_event);
}

void Session::on_socket_event(uv_poll_t* handle, int status, int events) {
  auto* self = static_cast<Session*>(handle->data);
  auto keep_alive = self->shared_from_this();
  if (status < 0) {
    self->close(std::string("socket error: ") + uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE) self->flush_output();
  if (!self->closed() && (events & (UV_READABLE | UV_DISCONNECT))) self->read_socket();
}

void Session::read_socket() {
  char buffer[8192];
  bool gone = false;
  for (;;) {
    ssize_t n = ::recv(fd_, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) {
      decoder_.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    gone = true;  // EOF or error: the process is gone (or closed its socket)
    break;
  }
  // Frames that arrived with the EOF count (px_disconnect's goodbye comes just before it).
  std::string payload;
  std::string error;
  while (!closed()) {
    int got = decoder_.next(&payload, &error);
    if (got == 0) break;
    if (got < 0) {
      PX_LOG_WARN_AT(log_fields(), "dropping %s: malformed control stream: %s", label().c_str(),
                     error.c_str());
      close("sent a malformed control stream");
      return;
    }
    handle_frame(payload);
  }
  if (gone)
    close(left_cleanly_ ? "left (px_disconnect)"
                        : "lost its connection (process exited or was killed)");
}

void Session::send_frame(const std::string& frame) {
  output_ += frame;
  flush_output();
}

void Session::flush_output() {
  while (!output_.empty()) {
    ssize_t n = send_with_fds(fd_, output_.data(), output_.size(), nullptr, 0);
    if (n > 0) {
      output_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close(std::string("send failed: ") + strerror(errno));
    return;
  }
  if (output_.empty() && close_after_flush_) {
    close("refused");
    return;
  }
  if (!closed()) update_socket_poll();
}

px_status Session::to_client(px_status status) const {
  constexpr uint32_t kMembershipMinor = 15;  // the ABI minor that added PX_ERR_MEMBERSHIP
  if (status == PX_ERR_PEER_LOST && job_ && !job_->broken().empty()) status = job_->broken_status();
  if (status == PX_ERR_MEMBERSHIP && client_minor_ < kMembershipMinor) status = PX_ERR_PEER_LOST;
  return status;
}

void Session::refuse(px_status status, const std::string& message) {
  flatbuffers::FlatBufferBuilder b;
  auto text = b.CreateString(message);
  control::HelloReplyBuilder reply(b);
  reply.add_status(to_client(status));
  reply.add_message(text);
  reply.add_daemon_abi_version(PX_ABI_VERSION);
  auto body = reply.Finish();
  close_after_flush_ = true;
  send_frame(finish_frame(b, control::Body::HelloReply, body.Union()));
}

void Session::handle_frame(const std::string& payload) {
  std::string error;
  const control::Message* message = parse_frame(payload, &error);
  if (!message) {
    PX_LOG_WARN_AT(log_fields(), "dropping %s: %s", label().c_str(), error.c_str());
    close("sent a malformed control message");
    return;
  }
  switch (message->body_type()) {
    case control::Body::Hello:
      if (state_ == State::kHandshake) return handle_hello(*message->body_as_Hello());
      break;
    case control::Body::RegisterDense:
      if (state_ == State::kActive) return handle_register(*message->body_as_RegisterDense());
      break;
    case control::Body::RegisterSparse:
      if (state_ == State::kActive)
        return handle_register_sparse(*message->body_as_RegisterSparse());
      break;
    case control::Body::Checkpoint:
      if (state_ == State::kActive) return handle_checkpoint(*message->body_as_Checkpoint());
      break;
    case control::Body::StatsRequest:
      if (state_ == State::kActive) return handle_stats(*message->body_as_StatsRequest());
      break;
    case control::Body::SetSparseLr:
      if (state_ == State::kActive) return handle_set_sparse_lr(*message->body_as_SetSparseLr());
      break;
    case control::Body::ErrorText:
      if (state_ == State::kActive) return handle_error_text(*message->body_as_ErrorText());
      break;
    case control::Body::Cancel:
      if (state_ == State::kActive) return handle_cancel(*message->body_as_Cancel());
      break;
    case control::Body::Abort:
      if (state_ == State::kActive) return handle_abort(*message->body_as_Abort());
      break;
    case control::Body::RegisterDeviceMemory:
      if (state_ == State::kActive)
        return handle_register_device_memory(*message->body_as_RegisterDeviceMemory());
      break;
    case control::Body::ReleaseDeviceMemory:
      if (state_ == State::kActive)
        return handle_release_device_memory(*message->body_as_ReleaseDeviceMemory());
      break;
    case control::Body::Goodbye:
      left_cleanly_ = true;
      return;
    case control::Body::AdminRequest:
      if ((state_ == State::kHandshake && !close_after_flush_) || state_ == State::kAdmin) {
        state_ = State::kAdmin;
        return handle_admin_request(server_, shared_from_this(), *message->body_as_AdminRequest());
      }
      break;
    default:
      break;
  }
  PX_LOG_WARN_AT(log_fields(), "dropping %s: unexpected control message %s", label().c_str(),
                 control::EnumNameBody(message->body_type()));
  close("sent an unexpected control message");
}

void Session::handle_hello(const control::Hello& hello) {
  uint32_t client_abi = hello.abi_version();
  if ((client_abi >> 16) != PX_ABI_VERSION_MAJOR || (client_abi & 0xffff) > PX_ABI_VERSION_MINOR) {
    std::string message = "client ABI " + abi_string(client_abi) +
                          " is not supported by parallaxd " + "(ABI " + abi_string(PX_ABI_VERSION) +
                          ")";
    PX_LOG_WARN_AT(log_fields(), "refusing pid %d: %s", static_cast<int>(pid_), message.c_str());
    return refuse(PX_ERR_VERSION, message);
  }
  client_minor_ = client_abi & 0xffff;
  std::string job = hello.job() ? hello.job()->str() : "";
  if (job.empty() || job.size() > kMaxNameBytes)
    return refuse(PX_ERR_INVALID, "job name must have 1 to 255 bytes");
  int local_size = hello.local_size();
  if (local_size < 1 || local_size > kMaxLocalSize)
    return refuse(PX_ERR_INVALID, "local_size " + std::to_string(local_size) + " is not in 1.." +
                                      std::to_string(kMaxLocalSize));
  if (hello.local_rank() < -1 || hello.local_rank() >= local_size)
    return refuse(PX_ERR_INVALID, "local_rank " + std::to_string(hello.local_rank()) +
                                      " is not in 0.." + std::to_string(local_size - 1));
  uint64_t arena_bytes =
      hello.arena_bytes() ? hello.arena_bytes() : server_.config().default_arena_bytes;
  if (arena_bytes < kMinArenaBytes || arena_bytes > server_.config().max_arena_bytes)
    return refuse(PX_ERR_INVALID, "arena_bytes " + std::to_string(arena_bytes) + " is not in " +
                                      std::to_string(kMinArenaBytes) + ".." +
                                      std::to_string(server_.config().max_arena_bytes));
  std::string error;
  if (!SharedArena::create(arena_bytes, server_.config().ring_capacity, &arena_, &error) ||
      !Doorbell::create(&submit_bell_, &error) || !Doorbell::create(&completion_bell_, &error)) {
    PX_LOG_ERROR_AT(log_fields(), "cannot set up shared memory for pid %d: %s",
                    static_cast<int>(pid_), error.c_str());
    return refuse(PX_ERR_NO_MEMORY, "parallaxd could not create the shared arena: " + error);
  }
  submit_ring_ = arena_.submit_ring();
  completion_ring_ = arena_.completion_ring();
  job_name_ = job;
  state_ = State::kWaitingForJob;
  int rank = -1;
  px_status status = server_.join_job(shared_from_this(), job, local_size, hello.local_rank(),
                                      &job_, &rank, &error);
  if (status != PX_OK) {
    state_ = State::kHandshake;
    job_.reset();
    job_name_.clear();
    LogFields fields = log_fields();
    fields.job = job;
    PX_LOG_WARN_AT(fields, "refusing pid %d: %s", static_cast<int>(pid_), error.c_str());
    return refuse(status, error);
  }
  local_rank_ = rank;
  PX_LOG_INFO_AT(log_fields(), "%s connected (%d of %d)", label().c_str(), job_->connected(),
                 local_size);
}

void Session::fail_waiting(px_status status, const std::string& message) {
  if (state_ == State::kWaitingForJob) refuse(status, message);
}

void Session::activate() {
  if (state_ != State::kWaitingForJob) return;
  Job& job = *job_;
  flatbuffers::FlatBufferBuilder b;
  // The GPUs workers may hand memory to (px_alloc_ex), or why there are none.
  std::vector<std::string> bus_ids;
  if (const gpu::GpuBackend* backend = server_.gpu().backend())
    for (const gpu::GpuDevice& d : backend->inventory().devices) bus_ids.push_back(d.pci_bus_id);
  auto gpu_ids = b.CreateVectorOfStrings(bus_ids);
  auto gpu_why = b.CreateString(bus_ids.empty() ? server_.gpu().why_none() : "");
  control::HelloReplyBuilder reply(b);
  reply.add_status(PX_OK);
  reply.add_gpu_pci_bus_ids(gpu_ids);
  reply.add_gpu_why_none(gpu_why);
  reply.add_daemon_abi_version(PX_ABI_VERSION);
  const JobWorld& world = job.world();
  reply.add_node_index(world.node_index);
  reply.add_node_count(world.node_count);
  reply.add_rank(world.rank_offset + local_rank_);
  reply.add_world_size(world.world_size);
  reply.add_local_rank(local_rank_);
  reply.add_local_size(job.local_size());
  auto body = reply.Finish();
  std::string frame = finish_frame(b, control::Body::HelloReply, body.Union());
  int fds[3] = {arena_.fd(), submit_bell_.fd(), completion_bell_.fd()};
  ssize_t n = send_with_fds(fd_, frame.data(), frame.size(), fds, 3);
  if (n <= 0) {
    close(std::string("could not send the arena: ") + strerror(errno));
    return;
  }
  output_ = frame.substr(static_cast<size_t>(n));
  arena_.close_fd();  // the mapping is all the daemon needs; the client holds the fd now
  state_ = State::kActive;
  uv_poll_init(server_.loop(), &doorbell_poll_, submit_bell_.fd());
  doorbell_poll_.data = this;
  ++open_handles_;
  doorbell_polling_ = true;
  uv_poll_start(&doorbell_poll_, UV_READABLE, on_doorbell);
  flush_output();
}

void Session::reply_register(px_status status, const std::string& message, uint32_t var_id) {
  flatbuffers::FlatBufferBuilder b;
  auto text = b.CreateString(message);
  auto body = control::CreateRegisterReply(b, to_client(status), text, var_id);
  send_frame(finish_frame(b, control::Body::RegisterReply, body.Union()));
}

void Session::handle_register(const control::RegisterDense& request) {
  std::string name = request.name() ? request.name()->str() : "";
  if (name.empty() || name.size() > kMaxNameBytes)
    return reply_register(PX_ERR_INVALID, "variable name must have 1 to 255 bytes", 0);
  if (!valid_dtype(request.dtype()) || !valid_reduce_op(request.op()))
    return reply_register(PX_ERR_INVALID, "variable '" + name + "': unknown dtype or reduce op", 0);
  Fingerprint fingerprint;
  fingerprint.dtype = static_cast<DType>(request.dtype());
  fingerprint.count = request.count();
  fingerprint.op = static_cast<ReduceOp>(request.op());
  if (fingerprint.count == 0 ||
      fingerprint.count > kMaxVariableBytes / dtype_size(fingerprint.dtype))
    return reply_register(PX_ERR_INVALID,
                          "variable '" + name + "': count " + std::to_string(fingerprint.count) +
                              " is zero or too large",
                          0);
  uint32_t wire = request.wire_dtype();
  if (wire != static_cast<uint32_t>(DType::kF32)) {
    if (!is_wire16(static_cast<DType>(wire)))
      return reply_register(PX_ERR_INVALID,
                            "variable '" + name + "': wire_dtype " + std::to_string(wire) +
                                " is not PX_F32, PX_BF16 or PX_F16",
                            0);
    if (fingerprint.dtype != DType::kF32)
      return reply_register(PX_ERR_INVALID,
                            "variable '" + name + "': a 16-bit wire needs an f32 variable, not " +
                                dtype_name(fingerprint.dtype),
                            0);
    fingerprint.options = dense_wire_option(static_cast<DType>(wire));
  }
  register_variable(name, fingerprint, nullptr);
}

namespace {

// (1.12) A table group's layout as words of its fingerprint (" table:NAME=ROWS" each, so a
// mismatch names the tables that differ), after checking it: unique names of 1 to 255 bytes,
// rows that sum to the variable's. "" for a single table.
bool group_tables(const control::RegisterSparse& request, const std::string& what, std::string* out,
                  std::string* error) {
  const auto* names = request.table_names();
  const auto* rows = request.table_rows();
  out->clear();
  if (!names && !rows) return true;
  constexpr uint32_t kMaxTables = 4096;
  if (!names || !rows || names->size() != rows->size() || names->size() == 0 ||
      names->size() > kMaxTables) {
    *error = what + ": a table group needs 1 to " + std::to_string(kMaxTables) +
             " tables, each with a name and rows";
    return false;
  }
  std::set<std::string> seen;
  uint64_t total = 0;
  for (uint32_t t = 0; t < names->size(); ++t) {
    std::string table = names->Get(t) ? names->Get(t)->str() : "";
    uint64_t n = rows->Get(t);
    if (table.empty() || table.size() > kMaxNameBytes || !seen.insert(table).second) {
      *error = what + ": table " + std::to_string(t) + " ('" + table +
               "') needs a name of 1 to 255 bytes unique in the group";
      return false;
    }
    if (n == 0 || n > request.rows() - total) {
      *error = what + ": table '" + table + "' has " + std::to_string(n) +
               " rows: every table needs at least one, and the tables' rows must sum to the "
               "group's " +
               std::to_string(request.rows());
      return false;
    }
    total += n;
    *out += " table:" + table + "=" + std::to_string(n);
  }
  if (total != request.rows()) {
    *error = what + ": the tables' rows sum to " + std::to_string(total) + ", not the group's " +
             std::to_string(request.rows());
    return false;
  }
  return true;
}

}  // namespace

void Session::handle_register_sparse(const control::RegisterSparse& request) {
  std::string name = request.name() ? request.name()->str() : "";
  if (name.empty() || name.size() > kMaxNameBytes)
    return reply_register(PX_ERR_INVALID, "variable name must have 1 to 255 bytes", 0);
  std::string what = "sparse variable '" + name + "'";
  if (!valid_dtype(request.dtype()))
    return reply_register(PX_ERR_INVALID, what + ": unknown dtype", 0);
  if (static_cast<DType>(request.dtype()) != DType::kF32)
    return reply_register(PX_ERR_NOT_IMPLEMENTED,
                          what + ": only f32 tables are implemented (README, limits)", 0);
  uint64_t rows = request.rows(), dim = request.dim();
  if (rows == 0 || dim == 0 || rows > (1ull << 62) / dim ||
      rows * dim > kMaxVariableBytes / sizeof(float))
    return reply_register(
        PX_ERR_INVALID,
        what + ": " + std::to_string(rows) + " x " + std::to_string(dim) + " is empty or too large",
        0);
  const control::SparseOptions* o = request.options();
  if (!o) return reply_register(PX_ERR_PROTOCOL, what + ": options missing", 0);
  SparseOptions options;
  options.optimizer = static_cast<Optimizer>(o->optimizer());
  options.learning_rate = o->learning_rate();
  options.beta1 = o->beta1();
  options.beta2 = o->beta2();
  options.epsilon = o->epsilon();
  options.initial_accumulator = o->initial_accumulator();
  options.initializer = static_cast<Initializer>(o->initializer());
  options.init_seed = o->init_seed();
  options.init_low = o->init_low();
  options.init_high = o->init_high();
  options.init_std = o->init_std();
  if (o->aggregation() != PX_SUM && o->aggregation() != PX_MEAN)
    return reply_register(PX_ERR_INVALID, what + ": aggregation must be PX_SUM or PX_MEAN", 0);
  options.mean = o->aggregation() == PX_MEAN;
  options.consistency = static_cast<Consistency>(o->consistency());
  options.staleness = o->staleness();
  options.partitions = o->partitions();
  options.route = static_cast<Route>(o->route());
  options.nonfinite = static_cast<NonFinite>(o->nonfinite());
  options.alltoall_split = static_cast<Split>(o->alltoall_split());
  options.wire = static_cast<WireDtype>(o->wire_dtype());
  if (o->prefetch() > 1)
    return reply_register(PX_ERR_INVALID, what + ": prefetch must be 0 or 1", 0);
  options.prefetch = o->prefetch() == 1;
  options.cache_rows = o->cache_rows();
  options.cache_staleness = o->cache_staleness();
  options.replicas = std::max<uint32_t>(1, o->replicas());
  std::string error;
  if (!options.validate(&error)) return reply_register(PX_ERR_INVALID, what + ": " + error, 0);
  // Copies serve only a next run handed over, which membership on etcd makes.
  if (options.replicas > 1 && !server_.scheduler().sparse().handover_on())
    return reply_register(PX_ERR_INVALID,
                          what +
                              ": replicas need membership on etcd (parallaxd --membership): "
                              "a static cluster's next run comes back from the checkpoint",
                          0);
  Fingerprint fingerprint;
  fingerprint.count = rows;
  fingerprint.sparse = true;
  fingerprint.dim = dim;
  fingerprint.options = options.canonical();
  std::string tables;
  if (!group_tables(request, what, &tables, &error))
    return reply_register(PX_ERR_INVALID, error, 0);
  fingerprint.options += tables;  // compared like the options: every worker's must match
  register_variable(name, fingerprint, &options);
}

std::string Session::job_limit_refusal(const std::string& name,
                                       const Fingerprint& fingerprint) const {
  const DaemonConfig::JobLimits& limits = server_.config().job_limits;
  Job& job = *job_;
  std::string what = "job '" + job.name() + "' on " +
                     server_.node_label(server_.config().node_index) + ": variable '" + name +
                     "' registered by " + label() + " is refused: ";
  uint64_t variables = job.variables().size();  // the barrier is variable 0: this is one more
  if (limits.variables != 0 && variables > limits.variables)
    return what + "the job would have " + std::to_string(variables) +
           " variables, more than limits.job_variables = " + std::to_string(limits.variables);
  if (fingerprint.sparse && limits.sparse_table_bytes != 0) {
    uint64_t bytes = job.sparse_table_bytes() + fingerprint.bytes() * fingerprint.dim;
    if (bytes > limits.sparse_table_bytes)
      return what + "its table would bring the job's sparse tables to " + std::to_string(bytes) +
             " bytes, more than limits.job_sparse_table_bytes = " +
             std::to_string(limits.sparse_table_bytes);
  }
  return "";
}

void Session::register_variable(const std::string& name, const Fingerprint& fingerprint,
                                const SparseOptions* sparse_options) {
  Job& job = *job_;
  Variable* var = job.find(name);
  if (!var) {
    std::string refused = job_limit_refusal(name, fingerprint);
    if (!refused.empty()) {
      PX_LOG_WARN_AT(log_fields(name), "%s", refused.c_str());
      return reply_register(PX_ERR_NO_MEMORY, refused, 0);
    }
    var = &job.add(name, fingerprint, label());
    if (sparse_options) {
      Server& server = server_;
      SparseRouter& router = server.scheduler().sparse();
      var->sparse =
          router.create(job, *var, SparseShape{fingerprint.count, fingerprint.dim}, *sparse_options,
                        [&server](int rank) { return server.rank_label(rank); });
      std::string error;
      if (!router.restore(*var->sparse, job, *var, &error)) {
        var->poison_status = PX_ERR_INVALID;
        var->poison_message = "variable '" + name + "' cannot be restored: " + error;
        PX_LOG_ERROR_AT(log_fields(name), "%s", var->poison_message.c_str());
      }
    }
    server_.variable_added(job, *var);
  } else if (var->poison_status == PX_OK && !(var->fingerprint == fingerprint) &&
             var->registered[static_cast<size_t>(local_rank_)]) {
    // This worker already holds the variable: its second, different registration is its
    // own mistake and fails alone; the registered variable stays good.
    return reply_register(PX_ERR_MISMATCH,
                          "variable '" + name + "' of job '" + job.name() +
                              "' is already registered by " + label() + " as " +
                              var->fingerprint.describe_difference(fingerprint) +
                              "; registering it again as " +
                              fingerprint.describe_difference(var->fingerprint) + " fails",
                          0);
  } else if (var->poison_status == PX_OK && !(var->fingerprint == fingerprint)) {
    var->poison_status = PX_ERR_MISMATCH;
    var->poison_message = "variable '" + name + "' of job '" + job.name() + "' registered as " +
                          var->fingerprint.describe_difference(fingerprint) + " by " +
                          var->defined_by + " and as " +
                          fingerprint.describe_difference(var->fingerprint) + " by " + label();
    PX_LOG_WARN_AT(log_fields(name), "%s", var->poison_message.c_str());
    server_.scheduler().fail_variable(*var, PX_ERR_MISMATCH, var->poison_message);
    server_.variable_conflict(job, *var, fingerprint);
  }
  if (var->poison_status != PX_OK)
    return reply_register(var->poison_status, var->poison_message, 0);
  var->registered[static_cast<size_t>(local_rank_)] = true;
  reply_register(PX_OK, "", var->id);
}

void Session::handle_checkpoint(const control::Checkpoint& request) {
  std::string dir = request.path() ? request.path()->str() : "";
  struct Pending {
    int left = 1;  // released after the loop
    px_status status = PX_OK;
    std::string message;
    bool replied = false;
    std::shared_ptr<LoopTimer> deadline;
  };
  auto pending = std::make_shared<Pending>();
  auto reply = [self = shared_from_this(), pending](px_status status, const std::string& message) {
    if (pending->replied) return;
    pending->replied = true;
    if (pending->deadline) pending->deadline->cancel();
    if (self->closed()) return;
    flatbuffers::FlatBufferBuilder b;
    auto text = b.CreateString(message);
    auto body = control::CreateCheckpointReply(b, self->to_client(status), text);
    self->send_frame(finish_frame(b, control::Body::CheckpointReply, body.Union()));
  };
  if (dir.empty() || dir.size() > 4000 || dir.find('\0') != std::string::npos)
    return reply(PX_ERR_INVALID, "px_checkpoint: the path must have 1 to 4000 bytes");
  ::mkdir(dir.c_str(), 0750);  // the other nodes need it too: a shared or same-named path
  if (!job_->broken().empty()) return reply(PX_ERR_PEER_LOST, job_->broken());
  auto finish_one = [pending, reply](px_status status, const std::string& message) {
    if (status != PX_OK && pending->status == PX_OK) {
      pending->status = status;
      pending->message = message;
    }
    if (--pending->left == 0) reply(pending->status, pending->message);
  };
  int variables = 0;
  for (auto& var : job_->variables()) {
    if (!var->sparse || !var->registered[static_cast<size_t>(local_rank_)]) continue;
    if (var->poison_status != PX_OK) {  // its failure is the answer; nothing to wait for
      if (pending->status == PX_OK) {
        pending->status = var->poison_status;
        pending->message = var->poison_message;
      }
      continue;
    }
    ++pending->left;
    ++variables;
    uint64_t pushes = var->next_step(local_rank_, static_cast<uint16_t>(Opcode::kPushRows));
    server_.scheduler().sparse().checkpoint(job_, *var, pushes, dir, finish_one);
  }
  PX_LOG_INFO_AT(log_fields(), "%s: checkpoint of %d sparse variables to %s", label().c_str(),
                 variables, dir.c_str());
  int64_t timeout_ms = request.timeout_ms();
  if (pending->left > 1 && timeout_ms > 0) {
    // The shard writes already asked for go on; a manifest still appears if they finish.
    std::string text = "checkpoint to " + dir + " by " + label() + " did not complete within " +
                       std::to_string(timeout_ms) +
                       " ms (every node's workers must first push the steps this worker pushed)";
    pending->deadline = LoopTimer::start(server_.loop(), static_cast<uint64_t>(timeout_ms),
                                         [reply, text] { reply(PX_ERR_TIMEOUT, text); });
  }
  finish_one(PX_OK, "");
}

void Session::handle_error_text(const control::ErrorText& request) {
  flatbuffers::FlatBufferBuilder b;
  auto it = long_messages_.find(request.request_id());
  flatbuffers::Offset<control::ErrorTextReply> body;
  if (it == long_messages_.end()) {
    body = control::CreateErrorTextReply(b, false);
  } else {
    auto text = b.CreateString(it->second);
    body = control::CreateErrorTextReply(b, true, text);
    long_messages_.erase(it);  // its place in long_message_order_ is skipped when dropped
  }
  send_frame(finish_frame(b, control::Body::ErrorTextReply, body.Union()));
}

void Session::handle_cancel(const control::Cancel& request) {
  std::string reason = request.reason() ? request.reason()->str() : "cancelled";
  std::string message;
  bool withdrawn = server_.scheduler().withdraw(*job_, local_rank_, *this, request.request_id(),
                                                reason.substr(0, 1024), &message);
  if (withdrawn) {
    PX_LOG_INFO_AT(log_fields(), "%s", message.c_str());
    // The other nodes cannot complete that step without this node's share of it.
    if (job_->world().node_count > 1)
      server_.abort_job(*job_, message +
                                   "; a withdrawn step cannot complete on the other "
                                   "nodes, so the job ends");
  }
  flatbuffers::FlatBufferBuilder b;
  auto body = control::CreateCancelReply(b, withdrawn);
  send_frame(finish_frame(b, control::Body::CancelReply, body.Union()));
}

void Session::handle_abort(const control::Abort& request) {
  std::string reason = request.reason() ? request.reason()->str() : "";
  std::string why = label() + " called px_abort: " + reason.substr(0, 4096);
  PX_LOG_WARN_AT(log_fields(), "%s", why.c_str());
  server_.abort_job(*job_, why);
  flatbuffers::FlatBufferBuilder b;
  auto body = control::CreateAbortReply(b, PX_OK);
  send_frame(finish_frame(b, control::Body::AbortReply, body.Union()));
}

// px_set_sparse_lr: the rate from push step from_step on (learning_rates.h).
void Session::handle_set_sparse_lr(const control::SetSparseLr& request) {
  Variable* var = job_->find(request.var_id());
  uint64_t step = request.from_step();
  double rate = request.learning_rate();
  px_status status = PX_OK;
  std::string why;
  if (!var || !var->registered[static_cast<size_t>(local_rank_)]) {
    status = PX_ERR_NOT_FOUND;
    why = "variable id " + std::to_string(request.var_id()) + " is not registered by " + label();
  } else if (!var->sparse) {
    status = PX_ERR_INVALID;
    why = "variable '" + var->name + "' is not sparse";
  } else if (!std::isfinite(rate) || rate < 0) {
    status = PX_ERR_INVALID;
    why = "learning rate " + std::to_string(rate) + " is not finite and >= 0";
  } else {
    LearningRates& rates = *var->sparse->learning_rates;
    const uint16_t push = static_cast<uint16_t>(Opcode::kPushRows);
    for (int r = 0; r < job_->local_size() && why.empty(); ++r)
      if (r != local_rank_ && var->steps_submitted(r, push) > step && !rates.asked(step, r))
        why = "local worker " + std::to_string(r) + " pushed step " + std::to_string(step) +
              " already, with the rate in force then";
    if (why.empty()) why = rates.ask(step, rate, local_rank_, job_->local_size());
    if (!why.empty()) {
      status = PX_ERR_MISMATCH;
      why = label() + " sets learning rate " + std::to_string(rate) + " of variable '" + var->name +
            "' from push step " + std::to_string(step) + ", but " + why;
    } else {
      PX_LOG_DEBUG_AT(log_fields(var->name), "%s: learning rate %g from push step %llu",
                      label().c_str(), rate, static_cast<unsigned long long>(step));
    }
  }
  flatbuffers::FlatBufferBuilder b;
  auto body =
      control::CreateSetSparseLrReply(b, to_client(status), why.empty() ? 0 : b.CreateString(why));
  send_frame(finish_frame(b, control::Body::SetSparseLrReply, body.Union()));
}

void Session::handle_stats(const control::StatsRequest& request) {
  flatbuffers::FlatBufferBuilder b;
  Variable* var = job_->find(request.var_id());
  flatbuffers::Offset<control::StatsReply> body;
  if (!var) {
    auto text = b.CreateString("variable id " + std::to_string(request.var_id()) + " is unknown");
    body = control::CreateStatsReply(b, PX_ERR_NOT_FOUND, text);
  } else {
    const VarStats& s = var->stats;
    SparseCounters sc;
    if (var->sparse) sc = sparse_counters(*var->sparse);
    body = control::CreateStatsReply(
        b, PX_OK, 0, s.ops, s.bytes, s.wait_ns, s.reduce_ns, sc.pull_steps, sc.push_steps,
        sc.rows_pulled, sc.rows_unique, sc.rows_applied, sc.bytes_sent, sc.bytes_received,
        sc.request_partitions, sc.search_steps_left, sc.restored_steps, sc.rows_served_ahead,
        sc.cache_hits, sc.cache_misses, sc.cache_rows, sc.cache_bytes_saved, sc.cache_rows_flushed);
  }
  send_frame(finish_frame(b, control::Body::StatsReply, body.Union()));
}

void Session::on_doorbell(uv_poll_t* handle, int status, int) {
  auto* self = static_cast<Session*>(handle->data);
  auto keep_alive = self->shared_from_this();
  if (status < 0) return self->close(std::string("doorbell error: ") + uv_strerror(status));
  self->submit_bell_.drain();
  self->drain_submissions();
}

void Session::drain_submissions() {
  // Bounded per wake-up so one busy client cannot starve the others; if entries remain we
  // ring our own doorbell to come back on the next loop iteration.
  uint32_t budget = submit_ring_.capacity();
  SubmitEntry entry;
  std::shared_ptr<Completer> self = shared_from_this();
  for (;;) {
    while (budget > 0 && !closed() && submit_ring_.try_pop(&entry)) {
      --budget;
      ++outstanding_;
      ++job_->usage().requests_in_flight;
      if (std::string over = request_limit_refusal(); !over.empty()) {
        complete(entry.request_id, PX_ERR_BUSY, over);
        continue;
      }
      if (server_.service().draining()) {  // SIGTERM: only what completes a started step
        std::string refused;
        if (!server_.service().admits(*job_, entry, &refused)) {
          complete(entry.request_id, PX_ERR_PEER_LOST, refused);
          continue;
        }
      }
      server_.scheduler().submit(job_, local_rank_, self, entry);
    }
    if (closed()) return;
    if (budget == 0) {
      submit_bell_.ring();
      return;
    }
    if (submit_ring_.arm_and_check_empty()) return;
  }
}

std::string Session::request_limit_refusal() const {
  // A client that keeps to its ring never gets here: its library counts the requests whose
  // completions it has not read, and those are at least the daemon's.
  if (outstanding_ > submit_ring_.capacity())
    return label() + " has " + std::to_string(outstanding_) +
           " requests in flight, more than its ring's " + std::to_string(submit_ring_.capacity()) +
           "; wait some first";
  uint64_t limit = server_.config().job_limits.requests_in_flight;
  uint64_t held = job_->usage().requests_in_flight;
  if (limit != 0 && held > limit)
    return "job '" + job_->name() + "' on " + server_.node_label(server_.config().node_index) +
           " has " + std::to_string(held) +
           " requests in flight, more than limits.job_requests_in_flight = " +
           std::to_string(limit) + " (refused for " + label() + "); wait some first";
  return "";
}

void Session::complete(uint64_t request_id, px_status status, const std::string& message) {
  PX_ASSERT_LOOP_THREAD();
  if (outstanding_ > 0) {
    --outstanding_;
    // A closed session's share left the job's count when it closed.
    if (state_ == State::kActive) --job_->usage().requests_in_flight;
  }
  if (state_ != State::kActive) return;
  server_.observer().request_completed(status);
  CompletionEntry entry{};
  entry.request_id = request_id;
  entry.status = to_client(status);
  if (status != PX_OK) {
    size_t n = std::min(message.size(), kCompletionMessageBytes - 1);
    std::memcpy(entry.message, message.data(), n);
    if (n < message.size()) {  // the client fetches the whole text (ErrorText)
      entry.flags |= kCompletionMessageOnDaemon;
      if (long_messages_.emplace(request_id, message).second)
        long_message_order_.push_back(request_id);
      while (long_message_order_.size() > 2 * static_cast<size_t>(completion_ring_.capacity())) {
        long_messages_.erase(long_message_order_.front());
        long_message_order_.pop_front();
      }
    }
  }
  if (!completion_ring_.try_push(entry)) {
    PX_LOG_WARN_AT(log_fields(), "dropping %s: it does not consume its completions",
                   label().c_str());
    close("overflowed its completion ring");
    return;
  }
  if (completion_ring_.consumer_needs_wakeup()) completion_bell_.ring();
}

void Session::close(const std::string& reason) {
  if (state_ == State::kClosed) return;
  bool was_member = state_ == State::kWaitingForJob || state_ == State::kActive;
  bool was_admin = state_ == State::kAdmin;  // pxctl comes and goes: not worth a line
  if (state_ == State::kActive) job_->usage().requests_in_flight -= outstanding_;
  state_ = State::kClosed;
  if (reason != "refused" && !was_admin)
    PX_LOG_INFO_AT(log_fields(), "%s %s", label().c_str(), reason.c_str());
  if (was_member && job_) server_.leave_job(*this, reason);
  uv_poll_stop(&socket_poll_);
  uv_close(reinterpret_cast<uv_handle_t*>(&socket_poll_), on_handle_closed);
  if (doorbell_polling_) {
    uv_poll_stop(&doorbell_poll_);
    uv_close(reinterpret_cast<uv_handle_t*>(&doorbell_poll_), on_handle_closed);
  }
}

void Session::on_handle_closed(uv_handle_t* handle) {
  auto* self = static_cast<Session*>(handle->data);
  if (--self->open_handles_ == 0) self->server_.forget_session(self->id_);
}

}  // namespace px
