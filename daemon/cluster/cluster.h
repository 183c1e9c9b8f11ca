// The daemons' control plane: rendezvous through the coordinator (node 0) over TCP (libuv),
// cluster-wide agreement on jobs and variables, and news of lost nodes. Star topology: every
// node keeps one connection to the coordinator, which relays what all must hear.
#pragma once

#include <uv.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/job.h"
#include "daemon/front/config.h"
#include "transport/fabric/cluster_wire.h"
#include "transport/fabric/fabric_endpoint.h"

namespace px {

class Cluster {
 public:
  struct Events {
    std::function<void()> ready;                        // fabric peers set, progress running
    std::function<void(const std::string& why)> fatal;  // rendezvous failed: exit
    std::function<void(const std::string& job, const std::vector<uint32_t>& local_sizes,
                       uint32_t barrier_id)>
        job_world;
    std::function<void(const std::string& job, const std::string& var, uint32_t global_id)>
        var_ready;
    std::function<void(const std::string& job, const std::string& var, const std::string& why)>
        var_mismatch;
    std::function<void(int node, const std::string& why)> node_lost;
    // Another node's part of a started job broke (relayed by the coordinator).
    std::function<void(const std::string& job, uint32_t barrier_id, int node,
                       const std::string& why)>
        job_broken;
  };

  Cluster(uv_loop_t* loop, const DaemonConfig& config, FabricEndpoint& fabric, Events events);
  ~Cluster();

  bool start(std::string* error);
  void stop();
  bool ready() const { return ready_; }
  int node_index() const { return config_.node_index; }
  int node_count() const { return config_.node_count; }
  // "node 2 (10.0.0.3:7070)"
  std::string node_label(int node) const;

  // Reports this node's part of a job / a variable registration to the coordinator.
  void join_job(const std::string& job, uint32_t local_size);
  void register_var(const std::string& job, const std::string& var, const Fingerprint& fingerprint);
  // Tells every other node that this node's part of a started job broke.
  void report_job_broken(const std::string& job, uint32_t barrier_id, const std::string& why);

 private:
  struct Connection;
  struct VarAgreement {
    std::vector<std::optional<Fingerprint>> by_node;
    bool decided = false;
    // The verdict, for a node that registers after it (a node whose own workers disagreed
    // decides it early).
    std::shared_ptr<capnp::MallocMessageBuilder> verdict;
  };
  // Records and sends a verdict to every node (the coordinator included).
  void announce(VarAgreement& agreement, std::unique_ptr<capnp::MallocMessageBuilder> verdict);

  // Coordinator side.
  bool listen(std::string* error);
  static void on_connection(uv_stream_t* server, int status);
  void coordinator_receive(Connection& from, Envelope::Reader envelope);
  void coordinator_handle(int node, Envelope::Reader envelope);
  void handle_join(Connection& from, Join::Reader join);
  void send_to_node(int node, const std::string& frame);
  void broadcast(const std::string& frame);
  void abort_rendezvous(const std::string& why);

  // Member side.
  void connect_to_coordinator();
  static void on_connected(uv_connect_t* request, int status);
  static void on_retry_timer(uv_timer_t* timer);
  void member_handle(Envelope::Reader envelope);

  // Both.
  void send_to_coordinator(const std::string& frame);
  void write(Connection& c, const std::string& frame);
  void start_reading(Connection& c);
  void watch_silence(Connection& c);
  void lost_connection(Connection& c, const std::string& why);
  void close_connection(Connection& c);
  static void on_startup_deadline(uv_timer_t* timer);

  uv_loop_t* loop_;
  DaemonConfig config_;
  FabricEndpoint& fabric_;
  Events events_;
  bool coordinator_ = false;
  bool ready_ = false;
  bool stopped_ = false;
  std::vector<std::string> hosts_;  // by node, for messages
  uv_tcp_t listener_{};
  bool listening_ = false;
  uv_timer_t startup_timer_{};
  uv_timer_t retry_timer_{};
  std::vector<std::unique_ptr<Connection>> connections_;
  Connection* coordinator_link_ = nullptr;  // member side
  uv_connect_t connect_request_{};

  // Coordinator state.
  std::vector<Connection*> node_links_;        // by node index; [0] is ourselves (null)
  std::vector<std::string> fabric_addresses_;  // by node index
  int joined_ = 0;
  std::map<std::string, std::vector<std::optional<uint32_t>>> job_sizes_;
  std::map<std::pair<std::string, std::string>, VarAgreement> vars_;
  uint32_t next_global_id_ = 1;
};

}  // namespace px
