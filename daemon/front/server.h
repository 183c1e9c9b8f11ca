// parallaxd's event loop: the listening socket, sessions, jobs, the scheduler and the pool.
#pragma once

#include <signal.h>
#include <uv.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/cluster/cluster.h"
#include "daemon/common/job.h"
#include "daemon/common/thread_pool.h"
#include "daemon/dense/cross_node_route.h"
#include "daemon/dense/scheduler.h"
#include "daemon/front/config.h"
#include "daemon/front/periodic_checkpoints.h"
#include "daemon/front/service.h"
#include "daemon/gpu/gpu_loader.h"
#include "daemon/observe/observer.h"
#include "transport/fabric/fabric_endpoint.h"

namespace px {

class Session;

class Server {
 public:
  // membership: the node's registration on etcd (main made it; config.node_index is the
  // index it assigned), handed to the cluster; null for a static cluster or a single node.
  explicit Server(DaemonConfig config, std::unique_ptr<EtcdMembership> membership = nullptr);
  ~Server();

  // Loads the GPU backend (gpu.mode), binds the socket and, on a cluster, opens the fabric endpoint
  // and starts the rendezvous; false with error set if it cannot.
  bool listen(std::string* error);
  // Runs until SIGINT/SIGTERM (exit code 0) or a fatal cluster error (1).
  int run();
  // The signals the daemon handles (SIGINT, SIGTERM, SIGHUP). main() blocks them before
  // anything starts and run() unblocks them once its handlers are installed: one sent during
  // the start (a stop, logrotate's SIGHUP) waits for its handler instead of taking the
  // default action or a provider library's handler.
  static sigset_t handled_signals();

  const DaemonConfig& config() const { return config_; }
  // Readiness, watchdog, SIGHUP and the SIGTERM drain (service.h).
  Service& service() { return service_; }
  uv_loop_t* loop() { return &loop_; }
  Scheduler& scheduler() { return scheduler_; }

  // Thread-safe: runs fn on the loop thread.
  void post(std::function<void()> fn);

  // Adds session to job name as rank (or the first free rank when rank < 0). On success
  // returns PX_OK and, when the job became complete, activates all its members.
  px_status join_job(const std::shared_ptr<Session>& session, const std::string& name,
                     int local_size, int rank, std::shared_ptr<Job>* job, int* assigned_rank,
                     std::string* error);
  // A member left (cleanly or not). A started job is broken from then on.
  void leave_job(Session& session, const std::string& why);
  // Fails the job here and on every other node with why (px_abort, a withdrawn or stalled
  // step on a cluster).
  void abort_job(Job& job, const std::string& why);
  void forget_session(uint64_t id);
  // A variable was registered on this node for the first time (cluster: agree on it).
  void variable_added(Job& job, Variable& var);
  // This node's workers registered the variable differently (cluster: everyone must know).
  void variable_conflict(Job& job, Variable& var, const Fingerprint& other);
  // "node 1 (10.0.0.2:7070)" on a cluster, "" on a single node.
  std::string node_label() const;
  // "node 2 (10.0.0.3:7070)" on a cluster, "node 0" on a single node.
  std::string node_label(int node) const;
  // Node `rank` of the current epoch, as the data plane numbers nodes (cluster.h: rank()).
  std::string rank_label(int rank) const;

  // What pxctl and the metrics read (daemon/front/admin.cc); loop thread.
  Observer& observer() { return *observer_; }
  const std::map<std::string, std::shared_ptr<Job>>& jobs() const { return jobs_; }
  const std::map<uint64_t, std::shared_ptr<Session>>& sessions() const { return sessions_; }
  const Cluster* cluster() const { return cluster_.get(); }
  FabricEndpoint* fabric() const { return fabric_.get(); }  // null on a single node
  const gpu::LoadedGpu& gpu() const { return gpu_; }
  // Whether this daemon offers NCCL for device allreduces across nodes (built with it, a
  // GPU, gpu.cross_node = auto): a job uses it where every node does.
  bool can_run_nccl() const;
  const std::string& cluster_broken() const { return cluster_broken_; }
  int lost_node() const { return lost_node_; }  // -1: none

 private:
  friend class Service;  // the drain walks the sessions and jobs, and ends the daemon

  static void on_listen_event(uv_poll_t* handle, int status, int events);
  static void on_async(uv_async_t* handle);
  static void on_signal(uv_signal_t* handle, int signum);
  void accept_connections();
  bool peer_allowed(int fd, pid_t* pid, uid_t* uid, std::string* why);
  void shutdown();
  bool start_cluster(std::string* error);
  void job_complete_locally(const std::shared_ptr<Job>& job);
  void activate(const std::shared_ptr<Job>& job);
  // why names the node; status: PX_ERR_MEMBERSHIP when nodes joined (none was lost).
  void on_node_lost(const std::string& why, px_status status = PX_ERR_PEER_LOST);
  // Fails every operation of a started job, pending or in flight. kFailure (a worker died,
  // a step failed): the job's messages on the fabric stop too (peers may never send what
  // they wait for). kNodeLost: fail_all stopped the fabric already.
  enum class Break { kFailure, kNodeLost };
  void break_job(Job& job, const std::string& why, Break how, px_status status = PX_ERR_PEER_LOST);
  // A worker of a started job left with px_disconnect, on this node (here) or another: see
  // the .cc for what fails and what goes on.
  void worker_left(Job& job, const std::string& why, bool here);
  void on_fatal(const std::string& why);
  // Cancels the job's posted fabric receives (a sparse table's, for other nodes' requests,
  // hold the table) and fails its messages that still arrive.
  void stop_job_traffic(Job& job, const std::string& why);
  // The job's state here is no longer needed (stop_job_traffic came first): its sparse
  // tables let go of unfinished work that refers back to them, so they are freed with it.
  void free_job_state(Job& job);
  // Once no job is left: the idle scratch buffers and the heap's free pages go back.
  void release_idle_memory();
  // Device routes across nodes (server_device_routes.cc): the scheduler's channel to the
  // coordinator and the cluster's answers; whether this daemon can run NCCL.
  class ClusterRoutes;
  void wire_device_routes(Cluster::Events& events);
  // A started run of a job by its barrier id, running or ended here; null if gone.
  std::shared_ptr<Job> find_run(uint32_t barrier_id) const;
  // After a worker left cleanly, how long operations under way get to finish.
  static constexpr uint64_t kWorkerLeftGraceMs = 2000;

  DaemonConfig config_;
  uv_loop_t loop_{};
  uv_poll_t listen_poll_{};
  uv_async_t async_{};
  uv_signal_t sigint_{};
  uv_signal_t sigterm_{};
  int listen_fd_ = -1;
  gid_t allowed_gid_ = static_cast<gid_t>(-1);
  bool stopping_ = false;
  bool exiting_ = false;  // run() returns: the loop stopped
  uint64_t next_session_id_ = 1;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  // Cluster: started jobs whose local workers have all left, by barrier id; kept (their
  // shards may still be in use by other nodes) until every node's have (Cluster job_end).
  std::map<uint32_t, std::shared_ptr<Job>> ended_here_;
  std::mutex posted_mutex_;
  std::vector<std::function<void()>> posted_;
  bool loop_closed_ = false;  // by ~Server; guarded by posted_mutex_
  // Before pool_: destroyed after it, so tasks the pool still drains at exit (mappings being
  // opened, device steps) never call a deleted backend.
  gpu::LoadedGpu gpu_;
  ThreadPool pool_;
  Scheduler scheduler_;
  std::unique_ptr<FabricEndpoint> fabric_;
  std::unique_ptr<EtcdMembership> membership_;  // until start_cluster hands it on
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<RouteChannel> route_channel_;  // a ClusterRoutes
  std::vector<std::string> jobs_waiting_for_cluster_;
  std::string cluster_broken_;  // set once a node is lost
  int lost_node_ = -1;          // which
  std::unique_ptr<Observer> observer_;
  int exit_code_ = 0;
  uv_timer_t exit_timer_{};
  uv_timer_t stall_timer_{};  // step_stall_ms: fails steps a local worker never submitted
  static void on_stall_check(uv_timer_t* timer);
  Service service_{*this};
  PeriodicCheckpoints periodic_checkpoints_{*this};
};

}  // namespace px
