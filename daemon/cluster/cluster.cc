#include "daemon/cluster/cluster.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "daemon/common/log.h"

namespace px {

struct Cluster::Connection {
  Connection(Cluster* owner, const std::string& cluster_name)
      : cluster(owner), reader(cluster_name) {}
  Cluster* cluster;
  uv_tcp_t tcp{};
  EnvelopeReader reader;
  int node = -1;  // set once its Join is accepted (coordinator side) / 0 (member side)
  bool closing = false;
};

namespace {

struct WriteRequest {
  uv_write_t request;
  std::string data;
};

// "host:port" -> sockaddr (resolved once, at start-up).
bool resolve(const std::string& endpoint, sockaddr_storage* out, std::string* error) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    *error = "'" + endpoint + "' is not host:port";
    return false;
  }
  std::string host = endpoint.substr(0, colon), port = endpoint.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || !result) {
    *error = "cannot resolve '" + endpoint + "': " + gai_strerror(rc);
    return false;
  }
  std::memcpy(out, result->ai_addr, result->ai_addrlen);
  freeaddrinfo(result);
  return true;
}

using Fill = std::function<void(Envelope::Body::Builder)>;

std::unique_ptr<capnp::MallocMessageBuilder> build(const std::string& cluster, const Fill& fill) {
  auto message = std::make_unique<capnp::MallocMessageBuilder>();
  Envelope::Builder envelope = message->initRoot<Envelope>();
  envelope.setProtocolVersion(kClusterProtocolVersion);
  envelope.setEpoch(kClusterEpoch);
  envelope.setCluster(cluster);
  fill(envelope.getBody());
  return message;
}

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

Cluster::Cluster(uv_loop_t* loop, const DaemonConfig& config, FabricEndpoint& fabric, Events events)
    : loop_(loop), config_(config), fabric_(fabric), events_(std::move(events)) {
  coordinator_ = config_.node_index == 0;
  hosts_ = config_.nodes;
  if (hosts_.empty()) {
    hosts_.assign(static_cast<size_t>(config_.node_count), "");
    hosts_[0] = config_.coordinator;
  }
  node_links_.assign(static_cast<size_t>(config_.node_count), nullptr);
  fabric_addresses_.assign(static_cast<size_t>(config_.node_count), "");
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
  if (listening_) uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
  listening_ = false;
  for (auto& c : connections_) close_connection(*c);
}

// --- coordinator -----------------------------------------------------------------------

bool Cluster::listen(std::string* error) {
  sockaddr_storage addr{};
  std::string endpoint = config_.listen.empty() ? hosts_[0] : config_.listen;
  if (!resolve(endpoint, &addr, error)) return false;
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
  self->watch_silence(c);
  self->start_reading(c);
}

void Cluster::coordinator_receive(Connection& from, Envelope::Reader envelope) {
  if (envelope.getBody().which() == Envelope::Body::JOIN)
    return handle_join(from, envelope.getBody().getJoin());
  if (from.node < 0) {
    PX_LOG_WARN("cluster: a connection sent a message before joining; dropping it");
    return close_connection(from);
  }
  coordinator_handle(from.node, envelope);
}

void Cluster::handle_join(Connection& from, Join::Reader join) {
  int node = static_cast<int>(join.getNodeIndex());
  std::string host = join.getHost();
  if (static_cast<int>(join.getNodeCount()) != config_.node_count || node <= 0 ||
      node >= config_.node_count) {
    std::string why = "node " + std::to_string(node) + " (" + host + ") expects " +
                      std::to_string(join.getNodeCount()) + " nodes; the coordinator has " +
                      std::to_string(config_.node_count) + " (index must be 1.." +
                      std::to_string(config_.node_count - 1) + ")";
    return abort_rendezvous(why);
  }
  if (node_links_[static_cast<size_t>(node)] || ready_) {
    return abort_rendezvous("two daemons claim node index " + std::to_string(node) + " (" +
                            hosts_[static_cast<size_t>(node)] + " and " + host + ")");
  }
  from.node = node;
  node_links_[static_cast<size_t>(node)] = &from;
  auto address = join.getFabricAddress();
  fabric_addresses_[static_cast<size_t>(node)].assign(
      reinterpret_cast<const char*>(address.begin()), address.size());
  if (hosts_[static_cast<size_t>(node)].empty()) hosts_[static_cast<size_t>(node)] = host;
  ++joined_;
  PX_LOG_INFO("cluster: %s joined (%d of %d)", node_label(node).c_str(), joined_,
              config_.node_count);
  if (joined_ < config_.node_count) return;
  auto message = build(config_.cluster, [&](Envelope::Body::Builder body) {
    auto table = body.initAddressTable();
    auto addresses = table.initFabricAddresses(static_cast<unsigned>(config_.node_count));
    auto hosts = table.initHosts(static_cast<unsigned>(config_.node_count));
    for (int i = 0; i < config_.node_count; ++i) {
      const std::string& a = fabric_addresses_[static_cast<size_t>(i)];
      addresses.set(static_cast<unsigned>(i),
                    kj::arrayPtr(reinterpret_cast<const kj::byte*>(a.data()), a.size()));
      hosts.set(static_cast<unsigned>(i), hosts_[static_cast<size_t>(i)]);
    }
  });
  broadcast(frame_envelope(*message));
  member_handle(message->getRoot<Envelope>().asReader());
}

void Cluster::coordinator_handle(int node, Envelope::Reader envelope) {
  auto body = envelope.getBody();
  switch (body.which()) {
    case Envelope::Body::JOB_JOIN: {
      auto j = body.getJobJoin();
      auto& sizes = job_sizes_[j.getJob()];
      sizes.resize(static_cast<size_t>(config_.node_count));
      sizes[static_cast<size_t>(node)] = j.getLocalSize();
      for (auto& s : sizes)
        if (!s) return;
      auto message = build(config_.cluster, [&](Envelope::Body::Builder b) {
        auto world = b.initJobWorld();
        world.setJob(j.getJob());
        auto list = world.initLocalSizes(static_cast<unsigned>(sizes.size()));
        for (size_t i = 0; i < sizes.size(); ++i) list.set(static_cast<unsigned>(i), *sizes[i]);
        world.setBarrierId(next_global_id_++);
      });
      job_sizes_.erase(std::string(j.getJob()));
      // A new run of the job (every node's workers joined afresh): its variables are
      // agreed on afresh, under new ids.
      std::string job(j.getJob());
      for (auto it = vars_.lower_bound({job, ""}); it != vars_.end() && it->first.first == job;)
        it = vars_.erase(it);
      broadcast(frame_envelope(*message));
      member_handle(message->getRoot<Envelope>().asReader());
      return;
    }
    case Envelope::Body::REGISTER_VAR: {
      auto r = body.getRegisterVar();
      auto key = std::make_pair(std::string(r.getJob()), std::string(r.getName()));
      VarAgreement& agreement = vars_[key];
      agreement.by_node.resize(static_cast<size_t>(config_.node_count));
      Fingerprint fingerprint = read_fingerprint(r);
      auto& mine = agreement.by_node[static_cast<size_t>(node)];
      if (mine && !(*mine == fingerprint)) {
        // The node's own workers disagree: the variable is poisoned there, so everywhere.
        std::string message = "variable '" + key.second + "' of job '" + key.first +
                              "' is registered on " + node_label(node) + " as " +
                              mine->describe_difference(fingerprint) + " and as " +
                              fingerprint.describe_difference(*mine);
        agreement.decided = true;
        announce(agreement, build(config_.cluster, [&](Envelope::Body::Builder b) {
                   auto mismatch = b.initVarMismatch();
                   mismatch.setJob(key.first);
                   mismatch.setName(key.second);
                   mismatch.setMessage(message);
                 }));
        return;
      }
      if (agreement.decided) {
        if (!mine && agreement.verdict) {  // decided before this node registered: tell it
          mine = fingerprint;
          if (node == 0) {
            member_handle(agreement.verdict->getRoot<Envelope>().asReader());
          } else {
            send_to_node(node, frame_envelope(*agreement.verdict));
          }
        }
        return;
      }
      mine = fingerprint;
      for (auto& f : agreement.by_node)
        if (!f) return;
      agreement.decided = true;
      bool same = true;
      std::string shapes;
      for (size_t i = 0; i < agreement.by_node.size(); ++i) {
        same = same && *agreement.by_node[i] == *agreement.by_node[0];
        const Fingerprint& first = *agreement.by_node[0];
        const Fingerprint& f = *agreement.by_node[i];
        shapes +=
            (i ? ", " : "") + node_label(static_cast<int>(i)) + ": " +
            (i == 0 ? f.describe_difference(*agreement.by_node[1]) : f.describe_difference(first));
      }
      auto message = build(config_.cluster, [&](Envelope::Body::Builder b) {
        if (same) {
          auto ready = b.initVarReady();
          ready.setJob(key.first);
          ready.setName(key.second);
          ready.setGlobalId(next_global_id_++);
        } else {
          auto mismatch = b.initVarMismatch();
          mismatch.setJob(key.first);
          mismatch.setName(key.second);
          mismatch.setMessage("variable '" + key.second + "' of job '" + key.first +
                              "' differs across nodes: " + shapes);
        }
      });
      announce(agreement, std::move(message));
      return;
    }
    case Envelope::Body::JOB_BROKEN: {
      if (body.getJobBroken().getNodeIndex() != static_cast<uint32_t>(node)) {
        PX_LOG_WARN("cluster: %s reported a broken job for another node; ignored",
                    node_label(node).c_str());
        return;
      }
      // Relayed as received, to every node but the one it came from.
      capnp::MallocMessageBuilder copy;
      copy.setRoot(envelope);
      std::string frame = frame_envelope(copy);
      for (int other = 1; other < config_.node_count; ++other)
        if (other != node) send_to_node(other, frame);
      if (node != 0) member_handle(envelope);
      return;
    }
    default:
      PX_LOG_WARN("cluster: unexpected message from %s", node_label(node).c_str());
  }
}

void Cluster::announce(VarAgreement& agreement,
                       std::unique_ptr<capnp::MallocMessageBuilder> verdict) {
  agreement.verdict = std::move(verdict);
  broadcast(frame_envelope(*agreement.verdict));
  member_handle(agreement.verdict->getRoot<Envelope>().asReader());
}

void Cluster::send_to_node(int node, const std::string& frame) {
  Connection* c = node_links_[static_cast<size_t>(node)];
  if (c) write(*c, frame);
}

void Cluster::broadcast(const std::string& frame) {
  for (int node = 1; node < config_.node_count; ++node) send_to_node(node, frame);
}

void Cluster::abort_rendezvous(const std::string& why) {
  PX_LOG_ERROR("cluster '%s': %s", config_.cluster.c_str(), why.c_str());
  auto message =
      build(config_.cluster, [&](Envelope::Body::Builder b) { b.initReject().setReason(why); });
  std::string frame = frame_envelope(*message);
  for (auto& c : connections_)
    if (!c->closing) write(*c, frame);
  events_.fatal(why);
}

// --- member ----------------------------------------------------------------------------

void Cluster::connect_to_coordinator() {
  sockaddr_storage addr{};
  std::string error;
  if (!resolve(hosts_[0], &addr, &error)) return events_.fatal(error);
  connections_.push_back(std::make_unique<Connection>(this, config_.cluster));
  Connection& c = *connections_.back();
  c.node = 0;
  coordinator_link_ = &c;
  uv_tcp_init(loop_, &c.tcp);
  c.tcp.data = &c;
  connect_request_.data = this;
  int rc =
      uv_tcp_connect(&connect_request_, &c.tcp, reinterpret_cast<sockaddr*>(&addr), on_connected);
  if (rc != 0) {
    close_connection(c);
    coordinator_link_ = nullptr;
    uv_timer_start(&retry_timer_, on_retry_timer, 200, 0);
  }
}

void Cluster::on_retry_timer(uv_timer_t* timer) {
  auto* self = static_cast<Cluster*>(timer->data);
  if (!self->stopped_ && !self->ready_) self->connect_to_coordinator();
}

void Cluster::on_connected(uv_connect_t* request, int status) {
  auto* self = static_cast<Cluster*>(request->data);
  Connection* c = self->coordinator_link_;
  if (!c || self->stopped_) return;
  if (status < 0) {
    // The coordinator may not be up yet: retry until the start-up deadline.
    self->close_connection(*c);
    self->coordinator_link_ = nullptr;
    uv_timer_start(&self->retry_timer_, on_retry_timer, 200, 0);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  self->watch_silence(*c);
  self->start_reading(*c);
  auto message = build(self->config_.cluster, [&](Envelope::Body::Builder b) {
    auto join = b.initJoin();
    join.setNodeIndex(static_cast<uint32_t>(self->config_.node_index));
    join.setNodeCount(static_cast<uint32_t>(self->config_.node_count));
    const std::string& a = self->fabric_.address();
    join.setFabricAddress(kj::arrayPtr(reinterpret_cast<const kj::byte*>(a.data()), a.size()));
    join.setFabricProvider(self->fabric_.provider_name());
    join.setHost(self->config_.nodes.empty()
                     ? ""
                     : self->config_.nodes[static_cast<size_t>(self->config_.node_index)]);
  });
  self->write(*c, frame_envelope(*message));
}

void Cluster::member_handle(Envelope::Reader envelope) {
  auto body = envelope.getBody();
  switch (body.which()) {
    case Envelope::Body::REJECT:
      return events_.fatal(std::string("the coordinator refused this node: ") +
                           body.getReject().getReason().cStr());
    case Envelope::Body::ADDRESS_TABLE: {
      if (ready_) return;
      auto table = body.getAddressTable();
      std::vector<std::string> addresses;
      for (auto a : table.getFabricAddresses())
        addresses.emplace_back(reinterpret_cast<const char*>(a.begin()), a.size());
      auto hosts = table.getHosts();
      for (unsigned i = 0; i < hosts.size() && i < hosts_.size(); ++i)
        if (hosts_[i].empty()) hosts_[i] = hosts[i];
      std::string error;
      if (static_cast<int>(addresses.size()) != config_.node_count ||
          !fabric_.set_peers(addresses, config_.node_index, &error))
        return events_.fatal("bad address table from the coordinator: " + error);
      fabric_.start();
      ready_ = true;
      uv_timer_stop(&startup_timer_);
      PX_LOG_INFO("cluster '%s' ready: %d nodes, this is %s, fabric provider %s",
                  config_.cluster.c_str(), config_.node_count,
                  node_label(config_.node_index).c_str(), fabric_.provider_name().c_str());
      return events_.ready();
    }
    case Envelope::Body::JOB_WORLD: {
      std::vector<uint32_t> sizes;
      for (auto s : body.getJobWorld().getLocalSizes()) sizes.push_back(s);
      return events_.job_world(body.getJobWorld().getJob(), sizes,
                               body.getJobWorld().getBarrierId());
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
                                static_cast<int>(broken.getNodeIndex()), broken.getReason());
    }
    default:
      PX_LOG_WARN("cluster: unexpected message from the coordinator");
  }
}

// --- both --------------------------------------------------------------------------------

void Cluster::join_job(const std::string& job, uint32_t local_size) {
  auto message = build(config_.cluster, [&](Envelope::Body::Builder b) {
    auto j = b.initJobJoin();
    j.setJob(job);
    j.setLocalSize(local_size);
    j.setNodeIndex(static_cast<uint32_t>(config_.node_index));
  });
  if (coordinator_) return coordinator_handle(0, message->getRoot<Envelope>().asReader());
  send_to_coordinator(frame_envelope(*message));
}

void Cluster::register_var(const std::string& job, const std::string& var,
                           const Fingerprint& fingerprint) {
  auto message = build(config_.cluster, [&](Envelope::Body::Builder b) {
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
  if (coordinator_) return coordinator_handle(0, message->getRoot<Envelope>().asReader());
  send_to_coordinator(frame_envelope(*message));
}

void Cluster::report_job_broken(const std::string& job, uint32_t barrier_id,
                                const std::string& why) {
  auto message = build(config_.cluster, [&](Envelope::Body::Builder b) {
    auto broken = b.initJobBroken();
    broken.setJob(job);
    broken.setBarrierId(barrier_id);
    broken.setNodeIndex(static_cast<uint32_t>(config_.node_index));
    broken.setReason(why);
  });
  if (coordinator_) return coordinator_handle(0, message->getRoot<Envelope>().asReader());
  send_to_coordinator(frame_envelope(*message));
}

void Cluster::send_to_coordinator(const std::string& frame) {
  if (coordinator_link_) write(*coordinator_link_, frame);
}

void Cluster::write(Connection& c, const std::string& frame) {
  if (c.closing) return;
  auto* w = new WriteRequest{};
  w->data = frame;
  w->request.data = w;
  uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  int rc =
      uv_write(&w->request, reinterpret_cast<uv_stream_t*>(&c.tcp), &buf, 1,
               [](uv_write_t* request, int) { delete static_cast<WriteRequest*>(request->data); });
  if (rc != 0) delete w;
}

// A machine that vanishes (power, cable, kernel panic) never closes its connections, and an
// idle control connection would wait for it forever: keep-alive probes after half the
// silence, three more within the other half, and unacknowledged data for no longer than
// the whole, after which the read fails with ETIMEDOUT and the node is lost.
void Cluster::watch_silence(Connection& c) {
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
          std::string why = n == UV_EOF ? "connection closed"
                            : n == UV_ETIMEDOUT
                                ? "control connection went silent for " +
                                      std::to_string(self->config_.peer_silence_ms) +
                                      " ms (machine or network gone)"
                                : uv_strerror(static_cast<int>(n));
          return self->lost_connection(*c, why);
        }
        std::string error;
        bool ok = c->reader.feed(
            buf->base, static_cast<size_t>(n),
            [&](Envelope::Reader envelope) {
              if (c->closing) return;
              if (self->coordinator_) {
                self->coordinator_receive(*c, envelope);
              } else {
                self->member_handle(envelope);
              }
            },
            &error);
        free(buf->base);
        if (!ok) {
          PX_LOG_WARN("cluster: dropping a connection from %s: %s",
                      c->node >= 0 ? self->node_label(c->node).c_str() : "an unjoined peer",
                      error.c_str());
          if (self->coordinator_ && c->node < 0) {
            auto message = build(self->config_.cluster, [&](Envelope::Body::Builder b) {
              b.initReject().setReason("refused by the coordinator of cluster '" +
                                       self->config_.cluster + "': " + error);
            });
            self->write(*c, frame_envelope(*message));
          }
          self->lost_connection(*c, "sent a bad message: " + error);
        }
      });
}

void Cluster::lost_connection(Connection& c, const std::string& why) {
  if (c.closing) return;
  int node = c.node;
  close_connection(c);
  if (stopped_) return;
  if (coordinator_) {
    if (node < 0) return;
    if (!ready_) {  // a node left during rendezvous: it may come back before the deadline
      node_links_[static_cast<size_t>(node)] = nullptr;
      --joined_;
      PX_LOG_WARN("cluster: %s left before the cluster formed: %s", node_label(node).c_str(),
                  why.c_str());
      return;
    }
    node_links_[static_cast<size_t>(node)] = nullptr;
    std::string reason = node_label(node) + " lost: its parallaxd " + why;
    auto message = build(config_.cluster, [&](Envelope::Body::Builder b) {
      auto lost = b.initNodeLost();
      lost.setNodeIndex(static_cast<uint32_t>(node));
      lost.setReason(reason);
    });
    broadcast(frame_envelope(*message));
    member_handle(message->getRoot<Envelope>().asReader());
    return;
  }
  coordinator_link_ = nullptr;
  if (ready_) return events_.node_lost(0, node_label(0) + " (the coordinator) lost: " + why);
  uv_timer_start(&retry_timer_, on_retry_timer, 200, 0);
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
  if (self->coordinator_) {
    std::string missing;
    for (int node = 1; node < self->config_.node_count; ++node)
      if (!self->node_links_[static_cast<size_t>(node)])
        missing += (missing.empty() ? "" : ", ") + self->node_label(node);
    return self->abort_rendezvous("nodes missing after " + seconds + ": " + missing);
  }
  self->events_.fatal("no address table from the coordinator at " + self->hosts_[0] + " within " +
                      seconds + " (is node 0 running, with the same cluster name?)");
}

}  // namespace px
