// Telling a lost daemon from a quiet one. A daemon that is stopped (SIGSTOP), hung, or
// blocked in one long callback keeps its sockets: its kernel acknowledges data and answers
// TCP keep-alive probes, so only the process itself can prove it runs. Every daemon's loop
// therefore sends a Heartbeat on each joined control connection every peer_silence_ms / 4
// and drops a connection on which nothing at all arrived for peer_silence_ms: the node
// behind it is lost (the ordinary node-loss path). TCP keep-alive and a bound on
// unacknowledged data stay as a second way to notice a machine or link that vanished.
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "daemon/cluster/cluster_internal.h"
#include "daemon/common/log.h"

namespace px {

void Cluster::start_heartbeats() {
  heartbeat_interval_ms_ = static_cast<uint64_t>(std::max<int64_t>(1, config_.peer_silence_ms / 4));
  uv_timer_init(loop_, &heartbeat_timer_);
  heartbeat_timer_.data = this;
  last_tick_ms_ = uv_now(loop_);
  uv_timer_start(&heartbeat_timer_, on_heartbeat_timer, heartbeat_interval_ms_,
                 heartbeat_interval_ms_);
}

void Cluster::on_heartbeat_timer(uv_timer_t* timer) {
  static_cast<Cluster*>(timer->data)->heartbeat_tick();
}

void Cluster::heartbeat_tick() {
  if (stopped_) return;
  uint64_t now = uv_now(loop_);
  uint64_t silence = static_cast<uint64_t>(config_.peer_silence_ms);
  // A tick that comes late means this loop itself did not run (a long callback, or this
  // process was stopped and continued): the peers' bytes may be waiting unread in our
  // sockets, so their silence may be ours. Judge no one on this tick; restart the clocks.
  bool late = now - last_tick_ms_ > heartbeat_interval_ms_ + silence / 2;
  if (late)
    PX_LOG_WARN(
        "cluster: this daemon's event loop did not run for %llu ms; peer silence is "
        "measured afresh",
        static_cast<unsigned long long>(now - last_tick_ms_));
  last_tick_ms_ = now;
  auto message = cluster_detail::build(config_.cluster, epoch_, [&](Envelope::Body::Builder b) {
    b.initHeartbeat().setNodeIndex(static_cast<uint32_t>(config_.node_index));
  });
  std::string frame = frame_envelope(*message);
  // Judged first, acted on after the loop: losing a connection may write and close others.
  std::vector<Connection*> silent, overdue;
  for (auto& owned : connections_) {
    Connection& c = *owned;
    if (c.closing || !c.connected) continue;
    if (c.finishing) {  // its last frame may be stuck behind a peer that does not read
      if (now - c.finishing_since >= silence) overdue.push_back(&c);
      continue;
    }
    if (late) c.last_heard = now;
    if (now - c.last_heard >= silence) {
      silent.push_back(&c);
      continue;
    }
    // The coordinator beats to joined nodes only: an unjoined connection has yet to say it
    // is a daemon of this cluster (it is still judged by its silence).
    if (!coordinator_ || c.node >= 0) write(c, frame);
  }
  for (Connection* c : overdue) close_connection(*c);
  for (Connection* c : silent) {
    if (c->closing || c->finishing) continue;
    if (coordinator_ && c->node < 0) {
      refuse(*c, "no Join",
             "it sent no complete message within " + std::to_string(config_.peer_silence_ms) +
                 " ms of connecting");
    } else {
      lost_connection(*c, silence_reason(), true);
    }
  }
}

std::string Cluster::silence_reason() const {
  return "sent nothing for " + std::to_string(config_.peer_silence_ms) +
         " ms on its control connection (no heartbeat: the process is stopped or hung, or its "
         "machine or network is gone)";
}

std::string Cluster::timeout_reason() const {
  return "did not acknowledge data or keep-alive probes on its control connection for " +
         std::to_string(config_.peer_silence_ms) + " ms (its machine or network is gone)";
}

void Cluster::connected(Connection& c) {
  c.connected = true;
  c.peer = cluster_detail::peer_address(&c.tcp);
  c.last_heard = uv_now(loop_);
  set_keepalive(c);
}

// Heartbeats notice a vanished machine too (nothing arrives); this bounds what the kernel
// does meanwhile: keep-alive probes after half the silence on an idle connection, three
// more within the other half, and unacknowledged data (our heartbeats) for no longer than
// the whole, after which the read fails with ETIMEDOUT and the node is lost the same way.
void Cluster::set_keepalive(Connection& c) {
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&c.tcp), &fd) != 0) return;
  int silence_s = static_cast<int>(std::max<int64_t>(2, config_.peer_silence_ms / 1000));
  int idle = std::max(1, silence_s / 2), interval = std::max(1, (silence_s - idle) / 3);
  int probes = 3, on = 1;
  unsigned user_timeout = static_cast<unsigned>(config_.peer_silence_ms);
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout) != 0)
    PX_LOG_WARN("cluster: cannot set keep-alive on a control connection: %s", strerror(errno));
}

}  // namespace px
