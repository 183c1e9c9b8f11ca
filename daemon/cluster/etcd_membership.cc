#include "daemon/cluster/etcd_membership.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "daemon/common/log.h"

namespace px {

namespace {

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "<node> <address>" of the coordinator key.
bool parse_coordinator(const EtcdClient::KeyValue& kv, EtcdMembership::Coordinator* c) {
  size_t space = kv.value.find(' ');
  if (space == std::string::npos) return false;
  try {
    c->node = std::stoi(kv.value.substr(0, space));
  } catch (...) {
    return false;
  }
  c->address = kv.value.substr(space + 1);
  c->term = kv.create_revision;
  return c->node >= 0;
}

}  // namespace

EtcdMembership::EtcdMembership(const Settings& settings, MembershipUrl url)
    : settings_(settings),
      url_(std::move(url)),
      // One HTTP call may take a third of a lease: a keep-alive that waited that long still
      // renews in time.
      client_(url_.endpoints, std::max<int64_t>(200, settings.lease_s * 1000 / 3)) {
  std::string endpoints;
  for (const auto& e : url_.endpoints) endpoints += (endpoints.empty() ? "" : ",") + e;
  description_ = "etcd " + endpoints + " (prefix " + url_.prefix + ")";
}

std::unique_ptr<EtcdMembership> EtcdMembership::register_node(const Settings& settings,
                                                              int* node_index, std::string* error) {
  MembershipUrl url;
  if (!parse_membership_url(settings.url, &url, error)) return nullptr;
  std::unique_ptr<EtcdMembership> m(new EtcdMembership(settings, url));
  if (!m->client_.grant_lease(settings.lease_s, &m->lease_, error)) {
    *error = "membership: cannot reach etcd at " + settings.url + ": " + *error;
    return nullptr;
  }
  m->last_keepalive_ms_ = steady_ms();
  int64_t deadline = steady_ms() + settings.startup_timeout_ms;
  bool waited = false;
  while (!m->claim_index(error)) {
    if (!error->empty()) return nullptr;
    if (!waited)
      PX_LOG_WARN(
          "membership: all %d node indices under %s are held; waiting for one to be freed "
          "(a lost daemon's index frees when its lease expires)",
          settings.node_count, url.prefix.c_str());
    waited = true;
    // The handled signals are blocked until the daemon runs (main.cc): a stop asked for
    // while waiting here ends the wait.
    sigset_t pending;
    if (sigpending(&pending) == 0 &&
        (sigismember(&pending, SIGTERM) || sigismember(&pending, SIGINT))) {
      *error = "membership: stopped while waiting for a free node index";
      return nullptr;
    }
    if (steady_ms() > deadline) {
      *error = "membership: all " + std::to_string(settings.node_count) + " node indices under " +
               url.prefix + " in etcd stayed held for " +
               std::to_string(settings.startup_timeout_ms) +
               " ms: the cluster is full (node_count, or membership_max_nodes)";
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    m->keep_lease(steady_ms());
  }
  *node_index = m->node_;
  PX_LOG_INFO("membership: node index %d assigned by %s", m->node_, m->describe().c_str());
  m->thread_ = std::thread([raw = m.get()] { raw->run(); });
  return m;
}

// Leaves error empty when every index is held (wait and try again).
bool EtcdMembership::claim_index(std::string* error) {
  error->clear();
  for (int i = 0; i < settings_.node_count; ++i) {
    bool created = false;
    EtcdClient::KeyValue holder;
    std::string key = url_.prefix + "/nodes/" + std::to_string(i);
    if (!client_.create(key, settings_.address, lease_, &created, &holder, error)) {
      *error = "membership: cannot reach etcd at " + settings_.url + ": " + *error;
      return false;
    }
    if (created) {
      node_ = i;
      node_key_confirmed_ = true;
      return true;
    }
  }
  return false;
}

EtcdMembership::~EtcdMembership() {
  halt_thread();
  // A daemon that stops before its cluster started (a refused start) frees its index too.
  std::string error;
  if (lease_ != 0) client_.revoke_lease(lease_, &error);
}

void EtcdMembership::halt_thread() {
  {
    std::lock_guard<std::mutex> lock(mu_);  // the thread checks under mu_: no lost wake-up
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string EtcdMembership::describe() const {
  return description_;
}

void EtcdMembership::start(uv_loop_t* loop, std::function<void(const Coordinator&)> on_coordinator,
                           std::function<void(const std::string&)> on_fatal) {
  on_coordinator_ = std::move(on_coordinator);
  on_fatal_ = std::move(on_fatal);
  uv_async_init(loop, &async_, [](uv_async_t* async) {
    auto* self = static_cast<EtcdMembership*>(async->data);
    Coordinator c;
    bool has = false;
    std::string fatal;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      has = self->has_pending_;
      c = self->pending_;
      self->has_pending_ = false;
      fatal = self->fatal_;
    }
    if (!fatal.empty()) return self->on_fatal_(fatal);
    if (has) self->on_coordinator_(c);
  });
  async_.data = this;
  async_open_ = true;
  bool fatal_waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    following_ = true;
    fatal_waiting = !fatal_.empty();  // failed before there was a loop to tell
  }
  if (fatal_waiting) uv_async_send(&async_);
  wake_.notify_all();
}

bool EtcdMembership::holds(int64_t term) const {
  std::lock_guard<std::mutex> lock(mu_);
  return term != 0 && held_term_ == term &&
         steady_ms() - held_confirmed_ms_ < settings_.lease_s * 1000 / 2;
}

void EtcdMembership::stop() {
  halt_thread();
  if (async_open_) uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
  async_open_ = false;
  std::string error;
  if (lease_ != 0 && !client_.revoke_lease(lease_, &error))
    PX_LOG_WARN("membership: could not revoke this node's lease (it expires in %lld s): %s",
                static_cast<long long>(settings_.lease_s), error.c_str());
  lease_ = 0;
}

void EtcdMembership::post(const Coordinator& c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = c;
    has_pending_ = true;
  }
  uv_async_send(&async_);
}

void EtcdMembership::keep_lease(int64_t now_ms) {
  if (now_ms - last_keepalive_ms_ < settings_.lease_s * 1000 / 3) return;
  bool alive = false;
  std::string error;
  if (!client_.keep_alive(lease_, &alive, &error)) {
    if (!etcd_down_)
      PX_LOG_WARN("membership: etcd unreachable (%s); running jobs go on, joins wait for it",
                  error.c_str());
    etcd_down_ = true;
    return;
  }
  if (etcd_down_) PX_LOG_INFO("membership: etcd answers again (%s)", describe().c_str());
  etcd_down_ = false;
  last_keepalive_ms_ = now_ms;
  if (alive) return;
  // The lease expired while etcd was out of reach: this node's index and any coordinator key
  // went with it. Take a new lease and the same index back, unless another daemon has it.
  PX_LOG_WARN("membership: this node's lease expired while etcd was unreachable; renewing");
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_term_ = 0;
  }
  if (!client_.grant_lease(settings_.lease_s, &lease_, &error)) return;
  node_key_confirmed_ = false;  // ensure_node_key creates it again under the new lease
}

void EtcdMembership::ensure_node_key() {
  if (node_key_confirmed_) return;
  bool created = false;
  EtcdClient::KeyValue holder;
  std::string error;
  std::string key = url_.prefix + "/nodes/" + std::to_string(node_);
  // Not answered: tried again next tick (a node key missing in etcd would let another
  // daemon take this index).
  if (!client_.create(key, settings_.address, lease_, &created, &holder, &error)) return;
  if (created || holder.lease == lease_) {
    node_key_confirmed_ = true;
    return;
  }
  if (holder.create_revision == 0) return;  // gone between compare and read: again
  fail("membership: node index " + std::to_string(node_) + " went to the daemon at " +
       holder.value + " while this one could not reach etcd");
}

void EtcdMembership::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_.empty()) return;
    fatal_ = why;
  }
  if (async_open_) uv_async_send(&async_);
}

void EtcdMembership::follow_coordinator(int64_t now_ms) {
  std::string key = url_.prefix + "/coordinator";
  bool found = false;
  EtcdClient::KeyValue kv;
  std::string error;
  if (!client_.get(key, &found, &kv, &error)) return;  // keep_lease logs the outage
  if (!found) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_term_ = 0;  // whatever term this node held is over
    }
    if (!may_campaign_) return;
    bool created = false;
    std::string value = std::to_string(node_) + " " + settings_.address;
    if (!client_.create(key, value, lease_, &created, &kv, &error) || kv.create_revision == 0)
      return;
    if (created)
      PX_LOG_INFO("membership: this node won the coordinator's election (term %lld)",
                  static_cast<long long>(kv.create_revision));
  }
  Coordinator c;
  if (!parse_coordinator(kv, &c)) {
    PX_LOG_WARN("membership: a malformed coordinator key in etcd ('%s'); ignored",
                kv.value.c_str());
    return;
  }
  c.mine = c.node == node_ && kv.lease == lease_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (c.mine) {
      held_term_ = c.term;
      // The lease lives at least a lease past the last renewal etcd accepted (its send
      // time): holds() trusts half of that.
      held_confirmed_ms_ = std::min(now_ms, last_keepalive_ms_);
    } else {
      held_term_ = 0;
    }
  }
  if (c.term != seen_.term) {
    seen_ = c;
    post(c);
  }
  if (c.mine) read_registered(now_ms);
}

void EtcdMembership::read_registered(int64_t now_ms) {
  std::vector<EtcdClient::KeyValue> kvs;
  std::string error, prefix = url_.prefix + "/nodes/";
  if (!client_.range(prefix, &kvs, &error)) return;  // keep_lease logs an outage
  std::vector<int> nodes;
  for (const auto& kv : kvs) {
    std::string index = kv.key.substr(prefix.size());
    char* end = nullptr;
    long i = std::strtol(index.c_str(), &end, 10);
    if (!index.empty() && *end == '\0' && i >= 0 && i < settings_.node_count)
      nodes.push_back(static_cast<int>(i));
  }
  std::sort(nodes.begin(), nodes.end());
  std::lock_guard<std::mutex> lock(mu_);
  registered_ = std::move(nodes);
  registered_ms_ = now_ms;
}

int64_t EtcdMembership::now_ms() {
  return steady_ms();
}

bool EtcdMembership::registered(int64_t since_ms, std::vector<int>* nodes) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (registered_ms_ < since_ms) return false;
  *nodes = registered_;
  return true;
}

void EtcdMembership::run() {
  // Often enough that a new coordinator is found a fraction of a lease after the old one's
  // expired, and that holds() stays confirmed between polls.
  auto period = std::chrono::milliseconds(std::min<int64_t>(250, settings_.lease_s * 1000 / 4));
  while (!stopping_) {
    int64_t now = steady_ms();
    keep_lease(now);
    if (!etcd_down_) ensure_node_key();
    bool following;
    {
      std::lock_guard<std::mutex> lock(mu_);
      following = following_;
    }
    if (following && !etcd_down_) follow_coordinator(now);
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, period, [this] { return stopping_.load(); });
  }
}

}  // namespace px
