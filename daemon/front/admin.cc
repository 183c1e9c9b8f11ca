#include "daemon/front/admin.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "daemon/common/log.h"
#include "daemon/common/loop_timer.h"
#include "daemon/common/operation.h"
#include "daemon/front/server.h"
#include "daemon/front/session.h"
#include "daemon/gpu/gpu_backend.h"
#include "daemon/sparse/sparse_router.h"
#include "parallax_c.h"
#include "transport/collectives/scratch_pool.h"

#ifndef PX_VERSION
#define PX_VERSION "unknown"
#endif

namespace px {
namespace {

namespace fb = flatbuffers;
using control::AdminCommand;

// A reply's lists stop growing past this many bytes (frames are at most 64 KiB; one more
// item, strings capped at kMaxText, still fits).
constexpr uint32_t kReplyBudget = 40 * 1024;
constexpr size_t kMaxText = 4096;
constexpr size_t kMaxListedWorkers = 256;  // per job or stall; more are counted, not listed
constexpr int64_t kDefaultCheckpointMs = 60000;

std::string who(const Session& s) {
  return "pxctl (pid " + std::to_string(s.pid()) + ", uid " + std::to_string(s.uid()) + ")";
}

fb::Offset<fb::String> text(fb::FlatBufferBuilder& b, const std::string& s) {
  return b.CreateString(s.size() > kMaxText ? s.substr(0, kMaxText) + "..." : s);
}

// The text of node_label(i) between its parentheses ("10.0.0.3:7070"), or all of it.
std::string address_of(const std::string& label) {
  size_t open = label.find('('), close = label.rfind(')');
  return open != std::string::npos && close > open ? label.substr(open + 1, close - open - 1)
                                                   : label;
}

// The process's resident set (/proc/self/statm's second field, in pages); 0 if unreadable.
static uint64_t resident_bytes() {
  unsigned long long size = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  int read = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return read == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

DaemonState collect_daemon_state(Server& server) {
  const DaemonConfig& c = server.config();
  DaemonState s;
  s.version = PX_VERSION;
  s.abi = std::to_string(PX_ABI_VERSION_MAJOR) + "." + std::to_string(PX_ABI_VERSION_MINOR);
  s.pid = static_cast<int>(getpid());
  s.socket = c.socket_path;
  s.cluster = c.cluster;
  s.node_index = c.node_index;
  s.node_count = c.node_count;  // the configured count (the peers below: every index)
  s.node_label = server.cluster() ? server.node_label() : "node 0";
  s.step_stall_ms = c.step_stall_ms;
  if (FabricEndpoint* fabric = server.fabric())
    s.fabric_priority_overtakes = fabric->priority_overtakes();
  const gpu::LoadedGpu& gpu = server.gpu();
  s.gpu_mode = gpu::gpu_mode_name(gpu.mode());
  s.gpu_devices = gpu.device_count();
  s.gpu = gpu.summary();
  if (gpu.backend()) s.nccl = gpu.backend()->inventory().nccl;
  s.gpu_cross_node = server.can_run_nccl()     ? "nccl"
                     : !c.gpu_nccl             ? "host ring (gpu.cross_node = host-ring)"
                     : gpu.device_count() == 0 ? "host ring (no usable GPU)"
                                               : "host ring (built without NCCL)";
  const Cluster* cluster = server.cluster();
  bool ready = cluster && cluster->ready();
  s.membership = c.membership;
  if (cluster) {
    s.coordinator_node = cluster->coordinator_node();
    s.coordinator_term = cluster->coordinator_term();
  }
  if (c.node_count == 1)
    s.cluster_state = "single";
  else if (!server.cluster_broken().empty())
    s.cluster_state = "broken";
  else
    s.cluster_state = ready ? "ready" : "forming";
  // With membership on etcd an epoch may hold fewer nodes than node_count (the survivors).
  s.nodes_up = !ready ? 1 : cluster->size() - (server.lost_node() >= 0 ? 1 : 0);
  for (int i = 0; i < cluster_indices(c); ++i) {
    PeerState p;
    p.index = i;
    p.address = cluster ? address_of(server.node_label(i)) : "";
    if (i == c.node_index)
      p.state = "self";
    else if (i == server.lost_node())
      p.state = "lost";
    else if (ready && cluster->rank_of(i) < 0)
      p.state = "absent";
    else
      p.state = ready ? "up" : "joining";
    s.peers.push_back(std::move(p));
  }
  for (const auto& [id, session] : server.sessions()) {
    if (session->job() && !session->closed()) ++s.workers;
    if (!session->closed() && session->arena().base()) {  // pxctl's sessions have none
      const ArenaHeader& arena = session->arena().header();
      s.memory.arenas += arena.heap_bytes;
      s.memory.rings += arena.heap_offset;
    }
  }
  s.memory.resident = resident_bytes();
  s.memory.scratch = ScratchBuffer::held_bytes();
  if (FabricEndpoint* fabric = server.fabric())
    s.memory.fabric_buffers = fabric->bounce_buffer_bytes();
  for (const auto& [name, job] : server.jobs()) {
    JobState j;
    j.name = name;
    const JobWorld& world = job->world();
    bool has_world = !cluster || world.node_count > 1;
    if (!job->broken().empty())
      j.state = "broken";
    else
      j.state = job->ready() && has_world ? "running" : "waiting";
    j.broken = job->broken();
    j.local_size = job->local_size();
    j.connected = job->connected();
    j.node_count = world.node_count;
    j.world_size = has_world ? world.world_size : 0;
    j.rank_offset = world.rank_offset;
    for (size_t r = 0; r < job->members().size(); ++r) {
      WorkerState w;
      w.local_rank = static_cast<int>(r);
      w.rank = has_world && job->ready() ? world.rank_offset + w.local_rank : -1;
      const auto& member = job->members()[r];
      w.connected = member != nullptr;
      if (member) w.pid = static_cast<int>(static_cast<const Session&>(*member).pid());
      j.workers.push_back(w);
    }
    for (const auto& var : job->variables()) {
      if (var->id == 0) continue;  // the job's barrier
      ++j.variables;
      VariableState v;
      v.job = name;
      v.name = var->name;
      v.id = var->id;
      v.sparse = var->sparse != nullptr;
      v.shape = var->fingerprint.describe();
      v.ops = var->stats.ops;
      v.bytes = var->stats.bytes;
      v.wait_ns = var->stats.wait_ns;
      v.reduce_ns = var->stats.reduce_ns;
      v.pending_steps = static_cast<uint32_t>(var->pending.size());
      if (var->poison_status != PX_OK) v.failed = var->poison_message;
      v.route = var->stats.route;  // dense: set by device steps only
      v.route_reason = var->route.why;
      if (var->device_staging) s.memory.staging += var->device_staging->bytes();
      if (var->sparse) {
        if (var->sparse->owner) s.memory.shards += var->sparse->owner->store_bytes();
        if (var->sparse->cache) s.memory.caches += var->sparse->cache->bytes();
        v.route = route_label(var->sparse->options);
        SparseCounters sc = sparse_counters(*var->sparse);
        v.pull_steps = sc.pull_steps;
        v.push_steps = sc.push_steps;
        v.rows_pulled = sc.rows_pulled;
        v.rows_unique = sc.rows_unique;
        v.rows_applied = sc.rows_applied;
        v.bytes_sent = sc.bytes_sent;
        v.bytes_received = sc.bytes_received;
        v.cache_hits = sc.cache_hits;
        v.cache_misses = sc.cache_misses;
        v.cache_rows = sc.cache_rows;
        v.cache_bytes_saved = sc.cache_bytes_saved;
        v.cache_rows_flushed = sc.cache_rows_flushed;
        double rows = static_cast<double>(var->fingerprint.count);
        double steps = static_cast<double>(sc.pull_steps);
        if (steps > 0 && rows > 0) {
          v.alpha = static_cast<double>(sc.rows_pulled) / (steps * job->local_size() * rows);
          v.unique_alpha = static_cast<double>(sc.rows_unique) / (steps * rows);
        }
      }
      s.variables.push_back(std::move(v));
    }
    s.jobs.push_back(std::move(j));
  }
  return s;
}

// --- replies ---------------------------------------------------------------------------

struct Reply {
  px_status status = PX_OK;
  std::string message;
  fb::Offset<control::AdminStatus> daemon;
  fb::Offset<fb::Vector<fb::Offset<control::AdminJob>>> jobs;
  fb::Offset<fb::Vector<fb::Offset<control::AdminVariable>>> variables;
  fb::Offset<fb::Vector<fb::Offset<control::AdminPeer>>> peers;
  fb::Offset<fb::Vector<fb::Offset<control::AdminStall>>> stalls;
  uint32_t total = 0;
  uint32_t next_offset = 0;
};

void send(const std::shared_ptr<Session>& session, fb::FlatBufferBuilder& b, const Reply& r) {
  if (session->closed()) return;
  auto message = text(b, r.message);
  auto body = control::CreateAdminReply(b, r.status, message, r.daemon, r.jobs, r.variables,
                                        r.peers, r.stalls, r.total, r.next_offset);
  session->send_admin_frame(finish_frame(b, control::Body::AdminReply, body.Union()));
}

void send_status(const std::shared_ptr<Session>& session, px_status status,
                 const std::string& message) {
  fb::FlatBufferBuilder b;
  Reply r;
  r.status = status;
  r.message = message;
  send(session, b, r);
}

// Items all[offset..] into a vector, stopping once the reply passes kReplyBudget.
template <class Item, class T, class Make>
fb::Offset<fb::Vector<fb::Offset<Item>>> page(fb::FlatBufferBuilder& b, const std::vector<T>& all,
                                              uint32_t offset, Reply* r, Make make) {
  std::vector<fb::Offset<Item>> items;
  r->total = static_cast<uint32_t>(all.size());
  for (size_t i = offset; i < all.size(); ++i) {
    if (!items.empty() && b.GetSize() > kReplyBudget) {
      r->next_offset = static_cast<uint32_t>(i);
      break;
    }
    items.push_back(make(all[i]));
  }
  return b.CreateVector(items);
}

fb::Offset<control::AdminWorker> worker(fb::FlatBufferBuilder& b, int local_rank, int rank, int pid,
                                        bool connected) {
  return control::CreateAdminWorker(b, local_rank, rank, pid, connected);
}

fb::Offset<control::AdminStatus> status_table(fb::FlatBufferBuilder& b, const DaemonState& s) {
  auto version = text(b, s.version), abi = text(b, s.abi), socket = text(b, s.socket),
       cluster = text(b, s.cluster), state = text(b, s.cluster_state),
       label = text(b, s.node_label), url = text(b, s.metrics_url),
       timeline = text(b, s.timeline_path), gpu_mode = text(b, s.gpu_mode), gpu = text(b, s.gpu),
       nccl = text(b, s.nccl), cross_node = text(b, s.gpu_cross_node),
       membership = text(b, s.membership);
  uint32_t variables = static_cast<uint32_t>(s.variables.size());
  return control::CreateAdminStatus(
      b, version, abi, s.pid, s.uptime_ms, socket, cluster, state, s.node_index, s.node_count,
      label, s.nodes_up, s.workers, static_cast<uint32_t>(s.jobs.size()), variables,
      static_cast<uint32_t>(s.stalls.size()), url, timeline, s.timeline_events, s.timeline_dropped,
      s.step_stall_ms, s.stall_report_ms, gpu_mode, s.gpu_devices, gpu, nccl, cross_node,
      s.memory.resident, s.memory.shards, s.memory.arenas, s.memory.fabric_buffers, s.memory.rings,
      s.memory.scratch, s.memory.staging, s.memory.caches, membership, s.coordinator_node,
      s.coordinator_term);
}

fb::Offset<control::AdminJob> job_table(fb::FlatBufferBuilder& b, const JobState& j) {
  std::vector<fb::Offset<control::AdminWorker>> workers;
  for (const WorkerState& w : j.workers) {
    if (workers.size() == kMaxListedWorkers) break;
    workers.push_back(worker(b, w.local_rank, w.rank, w.pid, w.connected));
  }
  auto name = text(b, j.name), state = text(b, j.state), broken = text(b, j.broken);
  auto list = b.CreateVector(workers);
  return control::CreateAdminJob(b, name, state, broken, j.local_size, j.connected, j.node_count,
                                 j.world_size, j.rank_offset, j.variables, list);
}

fb::Offset<control::AdminVariable> variable_table(fb::FlatBufferBuilder& b,
                                                  const VariableState& v) {
  auto job = text(b, v.job), name = text(b, v.name), kind = text(b, v.sparse ? "sparse" : "dense"),
       shape = text(b, v.shape), route = text(b, v.route), failed = text(b, v.failed),
       reason = text(b, v.route_reason);
  return control::CreateAdminVariable(
      b, job, name, v.id, kind, shape, route, v.ops, v.bytes, v.wait_ns, v.reduce_ns, v.pull_steps,
      v.push_steps, v.rows_pulled, v.rows_unique, v.rows_applied, v.bytes_sent, v.bytes_received,
      v.alpha, v.unique_alpha, v.pending_steps, failed, reason, v.cache_hits, v.cache_misses,
      v.cache_rows, v.cache_bytes_saved, v.cache_rows_flushed);
}

fb::Offset<control::AdminStall> stall_table(fb::FlatBufferBuilder& b, const Stall& s) {
  std::vector<fb::Offset<control::AdminWorker>> missing;
  for (const StalledWorker& w : s.missing) {
    if (missing.size() == kMaxListedWorkers) break;
    missing.push_back(worker(b, w.local_rank, w.rank, w.pid, w.connected));
  }
  std::vector<int32_t> arrived(
      s.arrived.begin(), s.arrived.begin() + static_cast<std::ptrdiff_t>(
                                                 std::min(s.arrived.size(), kMaxListedWorkers)));
  auto job = text(b, s.job), variable = text(b, s.variable), operation = text(b, s.operation),
       label = text(b, s.node_label), kind = text(b, s.kind), description = text(b, s.description);
  auto missing_list = b.CreateVector(missing);
  auto arrived_list = b.CreateVector(arrived);
  return control::CreateAdminStall(b, job, variable, operation, s.step, s.node, label, s.waited_ms,
                                   kind, missing_list, arrived_list, description);
}

template <class T>
std::vector<T> only_job(std::vector<T> all, const std::string& job) {
  if (job.empty()) return all;
  std::vector<T> out;
  for (T& item : all)
    if (item.job == job) out.push_back(std::move(item));
  return out;
}

// --- commands that change the daemon ----------------------------------------------------

bool privileged(const Session& session) {
  return session.uid() == geteuid() || session.uid() == 0;
}

// A path pxctl resolved: absolute, bounded, no NUL.
bool valid_path(const std::string& path, std::string* why) {
  if (path.empty() || path[0] != '/' || path.size() > 4000 ||
      path.find('\0') != std::string::npos) {
    *why = "the path must be absolute, 1 to 4000 bytes: '" + path.substr(0, 200) + "'";
    return false;
  }
  return true;
}

void checkpoint_all(Server& server, const std::shared_ptr<Session>& session, const std::string& dir,
                    int64_t timeout_ms) {
  if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST)
    return send_status(session, PX_ERR_INVALID,
                       "cannot create the checkpoint directory " + dir + ": " + strerror(errno));
  struct Pending {
    int left = 1;  // released after the loop
    px_status status = PX_OK;
    std::string message;
    std::string done_text;
    bool replied = false;
    std::shared_ptr<LoopTimer> deadline;
  };
  auto pending = std::make_shared<Pending>();
  auto reply = [session, pending](px_status status, const std::string& message) {
    if (pending->replied) return;
    pending->replied = true;
    if (pending->deadline) pending->deadline->cancel();
    send_status(session, status, message);
  };
  auto finish_one = [pending, reply](px_status status, const std::string& message) {
    if (status != PX_OK && pending->status == PX_OK) {
      pending->status = status;
      pending->message = message;
    }
    if (--pending->left == 0)
      reply(pending->status, pending->status == PX_OK ? pending->done_text : pending->message);
  };
  int variables = 0, jobs = 0;
  std::string listed, skipped;
  for (const auto& [name, job] : server.jobs()) {
    if (!job->ready()) continue;
    if (!job->broken().empty()) {
      skipped += "; job '" + name + "' skipped: " + job->broken();
      continue;
    }
    bool any = false;
    for (auto& var : job->variables()) {
      if (!var->sparse) continue;
      if (var->poison_status != PX_OK) {
        skipped +=
            "; variable '" + var->name + "' of job '" + name + "' skipped: " + var->poison_message;
        continue;
      }
      // The push steps every local worker has issued: what the checkpoint waits for.
      uint64_t pushes = std::numeric_limits<uint64_t>::max();
      for (int r = 0; r < job->local_size(); ++r)
        if (var->registered[static_cast<size_t>(r)])
          pushes = std::min(pushes, var->next_step(r, static_cast<uint16_t>(Opcode::kPushRows)));
      if (pushes == std::numeric_limits<uint64_t>::max()) continue;
      any = true;
      ++variables;
      ++pending->left;
      if (variables <= 20)
        listed += std::string(listed.empty() ? "" : ", ") + "'" + name + "'/'" + var->name +
                  "' after " + std::to_string(pushes) + " push steps";
      server.scheduler().sparse().checkpoint(job, *var, pushes, dir, finish_one);
    }
    jobs += any;
  }
  if (variables > 20) listed += " and " + std::to_string(variables - 20) + " more";
  pending->done_text =
      variables == 0 ? "no sparse variables on this node: nothing to checkpoint" + skipped
                     : "checkpointed " + std::to_string(variables) + " sparse variables of " +
                           std::to_string(jobs) + " jobs into " + dir + ": " + listed + skipped;
  PX_LOG_INFO("%s: checkpoint of %d sparse variables of %d jobs into %s", who(*session).c_str(),
              variables, jobs, dir.c_str());
  if (pending->left > 1) {
    int64_t ms = timeout_ms > 0 ? timeout_ms : kDefaultCheckpointMs;
    std::string why = "checkpoint into " + dir + " did not complete within " + std::to_string(ms) +
                      " ms (each variable waits until every node has applied the push steps "
                      "this node's workers issued); the shard writes asked for go on";
    pending->deadline = LoopTimer::start(server.loop(), static_cast<uint64_t>(ms),
                                         [reply, why] { reply(PX_ERR_TIMEOUT, why); });
  }
  finish_one(PX_OK, "");
}

}  // namespace

ObserverOptions observer_options(const DaemonConfig& config) {
  ObserverOptions o;
  o.metrics_listen = config.metrics_listen;
  o.metrics_max_variables = config.metrics_max_variables;
  o.stall_report_ms = config.stall_report_ms;
  return o;
}

ObserverHooks observer_hooks(Server& server) {
  ObserverHooks h;
  h.post = [&server](std::function<void()> fn) { server.post(std::move(fn)); };
  h.collect = [&server] { return collect_daemon_state(server); };
  h.jobs = [&server] {
    std::vector<std::shared_ptr<Job>> jobs;
    for (const auto& [name, job] : server.jobs()) jobs.push_back(job);
    return jobs;
  };
  h.stall_context = [&server] {
    StallContext c;
    c.node = server.config().node_index;
    c.node_label = server.cluster() ? server.node_label() : "node 0";
    // Job members are sessions (Server::join_job puts only sessions there).
    c.pid_of = [](const Completer& worker) {
      return static_cast<int>(static_cast<const Session&>(worker).pid());
    };
    return c;
  };
  return h;
}

void handle_admin_request(Server& server, const std::shared_ptr<Session>& session,
                          const control::AdminRequest& request) {
  Observer& observer = server.observer();
  AdminCommand command = request.command();
  std::string path = request.path() ? request.path()->str() : "";
  std::string job = request.job() ? request.job()->str() : "";
  bool changes = command == AdminCommand::TimelineStart || command == AdminCommand::TimelineStop ||
                 command == AdminCommand::CheckpointAll || command == AdminCommand::Drain;
  if (changes && !privileged(*session))
    return send_status(session, PX_ERR_PERMISSION,
                       std::string("pxctl ") + control::EnumNameAdminCommand(command) +
                           " needs parallaxd's own user (uid " + std::to_string(geteuid()) +
                           ") or root; uid " + std::to_string(session->uid()) +
                           " may only read (status, jobs, vars, peers, stalls)");
  std::string why;
  fb::FlatBufferBuilder b;
  Reply r;
  switch (command) {
    case AdminCommand::Status: {
      DaemonState s = observer.state();
      r.daemon = status_table(b, s);
      return send(session, b, r);
    }
    case AdminCommand::Jobs: {
      DaemonState s = observer.state();
      r.jobs = page<control::AdminJob>(b, s.jobs, request.offset(), &r,
                                       [&](const JobState& j) { return job_table(b, j); });
      return send(session, b, r);
    }
    case AdminCommand::Vars: {
      std::vector<VariableState> vars = only_job(observer.state().variables, job);
      r.variables = page<control::AdminVariable>(
          b, vars, request.offset(), &r,
          [&](const VariableState& v) { return variable_table(b, v); });
      return send(session, b, r);
    }
    case AdminCommand::Peers: {
      DaemonState s = observer.state();
      r.daemon = status_table(b, s);
      std::vector<fb::Offset<control::AdminPeer>> peers;
      for (const PeerState& p : s.peers)
        peers.push_back(control::CreateAdminPeer(b, p.index, text(b, p.address), text(b, p.state)));
      r.peers = b.CreateVector(peers);
      r.total = static_cast<uint32_t>(peers.size());
      return send(session, b, r);
    }
    case AdminCommand::Stalls: {
      std::vector<Stall> stalls = only_job(observer.stalls(request.min_wait_ms()), job);
      r.stalls = page<control::AdminStall>(b, stalls, request.offset(), &r,
                                           [&](const Stall& s) { return stall_table(b, s); });
      return send(session, b, r);
    }
    case AdminCommand::TimelineStart:
      if (!valid_path(path, &why)) return send_status(session, PX_ERR_INVALID, why);
      PX_LOG_INFO("%s: timeline on %s", who(*session).c_str(), path.c_str());
      return observer.timeline().start(path,
                                       [session](px_status status, const std::string& message) {
                                         send_status(session, status, message);
                                       });
    case AdminCommand::TimelineStop:
      PX_LOG_INFO("%s: timeline off", who(*session).c_str());
      return observer.timeline().stop([session](px_status status, const std::string& message) {
        send_status(session, status, message);
      });
    case AdminCommand::CheckpointAll:
      if (!valid_path(path, &why)) return send_status(session, PX_ERR_INVALID, why);
      return checkpoint_all(server, session, path, request.timeout_ms());
    case AdminCommand::Drain:
      // SIGTERM is the daemon's drain (and what systemd sends): one path for both.
      PX_LOG_INFO("%s: drain requested; parallaxd sends itself SIGTERM", who(*session).c_str());
      send_status(session, PX_OK,
                  "parallaxd (pid " + std::to_string(getpid()) + ") drains: SIGTERM sent to it");
      ::kill(getpid(), SIGTERM);
      return;
  }
  send_status(session, PX_ERR_NOT_IMPLEMENTED,
              "unknown admin command " + std::to_string(static_cast<uint32_t>(command)) +
                  " (pxctl newer than parallaxd?)");
}

}  // namespace px
