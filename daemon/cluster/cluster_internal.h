// What cluster.cc, cluster_coordinator.cc and cluster_liveness.cc share: one control
// connection's state and the helpers that build and address messages (cluster_messages.cc).
// Not for other code (but the fuzz seeds' writer, which builds the very envelopes).
#pragma once

#include <sys/socket.h>

#include <functional>
#include <memory>
#include <string>

#include "daemon/cluster/cluster.h"

namespace px {

struct Cluster::Connection {
  Connection(Cluster* owner, const std::string& cluster_name)
      : cluster(owner), reader(cluster_name, owner->config_.node_count) {}
  Cluster* cluster;
  uv_tcp_t tcp{};
  uv_connect_t connect{};  // member side: its connection to the coordinator
  EnvelopeReader reader;
  int node = -1;            // set once its Join is accepted (coordinator side) / the coordinator's
  uint64_t join_epoch = 0;  // coordinator: the epoch its Join's envelope carried
  std::string peer;         // the far end's address ("10.0.0.2:41234"), for messages
  bool connected = false;   // accepted, or our connect completed: frames may be written
  uint64_t last_heard = 0;  // loop time (ms) bytes last arrived, or it connected
  bool finishing = false;   // closing after its last frame (see finish); nothing is read
  uint64_t finishing_since = 0;
  bool closing = false;
  // With a cluster secret: the nonce this side sent (coordinator: its Challenge's; member:
  // its Join's), and (member) whether the coordinator has proven it holds the secret.
  std::string nonce;
  std::string peer_nonce;  // member: the coordinator's Challenge
  bool proven = false;
};

struct Cluster::WriteRequest {
  uv_write_t request;
  std::string data;
  std::function<void()> done;  // after the frame left (or failed): close_after
};

namespace cluster_detail {

using Fill = std::function<void(Envelope::Body::Builder)>;

// An envelope of our version, the sender's epoch and the cluster name, its body filled by
// fill.
std::unique_ptr<capnp::MallocMessageBuilder> build(const std::string& cluster, uint64_t epoch,
                                                   const Fill& fill);

// "host:port" -> sockaddr (resolved once, at start-up).
bool resolve(const std::string& endpoint, sockaddr_storage* out, std::string* error);

// "10.0.0.2:41234": the far end of a connected TCP handle ("an unknown address" if none).
std::string peer_address(const uv_tcp_t* tcp);

}  // namespace cluster_detail
}  // namespace px
