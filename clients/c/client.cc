// libparallax: connection, world, registration and arena memory.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "clients/c/client_internal.h"
#include "clients/c/launch_env.h"
#include "sharding/sparse_spec.h"  // header only: the sparse defaults

using px::fail;
using px::succeed;

namespace px {

// The ABI version a caller is taken for when it does not say (px_connect without options,
// or the px_connect_options_init symbol of callers built before 1.15): the last minor
// before PX_ERR_MEMBERSHIP, so that no status it cannot know reaches it.
constexpr uint32_t kAbiBeforeMembership = (1u << 16) | 14u;

Client::~Client() {
  if (socket_fd >= 0) ::close(socket_fd);
  if (epoll_fd >= 0) ::close(epoll_fd);
}

std::string Client::worker_label() const {
  return "worker local rank " + std::to_string(world.local_rank) + " of job '" + job + "'" +
         (world.node_count > 1 ? " on node " + std::to_string(world.node_index) : "");
}

namespace {

constexpr const char* kDefaultSocket = "/run/parallax/parallaxd.sock";
constexpr int64_t kDefaultTimeoutMs = 30000;
constexpr uint64_t kDefaultArenaBytes = 256ull << 20;

// True if the caller's (possibly older, smaller) options struct contains field.
#define PX_HAS_FIELD(options, type, field) \
  ((options)->struct_size >= offsetof(type, field) + sizeof((options)->field))

// A variable of px_connect's own (not a launcher's, launch_env.cc): *present says whether
// it is set; false, naming it, when it is set to anything but a whole integer in [min, max].
bool env_integer(const char* name, long long min, long long max, long long* out, bool* present,
                 std::string* error) {
  const char* v = getenv(name);
  *present = v && *v;
  if (!*present) return true;
  char* end = nullptr;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (*end || errno || end == v || x < min || x > max) {
    *error = std::string(name) + "='" + v + "' is not a whole number in " + std::to_string(min) +
             ".." + std::to_string(max);
    return false;
  }
  *out = x;
  return true;
}

std::string abi_string(uint32_t v) {
  return std::to_string(v >> 16) + "." + std::to_string(v & 0xffff);
}

// Connects to the daemon's socket. With wait, retries while it is not there yet (a daemon
// and its workers started together) until the deadline; without, fails at once.
px_status connect_socket(const std::string& path, bool wait, int64_t deadline_ns, int* out_fd) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    return fail(PX_ERR_INVALID, "socket path '" + path + "' is empty or too long");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(PX_ERR_CONNECT, std::string("socket: ") + strerror(errno));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      *out_fd = fd;
      return PX_OK;
    }
    int err = errno;
    ::close(fd);
    bool absent = err == ENOENT || err == ECONNREFUSED;
    bool retry = (wait && absent) || err == EAGAIN || err == EINTR;
    if (!retry || monotonic_ns() >= deadline_ns)
      return fail(err == EACCES ? PX_ERR_PERMISSION : PX_ERR_CONNECT,
                  "cannot connect to parallaxd at " + path + ": " + strerror(err) +
                      (retry    ? " (gave up at the connect deadline)"
                       : absent ? " (is parallaxd running with this socket? To wait for it to "
                                  "appear, set px_connect_options.wait_for_daemon = 1 or "
                                  "PARALLAX_WAIT_FOR_DAEMON=1)"
                                : ""));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

void mark_lost(Client* c, const std::string& why);  // requests.cc

px_status control_call(Client* c, const std::string& frame, control::Body expected,
                       std::string* payload, const control::Message** reply, int64_t timeout_ms) {
  std::lock_guard<std::mutex> control(c->control_mutex);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (c->closed) return fail(c, PX_ERR_CANCELLED, "the client was disconnected");
    if (c->lost_status != PX_OK) return fail(c, c->lost_status, c->lost_message);
    c->control_active = true;  // waiters leave the socket's bytes to this call
  }
  std::string error;
  bool timed_out = false;
  int64_t deadline =
      monotonic_ns() + (timeout_ms > 0 ? timeout_ms : c->control_timeout_ms) * 1000000;
  bool ok =
      send_frame_blocking(c->socket_fd, frame, deadline, &error, &timed_out) &&
      recv_frame_blocking(c->socket_fd, c->decoder, payload, nullptr, deadline, &error, &timed_out);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->control_active = false;
    if (!ok && !timed_out && !c->closed)
      mark_lost(c, "parallaxd at " + c->socket_path + " closed the connection");
  }
  if (!ok) {
    c->completion_bell.ring();  // a waiter asleep on the doorbell sees the loss now
    return fail(c, timed_out ? PX_ERR_TIMEOUT : PX_ERR_PEER_LOST,
                "parallaxd at " + c->socket_path + ": " + error);
  }
  const control::Message* message = parse_frame(*payload, &error);
  if (!message || message->body_type() != expected)
    return fail(
        c, PX_ERR_PROTOCOL,
        "parallaxd sent an unexpected reply: " +
            (message ? std::string("wrong type ") + control::EnumNameBody(message->body_type())
                     : error));
  *reply = message;
  return PX_OK;
}

bool arena_offset(const Client* c, const void* p, uint64_t bytes, uint64_t* offset) {
  const char* base = c->arena.base();
  const char* q = static_cast<const char*>(p);
  if (q < base || q >= base + c->arena.size()) return false;
  uint64_t off = static_cast<uint64_t>(q - base);
  if (!c->arena.heap_contains(off, bytes)) return false;
  *offset = off;
  return true;
}

// One registration round trip; on success *out_var is the client's handle for the variable
// (the existing one when the worker registers a name twice).
px_status register_var(const std::shared_ptr<Client>& client, const std::string& frame,
                       Var&& fields, px_var** out_var) {
  std::string payload;
  const control::Message* message = nullptr;
  px_status status =
      control_call(client.get(), frame, control::Body::RegisterReply, &payload, &message);
  if (status != PX_OK) return status;
  const control::RegisterReply* reply = message->body_as_RegisterReply();
  if (reply->status() != PX_OK)
    return fail(client.get(), static_cast<px_status>(reply->status()),
                reply->message() ? reply->message()->str() : "");
  Var* var = nullptr;
  {
    std::lock_guard<std::mutex> lock(client->mutex);
    for (auto& existing : client->vars)
      if (existing->id == reply->var_id() && !existing->group) var = existing.get();
    if (!var) {
      auto fresh = std::make_unique<Var>(std::move(fields));
      fresh->client = client.get();
      fresh->id = reply->var_id();
      var = fresh.get();
      client->vars.push_back(std::move(fresh));
    }
  }
  if (var->handle == 0) {
    *out_var = add_var_handle(client, var);
  } else {
    *out_var = reinterpret_cast<px_var*>(static_cast<uintptr_t>(var->handle));
  }
  return succeed();
}

namespace {

// px_register_sparse and px_register_sparse_group: one registration, tables (names and rows,
// n_tables of them) only for a group.
px_status register_sparse(px_client* handle, const char* fn, const char* name, px_dtype dtype,
                          uint64_t rows, uint64_t dim, const px_sparse_options* options,
                          uint64_t n_tables, const char* const* table_names,
                          const uint64_t* table_rows, px_var** out_var) {
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle(fn, "client", handle);
  Client* c = ref.client.get();
  if (!name) return fail(c, PX_ERR_INVALID, std::string(fn) + ": name is NULL");
  // Fields the caller's (older, smaller) struct lacks keep their defaults.
  px_sparse_options o;
  px_sparse_options_init(&o);
  if (options) {
    if (options->struct_size < sizeof(uint32_t) || options->struct_size > (1u << 16))
      return fail(c, PX_ERR_INVALID,
                  std::string(fn) + "('" + name +
                      "'): options->struct_size is not set (use px_sparse_options_init)");
    std::memcpy(&o, options, std::min<size_t>(options->struct_size, sizeof o));
  }
  if (!valid_dtype(static_cast<uint32_t>(dtype)))
    return fail(c, PX_ERR_INVALID,
                std::string(fn) + "('" + name + "'): unknown dtype " + std::to_string(dtype));
  flatbuffers::FlatBufferBuilder b;
  auto name_offset = b.CreateString(name);
  auto fb_options = control::CreateSparseOptions(
      b, static_cast<uint32_t>(o.optimizer), o.learning_rate, o.beta1, o.beta2, o.epsilon,
      o.initial_accumulator, static_cast<uint32_t>(o.initializer), o.init_seed, o.init_low,
      o.init_high, o.init_std, static_cast<uint32_t>(o.aggregation),
      static_cast<uint32_t>(o.consistency), o.staleness, o.partitions,
      static_cast<uint32_t>(o.route), static_cast<uint32_t>(o.nonfinite),
      static_cast<uint32_t>(o.alltoall_split), static_cast<uint32_t>(o.wire_dtype), o.prefetch,
      o.cache_rows, o.cache_staleness, o.replicas);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> names_offset;
  flatbuffers::Offset<flatbuffers::Vector<uint64_t>> rows_offset;
  if (n_tables > 0) {
    std::vector<std::string> names(table_names, table_names + n_tables);
    names_offset = b.CreateVectorOfStrings(names);
    rows_offset = b.CreateVector(table_rows, n_tables);
  }
  auto request = control::CreateRegisterSparse(b, name_offset, static_cast<uint32_t>(dtype), rows,
                                               dim, fb_options, names_offset, rows_offset);
  Var var;
  var.name = name;
  var.dtype = static_cast<DType>(dtype);
  var.count = rows;
  var.dim = dim;
  var.sparse = true;
  var.prefetch = o.prefetch == 1;
  return register_var(ref.client, finish_frame(b, control::Body::RegisterSparse, request.Union()),
                      std::move(var), out_var);
}

// The handle of table `table` (rows from offset on) of the registered group.
px_var* table_handle(const std::shared_ptr<Client>& client, Var* group, const std::string& table,
                     uint64_t offset, uint64_t rows) {
  Var* var = nullptr;
  {
    std::lock_guard<std::mutex> lock(client->mutex);
    for (auto& existing : client->vars)
      if (existing->group == group && existing->table == table) var = existing.get();
    if (!var) {  // the group registered twice finds its tables again
      auto fresh = std::make_unique<Var>();
      fresh->client = client.get();
      fresh->id = group->id;
      fresh->name = group->name;
      fresh->dtype = group->dtype;
      fresh->count = rows;
      fresh->dim = group->dim;
      fresh->sparse = true;
      fresh->prefetch = group->prefetch;
      fresh->group = group;
      fresh->row_offset = offset;
      fresh->table = table;
      var = fresh.get();
      client->vars.push_back(std::move(fresh));
    }
  }
  if (var->handle != 0) return reinterpret_cast<px_var*>(static_cast<uintptr_t>(var->handle));
  return add_var_handle(client, var);
}

}  // namespace

}  // namespace px

extern "C" {

PX_API void px_connect_options_init_abi(px_connect_options* options, uint32_t caller_abi) {
  if (!options) return;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->abi_version = caller_abi;
  options->local_rank = -1;
  options->wait_for_daemon = -1;
}

// The symbol callers built before 1.15 call (the header's macro of that name replaces it
// since): they know the statuses of 1.14 only.
PX_API void(px_connect_options_init)(px_connect_options* options) {
  px_connect_options_init_abi(options, px::kAbiBeforeMembership);
}

PX_API px_status px_launch_info_from_env(px_launch_info* out_info) {
  using namespace px;
  if (!out_info || out_info->struct_size < sizeof(px_launch_info))
    return fail(PX_ERR_INVALID,
                "px_launch_info_from_env: out_info is NULL or its struct_size "
                "is not sizeof(px_launch_info)");
  thread_local LaunchEnv launch;  // owns the strings handed out, until the next call
  std::string error;
  if (!read_launch_env(getenv, &launch, &error))
    return fail(PX_ERR_INVALID, "px_launch_info_from_env: " + error);
  out_info->local_rank = launch.local_rank;
  out_info->local_size = launch.local_size;
  out_info->rank = launch.rank;
  out_info->launcher = launch.launcher.c_str();
  out_info->job_name = launch.job.c_str();
  out_info->socket_path = launch.socket_path.c_str();
  return succeed();
}

PX_API px_status px_connect(const px_connect_options* options, px_client** out_client) {
  using namespace px;
  if (!out_client) return fail(PX_ERR_INVALID, "px_connect: out_client is NULL");
  *out_client = nullptr;
  px_connect_options defaults;
  // No options: the caller may have been built against any 1.x header.
  px_connect_options_init_abi(&defaults, px::kAbiBeforeMembership);
  px_connect_options o = defaults;
  if (options) {
    if (options->struct_size < offsetof(px_connect_options, socket_path))
      return fail(PX_ERR_INVALID, "px_connect: options->struct_size is " +
                                      std::to_string(options->struct_size) +
                                      "; fill options with px_connect_options_init");
    // Fields the caller's (older, smaller) struct lacks keep their defaults.
    std::memcpy(&o, options, std::min<size_t>(options->struct_size, sizeof o));
    o.struct_size = sizeof o;
  }
  LaunchEnv launch;
  std::string launch_error;
  if (!read_launch_env(getenv, &launch, &launch_error))
    return fail(PX_ERR_INVALID, "px_connect: " + launch_error);
  std::string socket_path = o.socket_path                 ? o.socket_path
                            : !launch.socket_path.empty() ? launch.socket_path
                                                          : kDefaultSocket;
  std::string job = o.job_name ? o.job_name : !launch.job.empty() ? launch.job : "default";
  int32_t local_rank = o.local_rank >= 0 ? o.local_rank : launch.local_rank;
  int32_t local_size = o.local_size != 0       ? o.local_size
                       : launch.local_size > 0 ? launch.local_size
                                               : 1;
  // PARALLAX_ARENA_BYTES and PARALLAX_WAIT_FOR_DAEMON, for the options left unset: a value
  // that is not a number is refused, not ignored (the caller meant something by it).
  long long env_arena = 0, env_wait = 0;
  bool arena_set = false, wait_set = false;
  std::string env_error;
  if ((o.arena_bytes == 0 &&
       !env_integer("PARALLAX_ARENA_BYTES", PX_ARENA_MIN_BYTES, PX_ARENA_MAX_BYTES, &env_arena,
                    &arena_set, &env_error)) ||
      (o.wait_for_daemon < 0 &&
       !env_integer("PARALLAX_WAIT_FOR_DAEMON", 0, 1, &env_wait, &wait_set, &env_error)))
    return fail(PX_ERR_INVALID, "px_connect: " + env_error);
  uint64_t arena_bytes = o.arena_bytes != 0 ? o.arena_bytes
                         : arena_set        ? static_cast<uint64_t>(env_arena)
                                            : kDefaultArenaBytes;
  int64_t timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : kDefaultTimeoutMs;
  bool wait = o.wait_for_daemon < 0 ? env_wait != 0 : o.wait_for_daemon != 0;
  if (local_size < 1) return fail(PX_ERR_INVALID, "px_connect: local_size must be at least 1");
  if (local_rank >= local_size)
    return fail(PX_ERR_INVALID, "px_connect: local_rank " + std::to_string(local_rank) +
                                    " is not below local_size " + std::to_string(local_size));
  if (arena_bytes < PX_ARENA_MIN_BYTES || arena_bytes > PX_ARENA_MAX_BYTES)
    return fail(PX_ERR_INVALID, "px_connect: arena_bytes " + std::to_string(arena_bytes) +
                                    " is not in [PX_ARENA_MIN_BYTES, PX_ARENA_MAX_BYTES] (" +
                                    std::to_string(PX_ARENA_MIN_BYTES) + ".." +
                                    std::to_string(PX_ARENA_MAX_BYTES) + ")");

  auto client = std::make_shared<Client>();
  client->socket_path = socket_path;
  client->control_timeout_ms = timeout_ms;
  client->job = job;
  int64_t deadline = monotonic_ns() + timeout_ms * 1000000;
  px_status status = connect_socket(socket_path, wait, deadline, &client->socket_fd);
  if (status != PX_OK) return status;

  flatbuffers::FlatBufferBuilder b;
  auto job_offset = b.CreateString(job);
  auto hello = control::CreateHello(b, o.abi_version, job_offset, local_rank < 0 ? -1 : local_rank,
                                    local_size, static_cast<int32_t>(getpid()), arena_bytes);
  std::string frame = finish_frame(b, control::Body::Hello, hello.Union());
  std::string error;
  bool timed_out = false;
  std::string payload;
  std::vector<int> fds;
  if (!send_frame_blocking(client->socket_fd, frame, deadline, &error, &timed_out) ||
      !recv_frame_blocking(client->socket_fd, client->decoder, &payload, &fds, deadline, &error,
                           &timed_out)) {
    for (int fd : fds) ::close(fd);
    if (timed_out)
      return fail(PX_ERR_TIMEOUT, "px_connect: job '" + job + "' did not gather its " +
                                      std::to_string(local_size) + " local workers at " +
                                      socket_path + " within " + std::to_string(timeout_ms) +
                                      " ms");
    return fail(PX_ERR_CONNECT, "px_connect to " + socket_path + ": " + error);
  }
  const control::Message* message = parse_frame(payload, &error);
  const control::HelloReply* reply = message ? message->body_as_HelloReply() : nullptr;
  if (!reply) {
    for (int fd : fds) ::close(fd);
    return fail(PX_ERR_PROTOCOL,
                "px_connect: parallaxd sent an unexpected handshake reply " + error);
  }
  if (reply->status() != PX_OK) {
    for (int fd : fds) ::close(fd);
    std::string text = reply->message() ? reply->message()->str() : "";
    if (reply->status() == PX_ERR_VERSION)
      text += " (library ABI " + abi_string(PX_ABI_VERSION) + ", daemon ABI " +
              abi_string(reply->daemon_abi_version()) + ")";
    return fail(static_cast<px_status>(reply->status()), "px_connect: " + text);
  }
  if (fds.size() != 3) {
    for (int fd : fds) ::close(fd);
    return fail(PX_ERR_PROTOCOL,
                "px_connect: parallaxd sent " + std::to_string(fds.size()) + " fds, expected 3");
  }
  client->submit_bell = Doorbell(fds[1]);
  client->completion_bell = Doorbell(fds[2]);
  if (!SharedArena::attach(fds[0], &client->arena, &error))
    return fail(PX_ERR_PROTOCOL, "px_connect: " + error);
  client->arena.close_fd();
  client->submit_ring = client->arena.submit_ring();
  client->completion_ring = client->arena.completion_ring();
  const ArenaHeader& h = client->arena.header();
  client->allocator = ArenaAllocator(h.heap_offset, h.heap_bytes);
  px_world_info& w = client->world;
  w.struct_size = sizeof w;
  w.node_index = reply->node_index();
  w.node_count = reply->node_count();
  w.rank = reply->rank();
  w.world_size = reply->world_size();
  w.local_rank = reply->local_rank();
  w.local_size = reply->local_size();
  if (reply->gpu_pci_bus_ids())
    for (const auto* id : *reply->gpu_pci_bus_ids()) client->daemon_gpus.push_back(id->str());
  client->daemon_gpu_why = reply->gpu_why_none() ? reply->gpu_why_none()->str() : "";
  if (client->daemon_gpu_why.empty() && client->daemon_gpus.empty())
    client->daemon_gpu_why = "the daemon did not say (ABI 1.7 or older)";
  if (launch.rank >= 0 && launch.rank != w.rank)
    std::fprintf(stderr,
                 "parallax: warning: job '%s': parallaxd made this worker rank %d of %d (node "
                 "%d, local rank %d: ranks go node by node), but %s (%s) says rank %d. "
                 "Parallax's results follow px_world's rank.\n",
                 job.c_str(), w.rank, w.world_size, w.node_index, w.local_rank,
                 launch.rank_variable.c_str(), launch.launcher.c_str(), launch.rank);
  *out_client = add_client_handle(std::move(client));
  return succeed();
}

PX_API px_status px_disconnect(px_client* handle) {
  using namespace px;
  if (!handle) return succeed();
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_disconnect", "client", handle);
  Client* c = ref.client.get();
  // Device memory first, while the connection is up: the daemon lets go of each mapping
  // before it is freed.
  free_all_device_memory(c);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (c->closed) return succeed();
    c->closed = true;
    release_device_operations(c);  // its queued host functions end at once (closed)
  }
  remove_client_handles(*c);  // no later call finds it, its variables or its requests
  // A goodbye tells the daemon this worker left rather than died. Not while another thread
  // is inside a control call: its frame must not be interleaved with ours.
  if (c->control_mutex.try_lock()) {
    flatbuffers::FlatBufferBuilder b;
    auto body = control::CreateGoodbye(b);
    std::string frame = finish_frame(b, control::Body::Goodbye, body.Union());
    std::string error;
    bool timed_out;
    send_frame_blocking(c->socket_fd, frame, monotonic_ns() + 100000000, &error, &timed_out);
    c->control_mutex.unlock();
  }
  // Wakes any thread blocked on this client (a control call, a poll on the doorbell); the
  // fds themselves close when the last call holding the client returns.
  ::shutdown(c->socket_fd, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->changed.notify_all();
  }
  c->completion_bell.ring();
  return succeed();
}

PX_API px_status px_world(px_client* handle, px_world_info* out_info) {
  using namespace px;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_world", "client", handle);
  if (!out_info) return fail(PX_ERR_INVALID, "px_world: out_info is NULL");
  if (out_info->struct_size < sizeof(uint32_t))
    return fail(PX_ERR_INVALID, "px_world: set out_info->struct_size = sizeof(px_world_info)");
  uint32_t n = std::min<uint32_t>(out_info->struct_size, sizeof(px_world_info));
  px_world_info w = ref.client->world;
  w.struct_size = n;
  std::memcpy(out_info, &w, n);
  return succeed();
}

PX_API void px_dense_options_init(px_dense_options* o) {
  if (!o) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->wire_dtype = PX_F32;
}

PX_API px_status px_register_dense(px_client* handle, const char* name, px_dtype dtype,
                                   uint64_t count, px_reduce_op op, px_var** out_var) {
  return px_register_dense_ex(handle, name, dtype, count, op, nullptr, out_var);
}

PX_API px_status px_register_dense_ex(px_client* handle, const char* name, px_dtype dtype,
                                      uint64_t count, px_reduce_op op,
                                      const px_dense_options* options, px_var** out_var) {
  using namespace px;
  if (!out_var) return fail(PX_ERR_INVALID, "px_register_dense: out_var is NULL");
  *out_var = nullptr;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_register_dense", "client", handle);
  Client* c = ref.client.get();
  if (!name) return fail(c, PX_ERR_INVALID, "px_register_dense: name is NULL");
  // Fields the caller's (older, smaller) struct lacks keep their defaults.
  px_dense_options o;
  px_dense_options_init(&o);
  if (options) {
    if (options->struct_size < sizeof(uint32_t) || options->struct_size > (1u << 16))
      return fail(c, PX_ERR_INVALID,
                  std::string("px_register_dense_ex('") + name +
                      "'): options->struct_size is not set (use px_dense_options_init)");
    std::memcpy(&o, options, std::min<size_t>(options->struct_size, sizeof o));
  }
  if (!valid_dtype(static_cast<uint32_t>(dtype)))
    return fail(
        c, PX_ERR_INVALID,
        std::string("px_register_dense('") + name + "'): unknown dtype " + std::to_string(dtype));
  if (!valid_reduce_op(static_cast<uint32_t>(op)))
    return fail(
        c, PX_ERR_INVALID,
        std::string("px_register_dense('") + name + "'): unknown reduce op " + std::to_string(op));
  if (o.wire_dtype != PX_F32 &&
      ((o.wire_dtype != PX_BF16 && o.wire_dtype != PX_F16) || dtype != PX_F32))
    return fail(c, PX_ERR_INVALID,
                std::string("px_register_dense_ex('") + name + "'): wire_dtype " +
                    std::to_string(o.wire_dtype) +
                    " needs an f32 variable and one of PX_F32, PX_BF16, PX_F16");
  flatbuffers::FlatBufferBuilder b;
  auto name_offset = b.CreateString(name);
  auto request =
      control::CreateRegisterDense(b, name_offset, static_cast<uint32_t>(dtype), count,
                                   static_cast<uint32_t>(op), static_cast<uint32_t>(o.wire_dtype));
  Var var;
  var.name = name;
  var.dtype = static_cast<DType>(dtype);
  var.op = static_cast<ReduceOp>(op);
  var.count = count;
  var.bytes = count * dtype_size(var.dtype);
  return register_var(ref.client, finish_frame(b, control::Body::RegisterDense, request.Union()),
                      std::move(var), out_var);
}

// The daemon's enums carry the C ABI's values (parallaxd casts what the client sends).
static_assert(static_cast<int>(px::Optimizer::kAdam) == PX_OPT_ADAM);
static_assert(static_cast<int>(px::Initializer::kNormal) == PX_INIT_NORMAL);
static_assert(static_cast<int>(px::Consistency::kBounded) == PX_BOUNDED);
static_assert(static_cast<int>(px::Route::kAllreduce) == PX_ROUTE_ALLREDUCE);
static_assert(static_cast<int>(px::Route::kAlltoall) == PX_ROUTE_ALLTOALL);
static_assert(static_cast<int>(px::Split::kRows) == PX_SPLIT_ROWS);
static_assert(static_cast<int>(px::Split::kColumns) == PX_SPLIT_COLUMNS);
static_assert(static_cast<int>(px::NonFinite::kSkip) == PX_NONFINITE_SKIP);
static_assert(static_cast<int>(px::WireDtype::kBf16) == PX_BF16 &&
              static_cast<int>(px::WireDtype::kF16) == PX_F16);

PX_API void px_sparse_options_init(px_sparse_options* o) {
  if (!o) return;
  // The defaults live in one place, px::SparseOptions' member initialisers: read from the
  // header alone (its default constructor is implicit), so libparallax links no sharding code.
  const px::SparseOptions d;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->optimizer = static_cast<int32_t>(d.optimizer);
  o->learning_rate = d.learning_rate;
  o->beta1 = d.beta1;
  o->beta2 = d.beta2;
  o->epsilon = d.epsilon;
  o->initial_accumulator = d.initial_accumulator;
  o->initializer = static_cast<int32_t>(d.initializer);
  o->init_seed = d.init_seed;
  o->init_low = d.init_low;
  o->init_high = d.init_high;
  o->init_std = d.init_std;
  o->aggregation = d.mean ? PX_MEAN : PX_SUM;
  o->consistency = static_cast<int32_t>(d.consistency);
  o->staleness = d.staleness;
  o->partitions = d.partitions;
  o->route = static_cast<int32_t>(d.route);
  o->nonfinite = static_cast<int32_t>(d.nonfinite);
  o->alltoall_split = static_cast<int32_t>(d.alltoall_split);
  o->wire_dtype = static_cast<int32_t>(d.wire);
  o->prefetch = d.prefetch ? 1 : 0;
  o->cache_rows = d.cache_rows;
  o->cache_staleness = d.cache_staleness;
  o->replicas = d.replicas;
  o->reserved2 = 0;
}

PX_API px_status px_register_sparse(px_client* handle, const char* name, px_dtype dtype,
                                    uint64_t rows, uint64_t dim, const px_sparse_options* options,
                                    px_var** out_var) {
  if (!out_var) return px::fail(PX_ERR_INVALID, "px_register_sparse: out_var is NULL");
  *out_var = nullptr;
  return px::register_sparse(handle, "px_register_sparse", name, dtype, rows, dim, options, 0,
                             nullptr, nullptr, out_var);
}

PX_API px_status px_register_sparse_group(px_client* handle, const char* name, px_dtype dtype,
                                          uint64_t n_tables, const char* const* table_names,
                                          const uint64_t* table_rows, uint64_t dim,
                                          const px_sparse_options* options, px_var** out_group,
                                          px_var** out_tables) {
  using namespace px;
  const char* fn = "px_register_sparse_group";
  if (out_group) *out_group = nullptr;
  if (out_tables)
    for (uint64_t t = 0; t < n_tables && t < (1u << 20); ++t) out_tables[t] = nullptr;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle(fn, "client", handle);
  Client* c = ref.client.get();
  std::string who = std::string(fn) + "('" + (name ? name : "") + "')";
  if (n_tables == 0 || n_tables > 4096 || !table_names || !table_rows)
    return fail(c, PX_ERR_INVALID, who + ": needs 1 to 4096 tables, their names and rows");
  uint64_t rows = 0;
  for (uint64_t t = 0; t < n_tables; ++t) {
    if (!table_names[t])
      return fail(c, PX_ERR_INVALID, who + ": table " + std::to_string(t) + "'s name is NULL");
    if (table_rows[t] == 0 || table_rows[t] > (1ull << 62) - rows)
      return fail(
          c, PX_ERR_INVALID,
          who + ": table '" + table_names[t] + "' has " + std::to_string(table_rows[t]) + " rows");
    rows += table_rows[t];
  }
  px_var* group_handle = nullptr;
  px_status status = register_sparse(handle, fn, name, dtype, rows, dim, options, n_tables,
                                     table_names, table_rows, &group_handle);
  if (status != PX_OK) return status;
  VarRef group;
  if (!find_var(group_handle, &group)) return stale_handle(fn, "variable", group_handle);
  if (out_tables) {
    uint64_t offset = 0;
    for (uint64_t t = 0; t < n_tables; ++t) {
      out_tables[t] = table_handle(ref.client, group.var, table_names[t], offset, table_rows[t]);
      offset += table_rows[t];
    }
  }
  if (out_group) *out_group = group_handle;
  return succeed();
}

constexpr int64_t kCheckpointReplyGraceMs = 5000;

PX_API px_status px_checkpoint(px_client* handle, const char* path, int64_t timeout_ms) {
  using namespace px;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_checkpoint", "client", handle);
  Client* c = ref.client.get();
  if (!path) return fail(c, PX_ERR_INVALID, "px_checkpoint: path is NULL");
  flatbuffers::FlatBufferBuilder b;
  auto text = b.CreateString(path);
  int64_t deadline_ms = timeout_ms > 0 ? timeout_ms : c->control_timeout_ms;
  auto request = control::CreateCheckpoint(b, text, deadline_ms);
  std::string payload;
  const control::Message* message = nullptr;
  // The daemon answers at its deadline; waiting a little longer keeps its answer from
  // arriving after this call gave up (it would then answer the next control call).
  px_status status = control_call(c, finish_frame(b, control::Body::Checkpoint, request.Union()),
                                  control::Body::CheckpointReply, &payload, &message,
                                  deadline_ms + kCheckpointReplyGraceMs);
  if (status != PX_OK) return status;
  const control::CheckpointReply* reply = message->body_as_CheckpointReply();
  if (reply->status() != PX_OK)
    return fail(c, static_cast<px_status>(reply->status()),
                reply->message() ? reply->message()->str() : "");
  return succeed();
}

PX_API px_status px_abort(px_client* handle, const char* reason) {
  using namespace px;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_abort", "client", handle);
  Client* c = ref.client.get();
  flatbuffers::FlatBufferBuilder b;
  auto text = b.CreateString(reason && *reason ? reason : "no reason given");
  auto request = control::CreateAbort(b, text);
  std::string payload;
  const control::Message* message = nullptr;
  px_status status = control_call(c, finish_frame(b, control::Body::Abort, request.Union()),
                                  control::Body::AbortReply, &payload, &message);
  if (status != PX_OK) return status;
  const control::AbortReply* reply = message->body_as_AbortReply();
  if (reply->status() != PX_OK)
    return fail(c, static_cast<px_status>(reply->status()),
                reply->message() ? reply->message()->str() : "");
  return succeed();
}

PX_API px_status px_var_stats_get(px_var* handle, px_var_stats* out_stats) {
  using namespace px;
  VarRef ref;
  if (!find_var(handle, &ref)) return stale_handle("px_var_stats_get", "variable", handle);
  Client* c = ref.client.get();
  if (!out_stats) return fail(c, PX_ERR_INVALID, "px_var_stats_get: out_stats is NULL");
  if (out_stats->struct_size < sizeof(uint32_t))
    return fail(c, PX_ERR_INVALID,
                "px_var_stats_get: set out_stats->struct_size = sizeof(px_var_stats)");
  flatbuffers::FlatBufferBuilder b;
  auto request = control::CreateStatsRequest(b, ref.var->id);
  std::string payload;
  const control::Message* message = nullptr;
  px_status status = control_call(c, finish_frame(b, control::Body::StatsRequest, request.Union()),
                                  control::Body::StatsReply, &payload, &message);
  if (status != PX_OK) return status;
  const control::StatsReply* reply = message->body_as_StatsReply();
  if (reply->status() != PX_OK)
    return fail(c, static_cast<px_status>(reply->status()),
                reply->message() ? reply->message()->str() : "");
  px_var_stats s{};
  s.struct_size = std::min<uint32_t>(out_stats->struct_size, sizeof s);
  s.ops = reply->ops();
  s.bytes = reply->bytes();
  s.wait_ns = reply->wait_ns();
  s.reduce_ns = reply->reduce_ns();
  s.pull_steps = reply->pull_steps();
  s.push_steps = reply->push_steps();
  s.rows_pulled = reply->rows_pulled();
  s.rows_unique = reply->rows_unique();
  s.rows_applied = reply->rows_applied();
  s.bytes_sent = reply->bytes_sent();
  s.bytes_received = reply->bytes_received();
  s.request_partitions = reply->request_partitions();
  s.search_steps_left = reply->search_steps_left();
  s.restored_steps = reply->restored_steps();
  s.rows_served_ahead = reply->rows_served_ahead();
  s.cache_hits = reply->cache_hits();
  s.cache_misses = reply->cache_misses();
  s.cache_rows = reply->cache_rows();
  s.cache_bytes_saved = reply->cache_bytes_saved();
  s.cache_rows_flushed = reply->cache_rows_flushed();
  std::memcpy(out_stats, &s, s.struct_size);
  return succeed();
}

PX_API px_status px_set_sparse_lr(px_var* handle, double learning_rate) {
  using namespace px;
  VarRef ref;
  if (!find_var(handle, &ref)) return stale_handle("px_set_sparse_lr", "variable", handle);
  Client* c = ref.client.get();
  const std::string what = "px_set_sparse_lr('" + ref.var->name + "')";
  if (!ref.var->sparse) return fail(c, PX_ERR_INVALID, what + ": not a sparse variable");
  if (!std::isfinite(learning_rate) || learning_rate < 0)
    return fail(
        c, PX_ERR_INVALID,
        what + ": learning rate " + std::to_string(learning_rate) + " is not finite and >= 0");
  uint64_t from_step;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    // pushes numbered before keep the older rate; a table's are its group's
    from_step = (ref.var->group ? ref.var->group : ref.var)->next_push_step;
  }
  flatbuffers::FlatBufferBuilder b;
  auto request = control::CreateSetSparseLr(b, ref.var->id, from_step, learning_rate);
  std::string payload;
  const control::Message* message = nullptr;
  px_status status = control_call(c, finish_frame(b, control::Body::SetSparseLr, request.Union()),
                                  control::Body::SetSparseLrReply, &payload, &message);
  if (status != PX_OK) return status;
  const control::SetSparseLrReply* reply = message->body_as_SetSparseLrReply();
  if (reply->status() != PX_OK)
    return fail(c, static_cast<px_status>(reply->status()),
                reply->message() ? reply->message()->str() : "");
  return succeed();
}

PX_API px_status px_alloc(px_client* handle, uint64_t bytes, void** out_ptr) {
  using namespace px;
  if (!out_ptr) return fail(PX_ERR_INVALID, "px_alloc: out_ptr is NULL");
  *out_ptr = nullptr;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_alloc", "client", handle);
  Client* c = ref.client.get();
  std::lock_guard<std::mutex> lock(c->mutex);
  auto offset = c->allocator.allocate(bytes);
  if (!offset)
    return fail(c, PX_ERR_NO_MEMORY,
                "px_alloc(" + std::to_string(bytes) + "): the arena has " +
                    std::to_string(c->allocator.largest_free_block()) +
                    " bytes in its largest free block (" +
                    std::to_string(c->allocator.bytes_in_use()) +
                    " in use); raise px_connect_options.arena_bytes");
  *out_ptr = c->arena.base() + *offset;
  return succeed();
}

PX_API px_status px_free(px_client* handle, void* ptr) {
  using namespace px;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_free", "client", handle);
  if (!ptr) return succeed();
  Client* c = ref.client.get();
  px_status device_status;
  if (free_device_memory(c, ptr, &device_status)) return device_status;
  std::lock_guard<std::mutex> lock(c->mutex);
  uint64_t offset = 0;
  if (!arena_offset(c, ptr, 0, &offset) || !c->allocator.release(offset))
    return fail(c, PX_ERR_INVALID, "px_free: pointer was not returned by px_alloc on this client");
  return succeed();
}

}  // extern "C"
