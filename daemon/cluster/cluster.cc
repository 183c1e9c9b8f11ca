// The control plane: both sides' plumbing (start, stop, writing, reading, losing a
// connection) and the member side (joining the coordinator, acting on what it sends).
#include <algorithm>

#include "daemon/cluster/cluster_auth.h"
#include "daemon/cluster/cluster_internal.h"
#include "daemon/common/log.h"

namespace px {

using cluster_detail::build;

namespace {

// What is wrong with an address table's list of nodes (empty: nothing): one address and one
// host per node, node indices ascending within 0..node_count-1.
std::string roster_error(const std::vector<int>& roster, size_t addresses, size_t hosts,
                         int node_count) {
  if (roster.empty() || roster.size() != addresses || roster.size() != hosts)
    return std::to_string(roster.size()) + " nodes, " + std::to_string(addresses) +
           " addresses and " + std::to_string(hosts) + " hosts";
  for (size_t i = 0; i < roster.size(); ++i)
    if (roster[i] < 0 || roster[i] >= node_count || (i > 0 && roster[i] <= roster[i - 1]))
      return "node indices not ascending within 0.." + std::to_string(node_count - 1);
  return "";
}

}  // namespace

Cluster::Cluster(uv_loop_t* loop, const ClusterConfig& config, FabricEndpoint& fabric,
                 Events events, std::unique_ptr<EtcdMembership> membership)
    : loop_(loop),
      config_(config),
      fabric_(fabric),
      events_(std::move(events)),
      // The agreement and the device routes number nodes by their rank in the epoch.
      agreement_(config.node_count, [this](int rank) { return node_label(node_of_rank(rank)); }),
      device_routes_(
          config.node_count, [this](int rank) { return node_label(node_of_rank(rank)); },
          [this](std::string* id, std::string* why) {
            if (events_.nccl_unique_id) return events_.nccl_unique_id(id, why);
            *why = "this daemon cannot make NCCL ids";
            return false;
          }) {
  membership_ = std::move(membership);
  coordinator_ = !membership_ && config_.node_index == 0;
  hosts_ = config_.nodes;
  if (hosts_.empty()) {
    hosts_.assign(static_cast<size_t>(config_.node_count), "");
    if (membership_) {
      hosts_[static_cast<size_t>(config_.node_index)] = config_.listen;
    } else {
      hosts_[0] = config_.coordinator;
    }
  }
  node_links_.assign(static_cast<size_t>(config_.node_count), nullptr);
  fabric_addresses_.assign(static_cast<size_t>(config_.node_count), "");
  for (int node = 0; node < config_.node_count; ++node) roster_.push_back(node);
  rank_ = config_.node_index;
}

Cluster::~Cluster() = default;

std::string Cluster::node_label(int node) const {
  std::string host = node >= 0 && static_cast<size_t>(node) < hosts_.size()
                         ? hosts_[static_cast<size_t>(node)]
                         : "";
  return "node " + std::to_string(node) + (host.empty() ? "" : " (" + host + ")");
}

bool Cluster::start(std::string* error) {
  uv_update_time(loop_);  // the loop has not run yet: its cached clock dates from its creation
  uv_timer_init(loop_, &startup_timer_);
  startup_timer_.data = this;
  uv_timer_start(&startup_timer_, on_startup_deadline,
                 static_cast<uint64_t>(config_.startup_timeout_ms), 0);
  uv_timer_init(loop_, &retry_timer_);
  retry_timer_.data = this;
  uv_timer_init(loop_, &form_timer_);
  form_timer_.data = this;
  start_heartbeats();
  if (membership_) {
    PX_LOG_INFO("cluster '%s': %s of %d, membership on %s; waiting for the coordinator's election",
                config_.cluster.c_str(), node_label(config_.node_index).c_str(), config_.node_count,
                membership_->describe().c_str());
    membership_->start(
        loop_, [this](const EtcdMembership::Coordinator& c) { coordinator_elected(c); },
        [this](const std::string& why) { events_.fatal(why); });
    return true;
  }
  if (coordinator_) {
    fabric_addresses_[0] = fabric_.address();
    joined_ = 1;
    if (!listen(error)) return false;
    PX_LOG_INFO("coordinator of cluster '%s': waiting for %d nodes on %s", config_.cluster.c_str(),
                config_.node_count, hosts_[0].c_str());
    return true;
  }
  connect_to_coordinator();
  return true;
}

void Cluster::stop() {
  if (stopped_) return;
  stopped_ = true;
  uv_timer_stop(&startup_timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&startup_timer_), nullptr);
  uv_timer_stop(&retry_timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&retry_timer_), nullptr);
  uv_timer_stop(&form_timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&form_timer_), nullptr);
  if (membership_) membership_->stop();
  uv_timer_stop(&heartbeat_timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&heartbeat_timer_), nullptr);
  if (listening_) uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
  listening_ = false;
  for (auto& c : connections_) close_connection(*c);
}

// --- member ----------------------------------------------------------------------------

// --- membership on etcd ------------------------------------------------------------------

void Cluster::coordinator_elected(const EtcdMembership::Coordinator& elected) {
  if (stopped_ || elected.term <= term_) return;
  if (elected.node < 0 || elected.node >= config_.node_count) {
    PX_LOG_WARN("cluster '%s': etcd names node %d coordinator, outside 0..%d; ignored",
                config_.cluster.c_str(), elected.node, config_.node_count - 1);
    return;
  }
  int previous = coordinator_node_;
  bool had_one = term_ != 0;
  bool same = had_one && elected.node == coordinator_node_ &&
              elected.address == hosts_[static_cast<size_t>(elected.node)];
  term_ = elected.term;
  if (same && (coordinator_ || (coordinator_link_ && coordinator_link_->connected))) {
    // The same coordinator under a new term: its lease expired while etcd was unreachable and
    // it took its key again. Nothing changes but the term.
    PX_LOG_INFO("cluster '%s': %s coordinates again, now under term %lld", config_.cluster.c_str(),
                node_label(elected.node).c_str(), static_cast<long long>(elected.term));
    return;
  }
  if (elected.node == config_.node_index && !elected.mine)
    // etcd names this node's index, under another daemon's lease: two daemons hold the index.
    return events_.fatal("etcd names node " + std::to_string(elected.node) + " at " +
                         elected.address +
                         " coordinator under another daemon's lease: two daemons hold index " +
                         std::to_string(elected.node));
  if (coordinator_ && elected.node != config_.node_index)
    // Another node won a newer term while this one could not renew its lease: it may no
    // longer act for the cluster. Its daemon stops; restarted, it joins as a member.
    return events_.fatal("node " + std::to_string(elected.node) + " at " + elected.address +
                         " was elected coordinator (term " + std::to_string(elected.term) +
                         ") while this one could not renew its lease in etcd");
  coordinator_node_ = elected.node;
  hosts_[static_cast<size_t>(elected.node)] = elected.address;
  if (coordinator_link_) {  // following an earlier coordinator: leave it
    Connection& old = *coordinator_link_;
    coordinator_link_ = nullptr;
    close_connection(old);
    membership_->set_campaigning(true);  // until the new one's address table arrives
    if (ready_ && !rejoining_) {
      rejoining_ = true;
      events_.node_lost(previous, node_label(previous) + " (the coordinator) was replaced by " +
                                      node_label(elected.node) + " in etcd's election");
    }
  }
  PX_LOG_INFO("cluster '%s': coordinator is %s, term %lld%s", config_.cluster.c_str(),
              node_label(elected.node).c_str(), static_cast<long long>(elected.term),
              had_one ? " (a new election)" : "");
  if (elected.node == config_.node_index) return become_coordinator();
  uv_timer_stop(&retry_timer_);
  connect_to_coordinator();
}

void Cluster::become_coordinator() {
  coordinator_ = true;
  node_links_.assign(static_cast<size_t>(config_.node_count), nullptr);
  fabric_addresses_.assign(static_cast<size_t>(config_.node_count), "");
  fabric_addresses_[static_cast<size_t>(config_.node_index)] = fabric_.address();
  joined_ = 1;
  highest_join_epoch_ = epoch_;
  std::string error;
  if (!listening_ && !listen(&error)) return events_.fatal(error);
  PX_LOG_INFO("coordinator of cluster '%s' (term %lld): waiting for %d nodes on %s",
              config_.cluster.c_str(), static_cast<long long>(term_), config_.node_count,
              config_.listen.c_str());
  // Taking over a formed cluster: the lost coordinator's node will not join.
  if (epoch_ > 0) want_reform();
}

void Cluster::on_form_timer(uv_timer_t* timer) {
  static_cast<Cluster*>(timer->data)->try_form();
}

// --- member ----------------------------------------------------------------------------

void Cluster::connect_to_coordinator() {
  if (membership_ && term_ == 0) return;  // none elected yet: coordinator_elected connects
  sockaddr_storage addr{};
  std::string error;
  const std::string& host = hosts_[static_cast<size_t>(coordinator_node_)];
  if (!cluster_detail::resolve(host, &addr, &error)) return events_.fatal(error);
  connections_.push_back(std::make_unique<Connection>(this, config_.cluster));
  Connection& c = *connections_.back();
  c.node = coordinator_node_;
  coordinator_link_ = &c;
  uv_tcp_init(loop_, &c.tcp);
  c.tcp.data = &c;
  c.connect.data = &c;
  int rc = uv_tcp_connect(&c.connect, &c.tcp, reinterpret_cast<sockaddr*>(&addr), on_connected);
  if (rc != 0) {
    close_connection(c);
    coordinator_link_ = nullptr;
    uv_timer_start(&retry_timer_, on_retry_timer, 200, 0);
  }
}

void Cluster::on_retry_timer(uv_timer_t* timer) {
  auto* self = static_cast<Cluster*>(timer->data);
  if (!self->stopped_ && !self->coordinator_ && !self->coordinator_link_ &&
      (!self->ready_ || self->rejoining_) && !self->rejected_)
    self->connect_to_coordinator();
}

void Cluster::on_connected(uv_connect_t* request, int status) {
  auto* c = static_cast<Connection*>(request->data);
  Cluster* self = c->cluster;
  // A connection left for a newer coordinator (coordinator_elected) ends here, cancelled.
  if (self->stopped_ || c != self->coordinator_link_ || c->closing) return;
  if (status < 0) {
    // The coordinator may not be up yet: retry until the start-up deadline (with membership
    // on etcd, this node may stand for election meanwhile: it has no coordinator).
    self->close_connection(*c);
    self->coordinator_link_ = nullptr;
    if (self->membership_) self->membership_->set_campaigning(true);
    uv_timer_start(&self->retry_timer_, on_retry_timer, 200, 0);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  self->connected(*c);
  self->start_reading(*c);
  // With a cluster secret the Join answers the coordinator's Challenge (member_handle).
  if (self->config_.secret.empty()) self->send_join(*c, "");
}

void Cluster::send_join(Connection& c, const std::string& challenge) {
  if (!config_.secret.empty()) c.nonce = auth_nonce();
  auto message = build(config_.cluster, epoch_, [&](Envelope::Body::Builder b) {
    auto join = b.initJoin();
    auto index = static_cast<uint32_t>(config_.node_index);
    auto count = static_cast<uint32_t>(config_.node_count);
    join.setNodeIndex(index);
    join.setNodeCount(count);
    const std::string& a = fabric_.address();
    join.setFabricAddress(kj::arrayPtr(reinterpret_cast<const kj::byte*>(a.data()), a.size()));
    join.setFabricProvider(fabric_.provider_name());
    join.setHost(membership_             ? config_.listen
                 : config_.nodes.empty() ? ""
                                         : config_.nodes[static_cast<size_t>(config_.node_index)]);
    if (!config_.secret.empty()) {
      std::string mac =
          auth_mac(config_.secret, "join", config_.cluster, challenge, c.nonce, index, count);
      join.setNonce(
          kj::arrayPtr(reinterpret_cast<const kj::byte*>(c.nonce.data()), c.nonce.size()));
      join.setAuth(kj::arrayPtr(reinterpret_cast<const kj::byte*>(mac.data()), mac.size()));
    }
  });
  write(c, frame_envelope(*message));
}

void Cluster::member_handle(Envelope::Reader envelope) {
  auto body = envelope.getBody();
  auto which = body.which();
  Connection* link = coordinator_link_;
  if (!coordinator_ && !config_.secret.empty() && link) {
    if (which == Envelope::Body::CHALLENGE) {
      auto nonce = body.getChallenge().getNonce();
      if (!link->nonce.empty() || nonce.size() != kAuthNonceBytes)
        return events_.fatal("the coordinator at " + coordinator_host() +
                             " sent a malformed challenge");
      link->peer_nonce.assign(reinterpret_cast<const char*>(nonce.begin()), nonce.size());
      return send_join(*link, link->peer_nonce);
    }
    if (which == Envelope::Body::AUTH_PROOF) {
      auto auth = body.getAuthProof().getAuth();
      std::string got(reinterpret_cast<const char*>(auth.begin()), auth.size());
      std::string want =
          auth_mac(config_.secret, "coordinator", config_.cluster, link->nonce, link->peer_nonce);
      if (link->nonce.empty() || !auth_equal(got, want))
        return events_.fatal("the coordinator at " + coordinator_host() + " (" + link->peer +
                             ") failed authentication: it does not hold this cluster's secret");
      link->proven = true;
      PX_LOG_INFO("cluster '%s': the coordinator at %s proved it holds the cluster secret",
                  config_.cluster.c_str(), link->peer.c_str());
      return;
    }
    // Only a refusal and heartbeats may come before the proof: nothing an impostor says is
    // acted on.
    if (!link->proven && which != Envelope::Body::REJECT && which != Envelope::Body::HEARTBEAT)
      return events_.fatal("the coordinator at " + coordinator_host() + " (" + link->peer +
                           ") sent a message before proving it holds the cluster secret");
  }
  switch (which) {
    case Envelope::Body::REJECT:
      if (rejoining_) {
        // Most likely the coordinator has not yet noticed this node's previous connection
        // close (its index still looks taken): the connection closes next, and this node
        // tries again.
        PX_LOG_WARN("cluster: the coordinator refused this node's rejoin (%s); trying again",
                    body.getReject().getReason().cStr());
        return;
      }
      rejected_ = true;  // its connection closes next: do not try again
      return events_.fatal(std::string("the coordinator refused this node: ") +
                           body.getReject().getReason().cStr());
    case Envelope::Body::HEARTBEAT:
      return;  // it arrived: that was its whole point
    case Envelope::Body::ADDRESS_TABLE: {
      // The first formation, or a re-formation: a higher epoch than the one this node is in.
      uint64_t epoch = envelope.getEpoch();
      if (ready_ && epoch <= epoch_) return;
      auto table = body.getAddressTable();
      std::vector<std::string> addresses;
      for (auto a : table.getFabricAddresses())
        addresses.emplace_back(reinterpret_cast<const char*>(a.begin()), a.size());
      std::vector<int> roster;
      for (auto node : table.getNodes()) roster.push_back(static_cast<int>(node));
      if (roster.empty())
        for (size_t i = 0; i < addresses.size(); ++i) roster.push_back(static_cast<int>(i));
      std::string error =
          roster_error(roster, addresses.size(), table.getHosts().size(), config_.node_count);
      if (error.empty() && !membership_ && static_cast<int>(roster.size()) != config_.node_count)
        error = std::to_string(roster.size()) + " nodes";
      int rank = static_cast<int>(std::find(roster.begin(), roster.end(), config_.node_index) -
                                  roster.begin());
      if (error.empty() && rank == static_cast<int>(roster.size()))
        error = "node " + std::to_string(config_.node_index) + " (this one) is not in it";
      if (!error.empty()) return events_.fatal("bad address table from the coordinator: " + error);
      auto hosts = table.getHosts();
      for (size_t i = 0; i < roster.size(); ++i) {
        std::string& host = hosts_[static_cast<size_t>(roster[i])];
        // With membership on etcd a node index changes hands (a replacement takes it).
        if (host.empty() || (membership_ && hosts[static_cast<unsigned>(i)].size() > 0))
          host = hosts[static_cast<unsigned>(i)];
      }
      bool reform = ready_;
      if (reform && roster != roster_) {
        // Nodes joined (or left without a NodeLost reaching this node): every job of the
        // earlier epoch fails here too, as it does on a loss, before the fabric changes.
        std::string joined;
        for (int node : roster)
          if (std::find(roster_.begin(), roster_.end(), node) == roster_.end())
            joined += (joined.empty() ? "" : ", ") + node_label(node);
        bool none_gone = std::all_of(roster_.begin(), roster_.end(), [&](int node) {
          return std::find(roster.begin(), roster.end(), node) != roster.end();
        });
        std::string why = "cluster '" + config_.cluster + "' re-forms on " +
                          std::to_string(roster.size()) + " nodes" +
                          (joined.empty() ? "" : " (" + joined + " joined)") +
                          ": every job of epoch " + std::to_string(epoch_) + " ends";
        if (none_gone && !joined.empty() && events_.nodes_joined)
          events_.nodes_joined(why);  // PX_ERR_MEMBERSHIP: the jobs' workers connect again
        else
          events_.node_lost(-1, why);
      }
      if (reform ? !fabric_.reset_peers(addresses, rank, &error)
                 : !fabric_.set_peers(addresses, rank, &error))
        return events_.fatal("bad address table from the coordinator: " + error);
      roster_ = std::move(roster);
      rank_ = rank;
      epoch_ = epoch;
      rejoining_ = false;
      // A member following a formed cluster does not stand for election (set_campaigning).
      if (membership_ && !coordinator_) membership_->set_campaigning(false);
      if (reform) {
        PX_LOG_INFO(
            "cluster '%s' re-formed under epoch %llu: %d of %d nodes, this is %s (rank %d); new "
            "jobs run",
            config_.cluster.c_str(), static_cast<unsigned long long>(epoch_), size(),
            config_.node_count, node_label(config_.node_index).c_str(), rank_);
        return events_.reformed(epoch_);
      }
      fabric_.start();
      ready_ = true;
      uv_timer_stop(&startup_timer_);
      PX_LOG_INFO("cluster '%s' ready: %d nodes, this is %s, fabric provider %s, fabric address %s",
                  config_.cluster.c_str(), size(), node_label(config_.node_index).c_str(),
                  fabric_.provider_name().c_str(), fabric_.address_text().c_str());
      return events_.ready();
    }
    case Envelope::Body::JOB_WORLD: {
      std::vector<uint32_t> sizes;
      for (auto s : body.getJobWorld().getLocalSizes()) sizes.push_back(s);
      if (static_cast<int>(sizes.size()) != size()) {  // not this epoch's: no job runs on it
        PX_LOG_WARN("cluster: a JobWorld of job '%s' for %zu nodes in an epoch of %d; ignored",
                    body.getJobWorld().getJob().cStr(), sizes.size(), size());
        return;
      }
      return events_.job_world(body.getJobWorld().getJob(), sizes,
                               body.getJobWorld().getBarrierId(),
                               body.getJobWorld().getDeviceRoutes());
    }
    case Envelope::Body::VAR_READY:
      return events_.var_ready(body.getVarReady().getJob(), body.getVarReady().getName(),
                               body.getVarReady().getGlobalId());
    case Envelope::Body::VAR_MISMATCH:
      return events_.var_mismatch(body.getVarMismatch().getJob(), body.getVarMismatch().getName(),
                                  body.getVarMismatch().getMessage());
    case Envelope::Body::NODE_LOST:
      return events_.node_lost(static_cast<int>(body.getNodeLost().getNodeIndex()),
                               body.getNodeLost().getReason());
    case Envelope::Body::JOB_BROKEN: {
      auto broken = body.getJobBroken();
      return events_.job_broken(broken.getJob(), broken.getBarrierId(),
                                static_cast<int>(broken.getNodeIndex()), broken.getReason(),
                                broken.getClean());
    }
    case Envelope::Body::JOB_END:
      return events_.job_end(body.getJobEnd().getJob(), body.getJobEnd().getBarrierId());
    case Envelope::Body::DEVICE_ROUTE:
    case Envelope::Body::NCCL_TURN:
      return member_device_route(envelope);
    default:
      PX_LOG_WARN("cluster: unexpected message from the coordinator");
  }
}

// --- both --------------------------------------------------------------------------------

void Cluster::join_job(const std::string& job, uint32_t local_size, bool nccl) {
  report([&](Envelope::Body::Builder b) {
    auto j = b.initJobJoin();
    j.setJob(job);
    j.setLocalSize(local_size);
    j.setNccl(nccl);
    j.setNodeIndex(static_cast<uint32_t>(config_.node_index));
  });
}

void Cluster::register_var(const std::string& job, const std::string& var,
                           const Fingerprint& fingerprint) {
  report([&](Envelope::Body::Builder b) {
    auto r = b.initRegisterVar();
    r.setJob(job);
    r.setName(var);
    r.setDtype(static_cast<uint32_t>(fingerprint.dtype));
    r.setCount(fingerprint.count);
    r.setOp(static_cast<uint32_t>(fingerprint.op));
    r.setSparse(fingerprint.sparse);
    r.setDim(fingerprint.dim);
    r.setOptions(fingerprint.options);
    r.setNodeIndex(static_cast<uint32_t>(config_.node_index));
  });
}

void Cluster::report_job_broken(const std::string& job, uint32_t barrier_id, const std::string& why,
                                bool clean) {
  report([&](Envelope::Body::Builder b) {
    auto broken = b.initJobBroken();
    broken.setJob(job);
    broken.setBarrierId(barrier_id);
    broken.setNodeIndex(static_cast<uint32_t>(config_.node_index));
    broken.setReason(why);
    broken.setClean(clean);
  });
}

void Cluster::report_job_left(const std::string& job, uint32_t barrier_id) {
  report([&](Envelope::Body::Builder b) {
    auto left = b.initJobLeft();
    left.setJob(job);
    left.setBarrierId(barrier_id);
    left.setNodeIndex(static_cast<uint32_t>(config_.node_index));
  });
}

void Cluster::report(const std::function<void(Envelope::Body::Builder)>& fill) {
  auto message = build(config_.cluster, epoch_, fill);
  if (coordinator_)
    return coordinator_handle(coordinator_node_, message->getRoot<Envelope>().asReader());
  send_to_coordinator(frame_envelope(*message));
}

void Cluster::send_to_coordinator(const std::string& frame) {
  if (coordinator_link_) write(*coordinator_link_, frame);
}

void Cluster::write(Connection& c, const std::string& frame, bool close_after) {
  if (c.closing) return;
  auto* w = new WriteRequest{};
  w->data = frame;
  w->request.data = w;
  // libuv runs this callback (ECANCELED at worst) before the handle's close callback frees
  // the connection, so c is still there.
  if (close_after) w->done = [this, &c] { close_connection(c); };
  uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  int rc = uv_write(&w->request, reinterpret_cast<uv_stream_t*>(&c.tcp), &buf, 1,
                    [](uv_write_t* request, int) {
                      auto* done = static_cast<WriteRequest*>(request->data);
                      if (done->done) done->done();
                      delete done;
                    });
  if (rc != 0) {
    delete w;
    if (close_after) close_connection(c);
  }
}

void Cluster::finish(Connection& c, const std::string& frame) {
  if (c.closing || c.finishing) return;
  c.finishing = true;
  c.finishing_since = uv_now(loop_);
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
  write(c, frame, true);
}

void Cluster::start_reading(Connection& c) {
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c.tcp),
      [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
        buf->base = static_cast<char*>(malloc(suggested));
        buf->len = buf->base ? suggested : 0;
      },
      [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
        auto* c = static_cast<Connection*>(stream->data);
        Cluster* self = c->cluster;
        if (n < 0) {
          free(buf->base);
          std::string why = n == UV_EOF         ? "connection closed"
                            : n == UV_ETIMEDOUT ? self->timeout_reason()
                                                : uv_strerror(static_cast<int>(n));
          return self->lost_connection(*c, why);
        }
        if (n > 0) c->last_heard = uv_now(self->loop_);  // any bytes, a heartbeat or not
        std::string error;
        bool ok = c->reader.feed(
            buf->base, static_cast<size_t>(n),
            [&](Envelope::Reader envelope) {
              if (c->closing || c->finishing) return;
              if (self->coordinator_) {
                self->coordinator_receive(*c, envelope);
              } else {
                self->member_handle(envelope);
              }
            },
            &error);
        free(buf->base);
        if (!ok && !c->closing && !c->finishing) {
          // A newcomer that cannot even speak the protocol is refused alone; a node of the
          // cluster that breaks it is lost.
          if (self->coordinator_ && c->node < 0)
            return self->refuse(
                *c, "no valid message",
                "refused by the coordinator of cluster '" + self->config_.cluster + "': " + error);
          PX_LOG_WARN_AT(peer_fields(c->node), "cluster: dropping the connection from %s (%s): %s",
                         self->node_label(c->node).c_str(), c->peer.c_str(), error.c_str());
          self->lost_connection(*c, "sent a bad message: " + error);
        }
      });
}

void Cluster::lost_connection(Connection& c, const std::string& why, bool tell_it) {
  if (c.closing || c.finishing) return;
  int node = c.node;
  if (stopped_) return close_connection(c);
  if (coordinator_) {
    if (node < 0) return close_connection(c);
    node_links_[static_cast<size_t>(node)] = nullptr;
    if (!ready_) {  // a node left during rendezvous: it may come back before the deadline
      close_connection(c);
      --joined_;
      PX_LOG_WARN_AT(peer_fields(node), "cluster: %s left before the cluster formed: %s",
                     node_label(node).c_str(), why.c_str());
      return;
    }
    --joined_;  // its index is free: the node may rejoin (handle_join)
    std::string reason = node_label(node) + " lost: its parallaxd " + why;
    auto message = build(config_.cluster, epoch_, [&](Envelope::Body::Builder b) {
      auto lost = b.initNodeLost();
      lost.setNodeIndex(static_cast<uint32_t>(node));
      lost.setReason(reason);
    });
    std::string frame = frame_envelope(*message);
    // A stopped daemon reads this when it runs again, so its own workers learn why.
    if (tell_it) {
      finish(c, frame);
    } else {
      close_connection(c);
    }
    broadcast(frame);
    member_handle(message->getRoot<Envelope>().asReader());
    if (membership_) want_reform();  // on the survivors, if there are enough
    return;
  }
  close_connection(c);
  coordinator_link_ = nullptr;
  if (membership_) membership_->set_campaigning(true);
  if (ready_ && !rejoining_) {
    // The coordinator (restarted) or, if only this node was cut off, the running one takes
    // this node back: it keeps trying to join, and the cluster re-forms once every node has.
    rejoining_ = true;
    PX_LOG_INFO("cluster '%s': rejoining through the coordinator at %s", config_.cluster.c_str(),
                coordinator_host().c_str());
    events_.node_lost(coordinator_node_, node_label(coordinator_node_) +
                                             " (the coordinator) lost: its parallaxd " + why);
  }
  if (!rejected_ && !stopped_) uv_timer_start(&retry_timer_, on_retry_timer, 200, 0);
}

void Cluster::close_connection(Connection& c) {
  if (c.closing) return;
  c.closing = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), [](uv_handle_t* handle) {
    auto* conn = static_cast<Connection*>(handle->data);
    auto& list = conn->cluster->connections_;
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (it->get() == conn) {
        list.erase(it);
        return;
      }
    }
  });
}

void Cluster::on_startup_deadline(uv_timer_t* timer) {
  auto* self = static_cast<Cluster*>(timer->data);
  if (self->ready_) return;
  std::string seconds = std::to_string(self->config_.startup_timeout_ms) + " ms";
  if (self->membership_ && self->term_ == 0)
    return self->events_.fatal("no coordinator elected within " + seconds + " on " +
                               self->membership_->describe());
  if (self->coordinator_) {
    std::string missing;
    for (int node = 0; node < self->config_.node_count; ++node)
      if (node != self->coordinator_node_ && !self->node_links_[static_cast<size_t>(node)])
        missing += (missing.empty() ? "" : ", ") + self->node_label(node);
    return self->abort_rendezvous("nodes missing after " + seconds + ": " + missing);
  }
  Connection* link = self->coordinator_link_;
  if (!self->config_.secret.empty() && link && link->connected && link->nonce.empty())
    return self->events_.fatal("no authentication challenge from the coordinator at " +
                               self->coordinator_host() + " within " + seconds +
                               " (does node 0 have the cluster secret, secret_file?)");
  self->events_.fatal("no address table from the coordinator at " + self->coordinator_host() +
                      " within " + seconds + " (is " + self->node_label(self->coordinator_node_) +
                      " running, with the same cluster name?)");
}

}  // namespace px