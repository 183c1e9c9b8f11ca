// The coordinator's side of the control plane: joins (and refusals), carrying the reports
// on jobs and variables to the agreement (agreement.h) and its verdicts to the nodes,
// relaying what every node must hear.
#include <algorithm>

#include "daemon/cluster/cluster_auth.h"
#include "daemon/cluster/cluster_internal.h"
#include "daemon/common/log.h"

namespace px {

using cluster_detail::build;

namespace {

Fingerprint read_fingerprint(RegisterVar::Reader r) {
  Fingerprint f;
  f.dtype = static_cast<DType>(r.getDtype());
  f.count = r.getCount();
  f.op = static_cast<ReduceOp>(r.getOp());
  f.sparse = r.getSparse();
  f.dim = r.getDim();
  f.options = r.getOptions();
  return f;
}

}  // namespace

bool Cluster::listen(std::string* error) {
  sockaddr_storage addr{};
  std::string endpoint = config_.listen.empty() ? hosts_[0] : config_.listen;
  if (!cluster_detail::resolve(endpoint, &addr, error)) return false;
  uv_tcp_init(loop_, &listener_);
  listener_.data = this;
  listening_ = true;
  int rc = uv_tcp_bind(&listener_, reinterpret_cast<sockaddr*>(&addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 128, on_connection);
  if (rc != 0) {
    *error = "cannot listen for nodes on " + endpoint + ": " + uv_strerror(rc);
    return false;
  }
  return true;
}

void Cluster::on_connection(uv_stream_t* server, int status) {
  auto* self = static_cast<Cluster*>(server->data);
  if (status < 0) return;
  self->connections_.push_back(std::make_unique<Connection>(self, self->config_.cluster));
  Connection& c = *self->connections_.back();
  uv_tcp_init(self->loop_, &c.tcp);
  c.tcp.data = &c;
  if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c.tcp)) != 0)
    return self->close_connection(c);
  uv_tcp_nodelay(&c.tcp, 1);
  self->connected(c);
  self->start_reading(c);
  if (!self->config_.secret.empty()) {
    c.nonce = auth_nonce();
    auto message = build(self->config_.cluster, self->epoch_, [&](Envelope::Body::Builder b) {
      b.initChallenge().setNonce(
          kj::arrayPtr(reinterpret_cast<const kj::byte*>(c.nonce.data()), c.nonce.size()));
    });
    self->write(c, frame_envelope(*message));
  }
}

void Cluster::coordinator_receive(Connection& from, Envelope::Reader envelope) {
  auto which = envelope.getBody().which();
  if (which == Envelope::Body::JOIN) {
    from.join_epoch = envelope.getEpoch();
    return handle_join(from, envelope.getBody().getJoin());
  }
  if (from.node < 0) return refuse(from, "no Join", "it sent a message before its Join");
  if (which == Envelope::Body::HEARTBEAT) return;  // it arrived: that was its whole point
  // With membership on etcd the agreement counts nodes by their rank in the epoch: a report
  // sent before its node learnt of the newest epoch belongs to a job that epoch ended.
  if (membership_ && envelope.getEpoch() != epoch_) return;
  coordinator_handle(from.node, envelope);
}

void Cluster::handle_join(Connection& from, Join::Reader join) {
  if (from.node >= 0) {  // no daemon sends two; a node that did is still the node it was
    PX_LOG_WARN_AT(peer_fields(from.node), "cluster: %s sent a second Join; ignored",
                   node_label(from.node).c_str());
    return;
  }
  uint32_t index = join.getNodeIndex(), count = join.getNodeCount();
  std::string host = join.getHost();
  std::string claim = "node " + std::to_string(index) + " of " + std::to_string(count) +
                      (host.empty() ? "" : ", host " + host);
  std::string name = "cluster '" + config_.cluster + "'";
  std::string node_nonce;
  if (!config_.secret.empty()) {
    // Before anything the Join says is believed: a daemon without the secret learns nothing
    // about the cluster and changes nothing in it.
    auto nonce = join.getNonce();
    auto auth = join.getAuth();
    node_nonce.assign(reinterpret_cast<const char*>(nonce.begin()), nonce.size());
    std::string got(reinterpret_cast<const char*>(auth.begin()), auth.size());
    if (auth.size() == 0)
      return refuse(from, claim,
                    "it sent no authentication: " + name +
                        " requires the cluster secret (secret_file) on every daemon");
    if (node_nonce.size() != kAuthNonceBytes ||
        !auth_equal(got, auth_mac(config_.secret, "join", config_.cluster, from.nonce, node_nonce,
                                  index, count)))
      return refuse(from, claim,
                    "it failed authentication: its cluster secret is not " + name + "'s");
  } else if (join.getAuth().size() != 0) {
    return refuse(from, claim, "it authenticates with a cluster secret; " + name + " has none");
  }
  // No daemon's configuration yields these (the coordinator's index, 0 in a static
  // cluster, does not join, and a daemon checks its index against its own count and
  // kMaxNodeIndex): a garbled or forged Join. The joiner alone is at fault, whenever it comes.
  if (index == static_cast<uint32_t>(coordinator_node_))
    return refuse(
        from, claim,
        "node index " + std::to_string(index) + " is the coordinator's (a malformed Join)");
  if (index >= count || index > static_cast<uint32_t>(kMaxNodeIndex))
    return refuse(
        from, claim,
        "node index " + std::to_string(index) + " is outside " + (membership_ ? "0" : "1") + ".." +
            std::to_string(std::min<int64_t>(static_cast<int64_t>(count) - 1, kMaxNodeIndex)) +
            " (a malformed Join)");
  int node = static_cast<int>(index);
  if (ready_) {
    // The cluster formed: its nodes agreed on one configuration and jobs run on them, so a
    // daemon that disagrees now is the one at fault. Refuse it alone; the cluster goes on.
    // A lost node's index is free: a daemon taking it (the lost one restarted, or resumed
    // after a stop) rejoins, and the cluster re-forms under a new epoch.
    if (static_cast<int>(count) != config_.node_count)
      return refuse(from, claim,
                    "this daemon expects " + std::to_string(count) + " nodes; " + name + " has " +
                        std::to_string(config_.node_count) + " and has formed");
    if (Connection* holder = node_links_[static_cast<size_t>(node)])
      return refuse(from, claim,
                    "node index " + std::to_string(node) + " is taken by " + node_label(node) +
                        " of the running " + name + " (connected from " + holder->peer +
                        "); start this daemon with a free index, or stop the other and restart "
                        "the cluster");
  } else if (static_cast<int>(count) != config_.node_count) {
    // Before the cluster formed, a node count that differs from the coordinator's or an index
    // claimed twice is a conflict between two configurations, and either may be the wrong
    // one: the coordinator's count is no more authoritative than the member's (were the
    // coordinator wrong, it would refuse every member in turn), and the daemon that connected
    // first for an index is not more right than the second (forming with it would run jobs
    // on whichever machine won the race). Stop every daemon, naming both sides, so that the
    // configuration gets fixed.
    return abort_rendezvous("node " + std::to_string(node) + " (" + host + ", connected from " +
                            from.peer + ") expects " + std::to_string(count) +
                            " nodes; the coordinator has " + std::to_string(config_.node_count) +
                            " (index must be 1.." + std::to_string(config_.node_count - 1) + ")");
  } else if (Connection* holder = node_links_[static_cast<size_t>(node)]) {
    return abort_rendezvous("two daemons claim node index " + std::to_string(node) + " (" +
                            hosts_[static_cast<size_t>(node)] + ", connected from " + holder->peer +
                            ", and " + host + ", connected from " + from.peer + ")");
  }
  from.node = node;
  highest_join_epoch_ = std::max(highest_join_epoch_, from.join_epoch);
  if (!config_.secret.empty()) {
    std::string proof =
        auth_mac(config_.secret, "coordinator", config_.cluster, node_nonce, from.nonce);
    auto message = build(config_.cluster, epoch_, [&](Envelope::Body::Builder b) {
      b.initAuthProof().setAuth(
          kj::arrayPtr(reinterpret_cast<const kj::byte*>(proof.data()), proof.size()));
    });
    write(from, frame_envelope(*message));
  }
  node_links_[static_cast<size_t>(node)] = &from;
  auto address = join.getFabricAddress();
  fabric_addresses_[static_cast<size_t>(node)].assign(
      reinterpret_cast<const char*>(address.begin()), address.size());
  // With membership on etcd a node index changes hands (a replacement takes a lost one's).
  if (hosts_[static_cast<size_t>(node)].empty() || (membership_ && !host.empty()))
    hosts_[static_cast<size_t>(node)] = host;
  ++joined_;
  PX_LOG_INFO_AT(peer_fields(node), "cluster: %s %s from %s (%d of %d)", node_label(node).c_str(),
                 ready_ ? "rejoined" : "joined", from.peer.c_str(), joined_, config_.node_count);
  if (joined_ < config_.node_count) {
    // After an epoch, a join re-forms; with membership_max_nodes above node_count, so does
    // the first epoch once node_count joined (try_form).
    if (membership_ && (std::max(epoch_, highest_join_epoch_) > 0 || joined_ >= first_nodes()))
      want_reform();
    return;
  }
  form();
}

int Cluster::first_nodes() const {
  return config_.first_nodes > 0 ? config_.first_nodes : config_.node_count;
}

int Cluster::rank_of(int node) const {
  auto it = std::find(roster_.begin(), roster_.end(), node);
  return it == roster_.end() ? -1 : static_cast<int>(it - roster_.begin());
}

void Cluster::want_reform() {
  reform_wanted_ = true;
  changed_at_ms_ = EtcdMembership::now_ms();
  reform_wait_logged_ = -2;
  uv_timer_start(&form_timer_, on_form_timer, 0, 0);
}

void Cluster::try_form() {
  if (stopped_ || !coordinator_) return;
  if (joined_ == config_.node_count) return form();
  // A static cluster forms with every node; with membership, want_reform() came first.
  if (!membership_ || !reform_wanted_) return;
  // The first epoch forms with node_count (of membership_max_nodes) nodes, later ones with
  // at least membership_min_nodes.
  bool first = std::max(epoch_, highest_join_epoch_) == 0;
  int fewest = first ? first_nodes() : config_.min_nodes;
  if (joined_ < fewest) {
    if (reform_wait_logged_ != -1)
      PX_LOG_WARN(
          "cluster '%s': %d of %d nodes joined, fewer than %s (%d): waiting for a node to join",
          config_.cluster.c_str(), joined_, config_.node_count,
          first ? "node_count" : "membership_min_nodes", fewest);
    reform_wait_logged_ = -1;
    return;  // a join asks again
  }
  // Every node etcd still holds a key for, read after the change, must have joined: a lost
  // node's key goes when its lease expires (membership_lease_s after its daemon stopped).
  std::vector<int> registered;
  if (membership_->registered(changed_at_ms_, &registered)) {
    int missing = -1;
    for (int node : registered)
      if (node != config_.node_index && !node_links_[static_cast<size_t>(node)]) {
        missing = node;
        break;
      }
    if (missing < 0) return form();
    // A node alive in etcd that cannot reach this one (a partition between the two alone)
    // would hold the others back for as long as it lasts: after peer_silence_ms it is left out,
    // as a node that silent on a control connection is lost, and taken in when it joins.
    if (EtcdMembership::now_ms() - changed_at_ms_ >= config_.peer_silence_ms) {
      PX_LOG_WARN(
          "cluster '%s': %s is registered in etcd but has not joined within peer_silence_ms "
          "(%lld ms): re-forming without it (it is taken in when it joins)",
          config_.cluster.c_str(), node_label(missing).c_str(),
          static_cast<long long>(config_.peer_silence_ms));
      return form();
    }
    if (reform_wait_logged_ != missing)
      PX_LOG_INFO(
          "cluster '%s': %d of %d nodes joined; re-forming once %s, registered in etcd, joins "
          "or its lease expires (at most peer_silence_ms)",
          config_.cluster.c_str(), joined_, config_.node_count, node_label(missing).c_str());
    reform_wait_logged_ = missing;
  }
  uv_timer_start(&form_timer_, on_form_timer, 100, 0);
}

void Cluster::form() {
  if (membership_ && !membership_->holds(term_)) {
    // Only a coordinator etcd just confirmed starts an epoch: one that lost etcd may have been
    // replaced by now. Checked again until it is confirmed (or replaced: coordinator_elected).
    if (form_waits_logged_ != term_)
      PX_LOG_WARN(
          "cluster '%s': every node joined; forming once etcd confirms term %lld is "
          "still this node's",
          config_.cluster.c_str(), static_cast<long long>(term_));
    form_waits_logged_ = term_;
    uv_timer_start(&form_timer_, on_form_timer, 100, 0);
    return;
  }
  // A new epoch: past every epoch a member was in (a restarted coordinator starts at 0), and
  // past this one when a lost node came back. The earlier epoch's jobs all failed with it.
  // The coordinator takes it up as a member does (member_handle), which moves epoch_.
  uint64_t epoch = std::max(epoch_, highest_join_epoch_) + 1;
  // The epoch's nodes: every node joined now (all of them, or with membership on etcd, at
  // least min_nodes after a loss). Ranks are their positions.
  std::vector<int> roster;
  for (int node = 0; node < config_.node_count; ++node)
    if (node == config_.node_index || node_links_[static_cast<size_t>(node)])
      roster.push_back(node);
  reform_wanted_ = false;
  uv_timer_stop(&form_timer_);
  agreement_.reset(static_cast<int>(roster.size()));
  device_routes_.reset(static_cast<int>(roster.size()));
  // Epoch e's ids start at e x 65,536: a restarted coordinator, whose counter starts at 1,
  // hands out none of the ids the members knew in an earlier epoch (unless one epoch
  // registered more than 65,536 runs and variables).
  agreement_.skip_ids_below(static_cast<uint32_t>(epoch << 16));
  if (membership_)  // the fencing record: one coordinator per epoch, by its term
    PX_LOG_INFO("cluster '%s': %s forms epoch %llu as coordinator of term %lld on %zu of %d nodes",
                config_.cluster.c_str(), node_label(config_.node_index).c_str(),
                static_cast<unsigned long long>(epoch), static_cast<long long>(term_),
                roster.size(), config_.node_count);
  auto message = build(config_.cluster, epoch, [&](Envelope::Body::Builder body) {
    auto table = body.initAddressTable();
    auto n = static_cast<unsigned>(roster.size());
    auto addresses = table.initFabricAddresses(n);
    auto hosts = table.initHosts(n);
    auto nodes = table.initNodes(n);
    for (unsigned i = 0; i < n; ++i) {
      auto node = static_cast<size_t>(roster[i]);
      const std::string& a = fabric_addresses_[node];
      addresses.set(i, kj::arrayPtr(reinterpret_cast<const kj::byte*>(a.data()), a.size()));
      hosts.set(i, hosts_[node]);
      nodes.set(i, static_cast<uint32_t>(roster[i]));
    }
  });
  broadcast(frame_envelope(*message));
  member_handle(message->getRoot<Envelope>().asReader());
}

void Cluster::coordinator_handle(int node, Envelope::Reader envelope) {
  auto body = envelope.getBody();
  int rank = rank_of(node);  // the agreement's numbering
  if (rank < 0) {
    PX_LOG_WARN_AT(peer_fields(node), "cluster: a report from %s, not in epoch %llu; ignored",
                   node_label(node).c_str(), static_cast<unsigned long long>(epoch_));
    return;
  }
  switch (body.which()) {
    case Envelope::Body::JOB_JOIN: {
      auto j = body.getJobJoin();
      if (auto verdict = agreement_.job_joined(rank, j.getJob(), j.getLocalSize(), j.getNccl()))
        deliver(*verdict);
      return;
    }
    case Envelope::Body::REGISTER_VAR: {
      auto r = body.getRegisterVar();
      if (auto verdict =
              agreement_.var_registered(rank, r.getJob(), r.getName(), read_fingerprint(r)))
        deliver(*verdict);
      return;
    }
    case Envelope::Body::JOB_LEFT: {
      auto left = body.getJobLeft();
      if (left.getNodeIndex() != static_cast<uint32_t>(node)) {
        PX_LOG_WARN_AT(peer_fields(node),
                       "cluster: %s reported that another node's workers left; ignored",
                       node_label(node).c_str());
        return;
      }
      if (auto verdict = agreement_.job_left(rank, left.getJob(), left.getBarrierId()))
        deliver(*verdict);
      return;
    }
    case Envelope::Body::JOB_BROKEN: {
      if (body.getJobBroken().getNodeIndex() != static_cast<uint32_t>(node)) {
        PX_LOG_WARN_AT(peer_fields(node),
                       "cluster: %s reported a broken job for another node; ignored",
                       node_label(node).c_str());
        return;
      }
      // Relayed as received, to every node but the one it came from.
      capnp::MallocMessageBuilder copy;
      copy.setRoot(envelope);
      std::string frame = frame_envelope(copy);
      for (int other = 0; other < config_.node_count; ++other)
        if (other != node && other != coordinator_node_) send_to_node(other, frame);
      if (node != coordinator_node_) member_handle(envelope);
      return;
    }
    case Envelope::Body::DEVICE_ROUTE_REPORT:
    case Envelope::Body::NCCL_READY:
      return coordinator_device_route(node, envelope);
    default:
      PX_LOG_WARN_AT(peer_fields(node), "cluster: unexpected message from %s",
                     node_label(node).c_str());
  }
}

void Cluster::deliver(const Agreement::Verdict& verdict) {
  using Kind = Agreement::Verdict::Kind;
  auto message = build(config_.cluster, epoch_, [&](Envelope::Body::Builder b) {
    switch (verdict.kind) {
      case Kind::kJobWorld: {
        auto world = b.initJobWorld();
        world.setJob(verdict.job);
        auto list = world.initLocalSizes(static_cast<unsigned>(verdict.local_sizes.size()));
        for (size_t i = 0; i < verdict.local_sizes.size(); ++i)
          list.set(static_cast<unsigned>(i), verdict.local_sizes[i]);
        world.setBarrierId(verdict.id);
        world.setDeviceRoutes(verdict.device_routes);
        if (verdict.device_routes) device_routes_.run_started(verdict.id);
        return;
      }
      case Kind::kVarReady: {
        auto ready = b.initVarReady();
        ready.setJob(verdict.job);
        ready.setName(verdict.var);
        ready.setGlobalId(verdict.id);
        return;
      }
      case Kind::kVarMismatch: {
        auto mismatch = b.initVarMismatch();
        mismatch.setJob(verdict.job);
        mismatch.setName(verdict.var);
        mismatch.setMessage(verdict.message);
        return;
      }
      case Kind::kJobEnd: {
        device_routes_.run_ended(verdict.id);
        auto end = b.initJobEnd();
        end.setJob(verdict.job);
        end.setBarrierId(verdict.id);
        return;
      }
    }
  });
  // The coordinator is a node too: it acts on the verdict as a member would.
  bool everyone = verdict.to == Agreement::Verdict::kEveryNode;
  int to = everyone ? verdict.to : node_of_rank(verdict.to);  // the agreement's is a rank
  if (everyone) broadcast(frame_envelope(*message));
  if (everyone || to == coordinator_node_) {
    member_handle(message->getRoot<Envelope>().asReader());
  } else {
    send_to_node(to, frame_envelope(*message));
  }
}

void Cluster::send_to_node(int node, const std::string& frame) {
  Connection* c = node_links_[static_cast<size_t>(node)];
  if (c) write(*c, frame);
}

void Cluster::broadcast(const std::string& frame) {
  for (int node = 0; node < config_.node_count; ++node)
    if (node != coordinator_node_) send_to_node(node, frame);
}

void Cluster::abort_rendezvous(const std::string& why) {
  PX_LOG_ERROR("cluster '%s': %s", config_.cluster.c_str(), why.c_str());
  auto message = build(config_.cluster, epoch_,
                       [&](Envelope::Body::Builder b) { b.initReject().setReason(why); });
  std::string frame = frame_envelope(*message);
  for (auto& c : connections_)
    if (c->connected && !c->closing && !c->finishing) write(*c, frame);
  events_.fatal(why);
}

void Cluster::refuse(Connection& c, const std::string& claim, const std::string& why) {
  if (c.closing || c.finishing) return;
  PX_LOG_WARN("cluster '%s': refused a join from %s (%s): %s; %s", config_.cluster.c_str(),
              c.peer.c_str(), claim.c_str(), why.c_str(),
              ready_ ? "the running cluster goes on" : "still waiting for the nodes");
  auto message = build(config_.cluster, epoch_,
                       [&](Envelope::Body::Builder b) { b.initReject().setReason(why); });
  finish(c, frame_envelope(*message));
}

}  // namespace px
