#include "daemon/front/server.h"

#include <grp.h>
#include <malloc.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <thread>

#include "daemon/common/log.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/loop_timer.h"
#include "daemon/front/admin.h"
#include "daemon/front/session.h"
#include "daemon/sparse/sparse_router.h"
#include "transport/collectives/scratch_pool.h"

namespace px {
namespace {

unsigned default_threads() {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return std::min(4u, cores);
}

}  // namespace

Server::Server(DaemonConfig config, std::unique_ptr<EtcdMembership> membership)
    : config_(std::move(config)),
      pool_(config_.threads ? config_.threads : default_threads()),
      scheduler_(pool_, [this](std::function<void()> fn) { post(std::move(fn)); }) {
  membership_ = std::move(membership);
  uv_loop_init(&loop_);
  uv_async_init(&loop_, &async_, on_async);
  async_.data = this;
  scheduler_.sparse().set_restore_dir(config_.restore_dir);
  scheduler_.sparse().set_handover(!config_.membership.empty());
  scheduler_.sparse().set_route_choice(config_.route_estimate_steps, config_.route_auto_sequence);
  observer_ = std::make_unique<Observer>(&loop_, observer_options(config_), observer_hooks(*this));
}

Server::~Server() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  {
    std::lock_guard<std::mutex> lock(posted_mutex_);
    loop_closed_ = true;
  }
  uv_loop_close(&loop_);
}

bool Server::listen(std::string* error) {
  // First: a node that must have a GPU refuses to start before it accepts workers.
  if (!gpu::load_gpu_backend(config_.gpu_mode, config_.gpu_backend, &gpu_, error)) return false;
  PX_LOG_INFO("gpu: %s", gpu_.summary().c_str());
  if (gpu_.device_count() > 0) scheduler_.set_gpu(gpu_.backend());
  const std::string& path = config_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    *error = "socket path '" + path + "' is empty or longer than " +
             std::to_string(sizeof addr.sun_path - 1);
    return false;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (!config_.group.empty()) {
    group* g = getgrnam(config_.group.c_str());
    if (!g) {
      *error = "group '" + config_.group + "' does not exist";
      return false;
    }
    allowed_gid_ = g->gr_gid;
  }
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + strerror(errno);
    return false;
  }
  // A leftover socket file from a dead daemon is replaced; a live daemon is not.
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    ::close(probe);
    ::close(fd);
    *error = "another parallaxd is already listening on " + path;
    return false;
  }
  if (probe >= 0) ::close(probe);
  // The socket is bound under a private name and renamed into place once it listens, with its
  // mode and group set: whoever sees the file (a worker, a test, a service manager waiting for
  // it) can connect at once. Bound straight at the path, there is a window between bind() and
  // listen() where the file exists and connect() is refused. A path too long for the private
  // name is bound in place.
  std::string bound_path = path + ".starting-" + std::to_string(getpid());
  if (bound_path.size() >= sizeof addr.sun_path) bound_path = path;
  sockaddr_un bound_addr = addr;
  std::memcpy(bound_addr.sun_path, bound_path.c_str(), bound_path.size() + 1);
  // A dead daemon's file at the path goes here when bound in place, else with the rename().
  ::unlink(bound_path.c_str());
  mode_t old_mask = umask(0117);  // socket file 0660
  int bound = bind(fd, reinterpret_cast<sockaddr*>(&bound_addr), sizeof bound_addr);
  umask(old_mask);
  if (bound != 0 || ::listen(fd, 128) != 0) {
    *error = "cannot listen on " + path + ": " + strerror(errno);
    ::close(fd);
    if (bound == 0) ::unlink(bound_path.c_str());
    return false;
  }
  chmod(bound_path.c_str(), 0660);
  if (allowed_gid_ != static_cast<gid_t>(-1) &&
      chown(bound_path.c_str(), static_cast<uid_t>(-1), allowed_gid_) != 0)
    PX_LOG_WARN("cannot give %s to group %s: %s", path.c_str(), config_.group.c_str(),
                strerror(errno));
  if (bound_path != path && ::rename(bound_path.c_str(), path.c_str()) != 0) {
    *error = "cannot move the socket into place at " + path + ": " + strerror(errno);
    ::close(fd);
    ::unlink(bound_path.c_str());
    return false;
  }
  listen_fd_ = fd;
  uv_poll_init(&loop_, &listen_poll_, listen_fd_);
  listen_poll_.data = this;
  uv_poll_start(&listen_poll_, UV_READABLE, on_listen_event);
  if (!observer_->listen_metrics(error)) return false;
  return config_.node_count > 1 ? start_cluster(error) : true;
}

bool Server::start_cluster(std::string* error) {
  FabricOptions options;
  options.provider = config_.fabric_provider;
  options.address = config_.fabric_address;
  if (config_.fabric_port != 0) options.service = std::to_string(config_.fabric_port);
  options.max_posted = 1 << 16;
  options.eager_bytes = config_.chunk_bytes;
  fabric_ = FabricEndpoint::open(options, error);
  if (!fabric_) return false;
  Cluster::Events events;
  events.ready = [this] {
    scheduler_.set_cluster_transport(fabric_.get(), config_.chunk_bytes);
    scheduler_.set_abort_job([this](Job& job, const std::string& why) { abort_job(job, why); });
    for (auto& name : jobs_waiting_for_cluster_) {
      auto it = jobs_.find(name);
      if (it != jobs_.end())
        cluster_->join_job(name, static_cast<uint32_t>(it->second->local_size()), can_run_nccl());
    }
    jobs_waiting_for_cluster_.clear();
  };
  events.fatal = [this](const std::string& why) { on_fatal(why); };
  events.job_world = [this](const std::string& name, const std::vector<uint32_t>& sizes,
                            uint32_t barrier_id, bool device_routes) {
    auto it = jobs_.find(name);
    if (it == jobs_.end() || !it->second->ready()) return;
    // The data plane numbers the epoch's nodes 0..size-1 (all nodes, or the survivors of a
    // lost one with membership on etcd); sizes come in that order.
    JobWorld world;
    world.node_index = cluster_->rank();
    world.node_count = cluster_->size();
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (static_cast<int>(i) < world.node_index) world.rank_offset += static_cast<int>(sizes[i]);
      world.world_size += static_cast<int>(sizes[i]);
      world.node_sizes.push_back(static_cast<int>(sizes[i]));
    }
    world.device_routes = device_routes;
    it->second->set_world(world);
    it->second->set_barrier_id(barrier_id);
    it->second->set_epoch(cluster_->epoch());
    activate(it->second);
  };
  events.reformed = [this](uint64_t epoch) {
    // Every job of the earlier epoch failed when the node was lost and stays failed (its
    // workers reconnect and start a new run); from now on jobs form and run again.
    PX_LOG_INFO("cluster re-formed (epoch %llu) after: %s", static_cast<unsigned long long>(epoch),
                cluster_broken_.c_str());
    cluster_broken_.clear();
    lost_node_ = -1;
  };
  events.var_ready = [this](const std::string& job, const std::string& name, uint32_t id) {
    auto it = jobs_.find(job);
    Variable* var = it == jobs_.end() ? nullptr : it->second->find(name);
    if (!var) return;
    var->global_id = id;
    if (var->sparse) scheduler_.sparse().start_variable(*var, id);
    auto waiting = std::move(var->awaiting_global_id);
    for (auto& resume : waiting) resume();
  };
  events.var_mismatch = [this](const std::string& job, const std::string& name,
                               const std::string& why) {
    auto it = jobs_.find(job);
    Variable* var = it == jobs_.end() ? nullptr : it->second->find(name);
    PX_LOG_ERROR_AT(job_fields(job, name), "%s", why.c_str());
    if (!var || var->poison_status != PX_OK) return;
    var->poison_status = PX_ERR_MISMATCH;
    var->poison_message = why;
    scheduler_.fail_variable(*var, PX_ERR_MISMATCH, why);
    auto waiting = std::move(var->awaiting_global_id);
    for (auto& resume : waiting) resume();  // they see the poison and fail
  };
  events.node_lost = [this](int node, const std::string& why) {
    if (cluster_broken_.empty()) lost_node_ = node;
    on_node_lost(why);
  };
  events.nodes_joined = [this](const std::string& why) { on_node_lost(why, PX_ERR_MEMBERSHIP); };
  events.job_broken = [this](const std::string& name, uint32_t barrier_id, int node,
                             const std::string& why, bool clean) {
    auto it = jobs_.find(name);
    if (it == jobs_.end() || it->second->barrier_id() != barrier_id) return;  // gone, or a rerun
    Job& job = *it->second;
    if (!job.broken().empty()) return;
    if (clean) {
      PX_LOG_INFO_AT(job_fields(name), "job '%s': %s; its collectives fail from now on",
                     name.c_str(), why.c_str());
    } else {
      LogFields fields = job_fields(name);
      fields.peer = node;
      PX_LOG_ERROR_AT(fields, "job '%s' broke on %s: %s", name.c_str(), node_label(node).c_str(),
                      why.c_str());
    }
    if (clean) return worker_left(job, why, false);
    break_job(job, why, Break::kFailure);
  };
  events.job_end = [this](const std::string& name, uint32_t barrier_id) {
    auto it = ended_here_.find(barrier_id);
    if (it == ended_here_.end()) return;
    PX_LOG_INFO_AT(job_fields(name), "job '%s' ended on every node: its state here is freed",
                   name.c_str());
    // Its posted receives (a sparse table's, for other nodes' requests) hold its tables.
    stop_job_traffic(*it->second, "job '" + name + "' ended on every node");
    free_job_state(*it->second);
    ended_here_.erase(it);
    release_idle_memory();
  };
  wire_device_routes(events);
  cluster_ = std::make_unique<Cluster>(&loop_, cluster_config(config_), *fabric_, std::move(events),
                                       std::move(membership_));
  return cluster_->start(error);
}

std::string Server::node_label() const {
  return cluster_ ? cluster_->node_label(config_.node_index) : "";
}

std::string Server::node_label(int node) const {
  return cluster_ ? cluster_->node_label(node) : "node " + std::to_string(node);
}

std::string Server::rank_label(int rank) const {
  return node_label(cluster_ ? cluster_->node_of_rank(rank) : rank);
}

void Server::variable_added(Job& job, Variable& var) {
  if (cluster_) cluster_->register_var(job.name(), var.name, var.fingerprint);
}

void Server::variable_conflict(Job& job, Variable& var, const Fingerprint& other) {
  if (cluster_) cluster_->register_var(job.name(), var.name, other);
}

void Server::on_node_lost(const std::string& why, px_status status) {
  if (!cluster_broken_.empty()) return;
  cluster_broken_ = why;
  if (status == PX_ERR_MEMBERSHIP)
    PX_LOG_WARN("%s; every job on this node ends; its workers connect again as a new run",
                why.c_str());
  else
    PX_LOG_ERROR_AT(peer_fields(lost_node_),
                    "%s; every job on this node fails; new jobs wait until the node is back and "
                    "the cluster re-forms",
                    why.c_str());
  // Marked before the fabric fails their transfers, so that every step they fail is told
  // with the job's status (sessions map it), whichever path fails it first.
  std::vector<std::shared_ptr<Job>> breaking;
  for (auto& [name, job] : jobs_)
    if (job->broken().empty()) {
      job->mark_broken(why, status);
      breaking.push_back(job);
    }
  if (fabric_) fabric_->fail_all(why);
  // No JobEnd will come; fail_all cancelled their receives.
  for (auto& [id, job] : ended_here_) free_job_state(*job);
  ended_here_.clear();
  for (auto& job : breaking) break_job(*job, why, Break::kNodeLost, status);
}

void Server::break_job(Job& job, const std::string& why, Break how, px_status status) {
  job.mark_broken(why, status);
  // Its sparse tables' partitions as they stand, for the job's next run
  // (table_handover.cc): after a node's loss or join, or a worker's (often a lost node's
  // first news: its daemon reports its worker's death before it dies itself).
  if (job.barrier_id() != 0)
    for (auto& var : job.variables())
      if (var->sparse)
        scheduler_.sparse().keep_for_next_run(var->sparse, job.epoch(), job.barrier_id());
  scheduler_.fail_job(job, status, why);
  if (how == Break::kFailure) stop_job_traffic(job, why);
  // Steps waiting for the nodes to agree on a variable see the broken job and fail.
  for (auto& var : job.variables()) {
    auto waiting = std::move(var->awaiting_global_id);
    for (auto& resume : waiting) resume();
  }
  // Workers still waiting for the job's world: it will not come (the cluster re-forms and
  // a new run of the job is agreed on afresh), so they hear now, as an elastic worker's
  // reconnect must. After the current callback: a refused session leaves the job, which
  // may end it while the caller walks the jobs.
  std::vector<std::shared_ptr<Session>> waiting;
  for (auto& member : job.members())  // join_job puts only sessions there
    if (member) waiting.push_back(std::static_pointer_cast<Session>(member));
  if (!waiting.empty())
    post([waiting, why, status] {
      for (auto& session : waiting) session->fail_waiting(status, why);
    });
}

void Server::worker_left(Job& job, const std::string& why, bool here) {
  // What needs the departed worker fails now and from now on (admission refuses it): every
  // dense step and barrier, which need every worker of every node, and, on its own node,
  // every step (local workers submit each step together). What does not need it goes on:
  // sparse reads, loads and, on other nodes, sparse steps, served by every node's shards
  // until the job ends everywhere.
  job.mark_departed(why, here);
  for (auto& var : job.variables())
    if (here || !var->fingerprint.sparse) scheduler_.fail_pending(*var, PX_ERR_PEER_LOST, why);
  if (!fabric_ || job.barrier_id() == 0) return;
  // Collectives under way that the departed worker took part in finish within moments
  // (their last messages are already on the wire); one still running after the grace waits
  // for a step some node never started: it fails then, not at its worker's deadline.
  uint32_t run = job.barrier_id();
  LoopTimer::start(&loop_, kWorkerLeftGraceMs, [this, run, why] {
    std::shared_ptr<Job> left = find_run(run);
    if (!left || !fabric_) return;  // ended everywhere already
    std::vector<uint32_t> ids{left->barrier_id()};
    for (auto& var : left->variables())
      if (!var->fingerprint.sparse && var->global_id != 0) ids.push_back(var->global_id);
    fabric_->fail_variables(ids, why);
    // Device steps waiting for a route or an NCCL turn, and the job's communicators.
    end_device_routes(*left, PX_ERR_PEER_LOST, why);
  });
}

void Server::on_fatal(const std::string& why) {
  if (stopping_ || exit_code_ != 0) return;  // already on the way out
  PX_LOG_ERROR("cluster '%s': %s", config_.cluster.c_str(), why.c_str());
  exit_code_ = 1;
  // Give queued messages (the rejection we may be sending) a moment to leave.
  uv_timer_init(&loop_, &exit_timer_);
  exit_timer_.data = this;
  uv_timer_start(
      &exit_timer_,
      [](uv_timer_t* t) {
        uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
        static_cast<Server*>(t->data)->shutdown();
      },
      200, 0);
}

sigset_t Server::handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

int Server::run() {
  // This thread runs the loop from here on: loop-only functions check that they run on it.
  LoopThreadScope loop_thread;
  observer_->start();
  uv_signal_init(&loop_, &sigint_);
  uv_signal_init(&loop_, &sigterm_);
  sigint_.data = sigterm_.data = this;
  uv_signal_start(&sigint_, on_signal, SIGINT);
  uv_signal_start(&sigterm_, on_signal, SIGTERM);
  signal(SIGPIPE, SIG_IGN);
  uv_timer_init(&loop_, &stall_timer_);
  stall_timer_.data = this;
  if (config_.step_stall_ms > 0) {
    // A quarter of the deadline between checks (10 ms to 1 s): a stalled step fails at most
    // 25% (or 1 s) after its deadline; the check walks only pending steps.
    uint64_t every =
        static_cast<uint64_t>(std::clamp<int64_t>(config_.step_stall_ms / 4, 10, 1000));
    uv_timer_start(&stall_timer_, on_stall_check, every, every);
  }
  PX_LOG_INFO("listening on %s (%u reduction threads)", config_.socket_path.c_str(), pool_.size());
  service_.start();  // SIGHUP's handler
  // main() blocked the handled signals until the daemon's handlers replaced any a provider's
  // library installed (main.cc); one sent during the start arrives now.
  sigset_t handled = handled_signals();
  pthread_sigmask(SIG_UNBLOCK, &handled, nullptr);
  periodic_checkpoints_.start();
  uv_run(&loop_, UV_RUN_DEFAULT);
  if (fabric_) fabric_->stop();
  // What is left is freed with the server; unfinished work would keep tables alive.
  exiting_ = true;  // the loop is gone: nothing more may be posted to it
  for (auto& [name, job] : jobs_) free_job_state(*job);
  for (auto& [id, job] : ended_here_) free_job_state(*job);
  return exit_code_;
}

void Server::on_signal(uv_signal_t* handle, int signum) {
  auto* self = static_cast<Server*>(handle->data);
  if (signum == SIGTERM) return self->service_.on_sigterm();  // drains (service.h)
  PX_LOG_INFO("signal %d: shutting down", signum);
  self->shutdown();
}

void Server::shutdown() {
  if (stopping_) return;
  stopping_ = true;
  observer_->stop();
  auto sessions = sessions_;
  for (auto& [id, session] : sessions) session->close("disconnected: parallaxd is shutting down");
  uv_poll_stop(&listen_poll_);
  uv_close(reinterpret_cast<uv_handle_t*>(&listen_poll_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&sigint_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&sigterm_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&stall_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
  service_.stop();
  periodic_checkpoints_.stop();
  if (cluster_) cluster_->stop();
  ::unlink(config_.socket_path.c_str());
}

void Server::post(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(posted_mutex_);
  posted_.push_back(std::move(fn));
  // Not once the loop is closed: pool work, or a GPU release, finishing as the daemon exits
  // (libuv aborts on a send to a closed loop). Under the lock, so ~Server cannot close it
  // between the check and the send.
  if (!loop_closed_) uv_async_send(&async_);
}

void Server::on_async(uv_async_t* handle) {
  auto* self = static_cast<Server*>(handle->data);
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(self->posted_mutex_);
    work.swap(self->posted_);
  }
  for (auto& fn : work) fn();
}

void Server::on_listen_event(uv_poll_t* handle, int status, int) {
  auto* self = static_cast<Server*>(handle->data);
  if (status < 0) {
    PX_LOG_ERROR("listening socket: %s", uv_strerror(status));
    return;
  }
  self->accept_connections();
}

bool Server::peer_allowed(int fd, pid_t* pid, uid_t* uid, std::string* why) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    *why = std::string("SO_PEERCRED: ") + strerror(errno);
    return false;
  }
  *pid = cred.pid;
  *uid = cred.uid;
  if (cred.uid == geteuid() || cred.uid == 0) return true;
  if (allowed_gid_ != static_cast<gid_t>(-1)) {
    if (cred.gid == allowed_gid_) return true;
    gid_t groups[256];
    socklen_t glen = sizeof groups;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0) {
      for (size_t i = 0; i < glen / sizeof(gid_t); ++i)
        if (groups[i] == allowed_gid_) return true;
    }
  }
  *why = "uid " + std::to_string(cred.uid) + " is neither parallaxd's user nor in its group" +
         (config_.group.empty() ? " (none configured: see --group)" : " '" + config_.group + "'");
  return false;
}

void Server::accept_connections() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) PX_LOG_WARN("accept: %s", strerror(errno));
      return;
    }
    pid_t pid = 0;
    uid_t uid = 0;
    std::string why;
    bool allowed = peer_allowed(fd, &pid, &uid, &why);
    auto session = std::make_shared<Session>(*this, fd, next_session_id_++, pid, uid);
    sessions_[session->id()] = session;
    session->start();
    if (!allowed) {
      PX_LOG_WARN("refusing pid %d: %s", static_cast<int>(pid), why.c_str());
      session->refuse(PX_ERR_PERMISSION, "parallaxd refused the connection: " + why);
    }
  }
}

px_status Server::join_job(const std::shared_ptr<Session>& session, const std::string& name,
                           int local_size, int rank, std::shared_ptr<Job>* job_out,
                           int* assigned_rank, std::string* error) {
  if (service_.draining()) {
    *error = service_.refusal();
    return PX_ERR_CONNECT;
  }
  // Checked before the job exists, so a refused first worker leaves no empty job behind.
  uint64_t arena = session->arena().size();
  uint64_t arena_limit = config_.job_limits.arena_bytes;
  auto existing = jobs_.find(name);
  uint64_t arena_used = existing != jobs_.end() ? existing->second->usage().arena_bytes : 0;
  if (arena_limit != 0 && arena_used + arena > arena_limit) {
    *error = "job '" + name + "' on " + node_label(config_.node_index) + ": an arena of " +
             std::to_string(arena) + " bytes for " + session->label() +
             " would bring the job's arenas to " + std::to_string(arena_used + arena) +
             " bytes, more than limits.job_arena_bytes = " + std::to_string(arena_limit) +
             " (ask for a smaller arena_bytes)";
    return PX_ERR_NO_MEMORY;
  }
  auto& job = jobs_[name];
  if (!job) job = std::make_shared<Job>(name, local_size);
  if (job->local_size() != local_size) {
    *error = "job '" + name + "' has local_size " + std::to_string(job->local_size()) +
             ", this worker says " + std::to_string(local_size);
    return PX_ERR_MISMATCH;
  }
  if (!cluster_broken_.empty()) {
    *error = "parallaxd on " + node_label() + " lost its cluster: " + cluster_broken_ +
             " (new jobs start once the node is back and the cluster re-forms)";
    return PX_ERR_PEER_LOST;
  }
  if (!job->broken().empty()) {
    *error = "job '" + name + "' cannot take new workers: " + job->broken() +
             "; disconnect its remaining workers and start again";
    return job->broken_status();
  }
  if (job->ready()) {
    *error = "job '" + name + "' already has all " + std::to_string(local_size) + " local workers";
    return PX_ERR_INVALID;
  }
  if (rank < 0) rank = job->first_free_rank();
  auto& slot = job->members()[static_cast<size_t>(rank)];
  if (slot) {
    *error = "local rank " + std::to_string(rank) + " of job '" + name + "' is already taken by " +
             slot->label();
    return PX_ERR_INVALID;
  }
  slot = session;
  job->usage().arena_bytes += arena;
  *job_out = job;
  *assigned_rank = rank;
  if (job->connected() == local_size) job_complete_locally(job);
  return PX_OK;
}

void Server::job_complete_locally(const std::shared_ptr<Job>& job) {
  job->mark_ready();
  PX_LOG_INFO_AT(job_fields(job->name()), "job '%s': all %d local workers connected",
                 job->name().c_str(), job->local_size());
  if (!cluster_) return activate(job);
  // Ranks and world size come once every node has its part of the job.
  if (cluster_->ready()) {
    cluster_->join_job(job->name(), static_cast<uint32_t>(job->local_size()), can_run_nccl());
  } else {
    jobs_waiting_for_cluster_.push_back(job->name());
  }
}

void Server::activate(const std::shared_ptr<Job>& job) {
  // After the current callback returns, so a joining session has its rank first.
  post([job] {
    // join_job puts only sessions in a job's members: the cast is safe.
    for (auto& member : job->members())
      if (member) std::static_pointer_cast<Session>(member)->activate();
  });
}

void Server::leave_job(Session& session, const std::string& why) {
  auto it = jobs_.find(session.job()->name());
  if (it == jobs_.end()) return;
  std::shared_ptr<Job> job = it->second;
  int rank = session.local_rank();
  if (rank >= 0 && job->members()[static_cast<size_t>(rank)].get() == &session) {
    job->members()[static_cast<size_t>(rank)].reset();
    job->usage().arena_bytes -= session.arena().size();
  }
  if (job->ready() && job->broken().empty()) {
    // The job cannot complete another step without this worker: its steps fail here and,
    // relayed, on every other node at once (not at their deadlines). A worker that left
    // cleanly lets operations already under way finish; one that died fails them all.
    bool died = !session.left_cleanly();
    std::string reason = session.label() + " " + why;
    if (!died && service_.draining()) {
      // The drain ends every job here and on the other nodes itself, naming the drain; a
      // worker it refused, leaving, is news of that, not a cause of its own.
      job->mark_departed(reason, true);
    } else {
      if (died) {
        break_job(*job, reason, Break::kFailure);
      } else {
        worker_left(*job, reason, true);
      }
      if (cluster_ && job->barrier_id() != 0)
        cluster_->report_job_broken(job->name(), job->barrier_id(), reason, !died);
    }
  }
  if (job->connected() > 0) return;
  jobs_.erase(it);
  // A run of an earlier epoch: its traffic ended with the lost node (fail_all), and its ids
  // may belong to this epoch's runs now (a restarted coordinator counts from 1 again).
  if (cluster_ && job->barrier_id() != 0 && job->epoch() != cluster_->epoch())
    return free_job_state(*job);
  if (cluster_ && job->barrier_id() != 0 && cluster_broken_.empty()) {
    // Other nodes may still be sending to this node's shards and receives: they stay until
    // every node's workers have left (the coordinator's JobEnd, events.job_end).
    ended_here_[job->barrier_id()] = job;
    // A draining node does not report it: its checkpoint asks every node's shards of the
    // job, which a JobEnd would free under it. The other nodes free theirs when this node
    // is lost (it exits once drained).
    if (service_.draining()) return;
    cluster_->report_job_left(job->name(), job->barrier_id());
    return;
  }
  stop_job_traffic(*job, "job '" + job->name() + "' ended");
  free_job_state(*job);
  release_idle_memory();
}

void Server::release_idle_memory() {
  if (!jobs_.empty() || !ended_here_.empty()) return;
  // The collectives' idle receive buffers are kept for the next steps of running jobs; with
  // none left they are only a cost. malloc_trim hands the heap's free pages back too (glibc
  // serves allocations below its adaptive mmap threshold, up to 32 MiB, from the heap).
  size_t idle = ScratchBuffer::idle_bytes();
  ScratchBuffer::free_idle();
  malloc_trim(0);
  PX_LOG_DEBUG(
      "no job left: %zu bytes of idle scratch buffers and the heap's free pages "
      "released",
      idle);
}

void Server::free_job_state(Job& job) {
  for (auto& var : job.variables()) scheduler_.sparse().release(*var);
  end_device_routes(job, PX_ERR_PEER_LOST, "job '" + job.name() + "' ended", !exiting_);
}

std::shared_ptr<Job> Server::find_run(uint32_t barrier_id) const {
  auto ended = ended_here_.find(barrier_id);
  if (ended != ended_here_.end()) return ended->second;
  for (auto& [name, job] : jobs_)
    if (job->barrier_id() == barrier_id) return job;
  return nullptr;
}

void Server::stop_job_traffic(Job& job, const std::string& why) {
  if (fabric_ && job.barrier_id() != 0) {
    std::vector<uint32_t> ids{job.barrier_id()};
    for (auto& var : job.variables())
      if (var->global_id != 0) ids.push_back(var->global_id);
    fabric_->fail_variables(ids, why);
  }
}

void Server::on_stall_check(uv_timer_t* timer) {
  auto* self = static_cast<Server*>(timer->data);
  int64_t now = monotonic_ns();
  int64_t stall_ns = self->config_.step_stall_ms * 1000000;
  auto jobs = self->jobs_;  // breaking a job may end it
  for (auto& [name, job] : jobs) {
    if (!job->ready() || !job->broken().empty()) continue;
    for (const StalledStep& stalled : self->scheduler_.fail_stalled(*job, now, stall_ns)) {
      LogFields fields;
      fields.job = name;
      fields.variable = stalled.variable;
      fields.step = static_cast<int64_t>(stalled.step);
      PX_LOG_WARN_AT(fields, "job '%s': %s", name.c_str(), stalled.message.c_str());
      // On a cluster the other nodes wait for this node's share of the step in vain.
      if (job->world().node_count > 1)
        self->abort_job(*job, stalled.message + " (on " + self->node_label() + ")");
    }
  }
}

void Server::abort_job(Job& job, const std::string& why) {
  if (!job.broken().empty()) return;
  break_job(job, why, Break::kFailure);
  if (cluster_ && job.barrier_id() != 0)
    cluster_->report_job_broken(job.name(), job.barrier_id(), why, false);
}

void Server::forget_session(uint64_t id) {
  sessions_.erase(id);
}

}  // namespace px
