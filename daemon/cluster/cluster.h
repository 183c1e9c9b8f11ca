// The daemons' control plane: rendezvous through the coordinator (node 0) over TCP (libuv),
// cluster-wide agreement on jobs and variables, and news of lost nodes. Star topology: every
// node keeps one connection to the coordinator, which relays what all must hear; heartbeats
// on those connections tell a hung daemon from a quiet one. The code is in three files:
// cluster.cc (both sides, the member side), cluster_coordinator.cc (joins, relaying, the
// agreement's verdicts as messages) and cluster_liveness.cc (heartbeats, silence,
// keep-alive); the agreement itself, which has no sockets, is in agreement.h.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/cluster/agreement.h"
#include "daemon/cluster/cluster_config.h"
#include "daemon/cluster/device_routes.h"
#include "daemon/cluster/etcd_membership.h"
#include "daemon/common/job.h"
#include "transport/fabric/cluster_wire.h"
#include "transport/fabric/fabric_endpoint.h"

namespace px {

class Cluster {
 public:
  struct Events {
    std::function<void()> ready;                        // fabric peers set, progress running
    std::function<void(const std::string& why)> fatal;  // rendezvous failed: exit
    std::function<void(const std::string& job, const std::vector<uint32_t>& local_sizes,
                       uint32_t barrier_id, bool device_routes)>
        job_world;
    std::function<void(const std::string& job, const std::string& var, uint32_t global_id)>
        var_ready;
    std::function<void(const std::string& job, const std::string& var, const std::string& why)>
        var_mismatch;
    std::function<void(int node, const std::string& why)> node_lost;
    // The cluster re-forms with nodes that joined and none gone (membership on etcd): every
    // job of the earlier epoch ends, as on a loss, but nothing was lost.
    std::function<void(const std::string& why)> nodes_joined;
    // Another node's part of a started job broke (relayed by the coordinator); clean: one of
    // its workers left with px_disconnect.
    std::function<void(const std::string& job, uint32_t barrier_id, int node,
                       const std::string& why, bool clean)>
        job_broken;
    // Every node's workers of this run of the job have left: free what it holds.
    std::function<void(const std::string& job, uint32_t barrier_id)> job_end;
    // The cluster formed again after losing a node (it rejoined under its index, or the
    // coordinator restarted and every node joined it): new jobs run; the earlier epoch's
    // jobs stay failed.
    std::function<void(uint64_t epoch)> reformed;
    // Device routes (device_routes.h): a variable's route, an NCCL step's turn (in turn
    // order); and, on the coordinator, a fresh NCCL unique id (GpuBackend::nccl_unique_id;
    // unset: none, so every route is the host ring).
    std::function<void(const DeviceRoutes::Route& route)> device_route;
    std::function<void(const DeviceRoutes::Turn& turn)> nccl_turn;
    DeviceRoutes::MakeId nccl_unique_id;
  };

  // membership: set when the cluster's membership lives on etcd (etcd_membership.h; this
  // node's index is already the one it assigned): the coordinator is whichever node etcd
  // elected, not node 0, and a new one is elected when it is lost. Null: the static
  // configuration (node 0 coordinates).
  Cluster(uv_loop_t* loop, const ClusterConfig& config, FabricEndpoint& fabric, Events events,
          std::unique_ptr<EtcdMembership> membership = nullptr);
  ~Cluster();

  bool start(std::string* error);
  void stop();
  bool ready() const { return ready_; }
  // 0 before the cluster first formed, then 1, +1 each time it re-forms.
  uint64_t epoch() const { return epoch_; }
  int node_index() const { return config_.node_index; }
  int node_count() const { return config_.node_count; }
  // The coordinating node: 0 in a static cluster; etcd's choice with membership on etcd.
  int coordinator_node() const { return coordinator_node_; }
  // Its term in etcd (the coordinator key's create revision); 0 in a static cluster.
  int64_t coordinator_term() const { return term_; }
  // "node 2 (10.0.0.3:7070)"
  std::string node_label(int node) const;
  // This node's place in the current epoch, as the data plane numbers nodes: its rank among
  // the epoch's nodes, and how many there are. A static cluster's epochs hold every node
  // (rank = node index, size = node_count); with membership on etcd an epoch after a loss
  // may hold only the survivors (membership_min_nodes), ranked by node index.
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(roster_.size()); }
  // The rank of node index `node` in the current epoch; -1 if it is not in it.
  int rank_of(int node) const;
  // The node index of rank `rank` in the current epoch (itself when out of range).
  int node_of_rank(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < roster_.size()
               ? roster_[static_cast<size_t>(rank)]
               : rank;
  }

  // Reports this node's part of a job (nccl: this daemon can run NCCL) / a variable
  // registration to the coordinator.
  void join_job(const std::string& job, uint32_t local_size, bool nccl = false);
  void register_var(const std::string& job, const std::string& var, const Fingerprint& fingerprint);
  // Tells every other node that this node's part of a started job broke.
  // clean: a worker left with px_disconnect (news, not a failure).
  void report_job_broken(const std::string& job, uint32_t barrier_id, const std::string& why,
                         bool clean);
  // Every local worker of the run has left this node (the coordinator ends it once every
  // node said so: job_end).
  void report_job_left(const std::string& job, uint32_t barrier_id);
  // Device routes (cluster_device_routes.cc): this node's part of a variable's first
  // cross-node device allreduce, and its part of an NCCL step being ready.
  void report_device_route(uint32_t barrier_id, uint32_t global_id, const NodeDevice& part);
  void report_nccl_ready(uint32_t barrier_id, uint32_t global_id, uint64_t step);

 private:
  struct Connection;
  struct WriteRequest;
  // Sends the agreement's verdict where it goes (the coordinator included).
  void deliver(const Agreement::Verdict& verdict);

  // Coordinator side.
  bool listen(std::string* error);
  static void on_connection(uv_stream_t* server, int status);
  void coordinator_receive(Connection& from, Envelope::Reader envelope);
  void coordinator_handle(int node, Envelope::Reader envelope);
  void handle_join(Connection& from, Join::Reader join);
  // Refuses one connection that has not joined (`claim`: what it said it is): logs it with
  // its address, sends it a Reject with `why`, closes it. The cluster is not disturbed.
  void refuse(Connection& c, const std::string& claim, const std::string& why);
  // Every node has joined: the address table, under a new epoch, to every node.
  void form();
  void send_to_node(int node, const std::string& frame);
  // Membership on etcd, after the first formation: the nodes changed (one lost, one joined,
  // or this node took over as coordinator); re-form once every node registered in etcd has
  // joined (a lost one's key is gone with its lease) and at least min_nodes did.
  void want_reform();
  // Forms if it may now (every node joined, or a wanted re-formation's condition holds);
  // otherwise checks again shortly, while a re-formation is wanted.
  void try_form();
  int first_nodes() const;  // the nodes the first epoch forms with
  void broadcast(const std::string& frame);
  void abort_rendezvous(const std::string& why);

  // Membership on etcd: a coordinator elected (this node or another), in a newer term.
  void coordinator_elected(const EtcdMembership::Coordinator& elected);
  // This node was elected: it listens and waits for every node to join it.
  void become_coordinator();
  static void on_form_timer(uv_timer_t* timer);

  // Member side.
  void connect_to_coordinator();
  // The Join, authenticated against challenge (the coordinator's nonce) with a secret.
  void send_join(Connection& c, const std::string& challenge);
  static void on_connected(uv_connect_t* request, int status);
  static void on_retry_timer(uv_timer_t* timer);
  void member_handle(Envelope::Reader envelope);

  // Device routes (cluster_device_routes.cc): a report on the coordinator, an answer on a
  // member.
  void coordinator_device_route(int node, Envelope::Reader envelope);
  void member_device_route(Envelope::Reader envelope);

  // Both.
  // A report for the coordinator, its body filled by fill: handled here on the
  // coordinator, sent to it from a member.
  void report(const std::function<void(Envelope::Body::Builder)>& fill);
  void send_to_coordinator(const std::string& frame);
  const std::string& coordinator_host() const {
    return hosts_[static_cast<size_t>(coordinator_node_)];
  }
  // close_after: close the connection once the frame is handed to the kernel.
  void write(Connection& c, const std::string& frame, bool close_after = false);
  // Stops reading c and closes it after this last frame (bounded by peer_silence_ms).
  void finish(Connection& c, const std::string& frame);
  void start_reading(Connection& c);
  // tell_it: the coordinator also sends the lost node the news (it may only be stopped,
  // and would read it when it runs again).
  void lost_connection(Connection& c, const std::string& why, bool tell_it = false);
  void close_connection(Connection& c);
  static void on_startup_deadline(uv_timer_t* timer);

  // Liveness (cluster_liveness.cc).
  void start_heartbeats();
  static void on_heartbeat_timer(uv_timer_t* timer);
  void heartbeat_tick();
  void connected(Connection& c);  // accepted or connected: keep-alive, clock starts
  void set_keepalive(Connection& c);
  std::string silence_reason() const;
  std::string timeout_reason() const;  // the kernel's TCP timeout (ETIMEDOUT)

  uv_loop_t* loop_;
  ClusterConfig config_;
  FabricEndpoint& fabric_;
  Events events_;
  bool coordinator_ = false;
  int coordinator_node_ = 0;
  std::unique_ptr<EtcdMembership> membership_;
  int64_t term_ = 0;         // membership on etcd: the coordinator's term this node follows
  uv_timer_t form_timer_{};  // coordinator on etcd: forming waits for etcd to confirm its term
  int64_t form_waits_logged_ = 0;  // the term whose wait form() logged
  bool reform_wanted_ = false;     // want_reform() until form()
  int64_t changed_at_ms_ = 0;      // when it was wanted (EtcdMembership::now_ms)
  int reform_wait_logged_ = -2;    // the node (or -1: too few) whose wait try_form() logged
  std::vector<int> roster_;        // the current epoch's node indices, ascending
  int rank_ = 0;                   // this node's position in roster_
  bool ready_ = false;
  bool stopped_ = false;
  bool rejected_ = false;   // member: the coordinator refused us; no more attempts
  bool rejoining_ = false;  // member: lost the formed cluster's coordinator; rejoining
  uint64_t epoch_ = 0;
  std::vector<std::string> hosts_;  // by node, for messages
  uv_tcp_t listener_{};
  bool listening_ = false;
  uv_timer_t startup_timer_{};
  uv_timer_t retry_timer_{};
  uv_timer_t heartbeat_timer_{};
  uint64_t heartbeat_interval_ms_ = 0;
  uint64_t last_tick_ms_ = 0;  // loop time of the previous heartbeat tick
  std::vector<std::unique_ptr<Connection>> connections_;
  Connection* coordinator_link_ = nullptr;  // member side

  // Coordinator state.
  std::vector<Connection*> node_links_;        // by node index; the coordinator's own is null
  std::vector<std::string> fabric_addresses_;  // by node index
  int joined_ = 0;
  uint64_t highest_join_epoch_ = 0;  // of the members that joined (a restarted coordinator)
  Agreement agreement_;              // on jobs and variables; what it decides, deliver() sends
  DeviceRoutes device_routes_;       // device allreduces' routes and NCCL turns
};

}  // namespace px
