#include "transport/fabric/fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace px {

struct FabricEndpoint::Op {
  fi_context2 context;  // first: libfabric hands it back as op_context
  bool is_send = false;
  int peer = 0;
  uint64_t tag = 0;
  void* buffer = nullptr;
  size_t bytes = 0;
  bool abandoned = false;     // failed by fail_peer; a late completion only frees it
  bool holds_credit = false;  // a send taken from window_: its bytes count against the link
  uint8_t priority = 0;
  std::string cancelled;  // fail_variables: the completion, whatever it says, fails with this
  // Receives: where recv_message learns the length that arrived; null for recv, which
  // fails on any length but `bytes`.
  std::shared_ptr<size_t> received;
  TransferCallback done;
};

namespace {

constexpr size_t kMaxEagerBytes = 256 * 1024;
constexpr size_t kHeaderMargin = 4096;  // rxm's header, with room to spare
constexpr int kMsgRxDepth = 64;
constexpr size_t kRxmDefaultBuffer = 16384;  // FI_OFI_RXM_BUFFER_SIZE's default

size_t env_size(const char* name) {
  const char* set = getenv(name);
  return set ? std::strtoull(set, nullptr, 10) : 0;
}

bool env_off(const char* name) {
  const char* set = getenv(name);
  if (!set) return false;
  std::string v = set;
  return v == "0" || v == "no" || v == "off" || v == "false";
}

// Whether rxm carries eager messages between the caller's buffers (its dynamic receive
// buffers and direct send): over tcp, unless the environment turned either off.
bool rxm_direct_eager(const std::string& provider) {
  return provider.rfind("tcp", 0) == 0 && !env_off("FI_OFI_RXM_ENABLE_DYN_RBUF") &&
         !env_off("FI_OFI_RXM_ENABLE_DIRECT_SEND");
}

// The largest payload ofi_rxm sends eagerly: its buffer size (FI_OFI_RXM_BUFFER_SIZE, else
// rxm's default of 16 KiB) or, where rxm sends eagerly without bounce buffers, its eager
// limit (FI_OFI_RXM_EAGER_LIMIT) if larger; less the margin open() added for rxm's header.
size_t rxm_eager_limit(const std::string& provider) {
  size_t buffer = env_size("FI_OFI_RXM_BUFFER_SIZE");
  size_t limit = buffer ? buffer : kRxmDefaultBuffer;
  if (rxm_direct_eager(provider)) limit = std::max(limit, env_size("FI_OFI_RXM_EAGER_LIMIT"));
  return limit > kHeaderMargin ? limit - kHeaderMargin : 0;
}

std::string fi_error(const char* what, int rc) {
  return std::string(what) + ": " + fi_strerror(-rc);
}

template <typename T>
void close_fid(T*& f) {
  if (f) fi_close(&f->fid);
  f = nullptr;
}

}  // namespace

FabricEndpoint::~FabricEndpoint() {
  stop();
  close_fid(ep_);  // nothing can complete any more: drop what was still posted
  for (Op* op : posted_) delete op;
  posted_.clear();
  backlog_.clear();
  close_fid(av_);
  close_fid(cq_);
  close_fid(domain_);
  close_fid(fabric_);
  if (info_) fi_freeinfo(info_);
}

std::unique_ptr<FabricEndpoint> FabricEndpoint::open(const FabricOptions& options,
                                                     std::string* error) {
  if (options.eager_bytes > 0) {
    // Eager messages of the collectives' chunk size. rxm allocates its bounce buffers 1,024
    // at a time and zeroes each batch (libfabric 1.17, ofi_bufpool_grow): one batch for
    // receives when the endpoint opens, one for sends at the first send. Eager-sized (256
    // KiB) buffers made that 2 x 266 MB resident per daemon. Over tcp, rxm's dynamic receive
    // buffers and direct send (both on by default) carry an eager message up to its eager
    // limit between the caller's buffers, so there the bounce buffers keep rxm's default
    // size: they hold control messages and small unexpected messages (a larger unexpected
    // one gets a buffer of its size while it waits). Other providers need eager-sized ones.
    size_t eager = std::min<size_t>(options.eager_bytes, kMaxEagerBytes);
    std::string value = std::to_string(eager + kHeaderMargin);
    const char* knob =
        rxm_direct_eager(options.provider) ? "FI_OFI_RXM_EAGER_LIMIT" : "FI_OFI_RXM_BUFFER_SIZE";
    setenv(knob, value.c_str(), 0);  // the environment wins
    // Each connection's receive queue depth: the provider's default left a daemon at 1.7 GB
    // after 64 MiB allreduces across 4 nodes when the bounce buffers were eager-sized.
    setenv("FI_OFI_RXM_MSG_RX_SIZE", std::to_string(kMsgRxDepth).c_str(), 0);
  }
  std::unique_ptr<FabricEndpoint> e(new FabricEndpoint());
  e->max_posted_ = options.max_posted ? options.max_posted : 1;
  e->eager_limit_ = rxm_eager_limit(options.provider);
  if (options.provider.find("ofi_rxm") != std::string::npos) {
    size_t buffer = env_size("FI_OFI_RXM_BUFFER_SIZE");
    e->rxm_batch_bytes_ = 1024 * static_cast<uint64_t>(buffer ? buffer : kRxmDefaultBuffer);
  }
  size_t window = options.send_window_bytes ? options.send_window_bytes : 4 * e->eager_limit_;
  e->window_ = SendWindow<std::unique_ptr<Op>>(window);
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  // FI_DIRECTED_RECV: a receive matches only its peer's sends (the CollectiveTransport
  // contract); without it equal tags from different peers cross.
  hints->caps = FI_TAGGED | FI_SEND | FI_RECV | FI_DIRECTED_RECV;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->mr_mode = 0;  // plain virtual addresses: no registration needed
  hints->fabric_attr->prov_name = strdup(options.provider.c_str());
  int rc = fi_getinfo(
      FI_VERSION(1, 17), options.address.empty() ? nullptr : options.address.c_str(),
      options.service.empty() ? nullptr : options.service.c_str(), FI_SOURCE, hints, &e->info_);
  fi_freeinfo(hints);
  if (rc != 0) {
    *error = "libfabric provider '" + options.provider + "' on " + options.address + ": " +
             fi_strerror(-rc) + " (fi_info -l lists the providers here)";
    return nullptr;
  }
  e->provider_name_ = e->info_->fabric_attr->prov_name;
  if ((rc = fi_fabric(e->info_->fabric_attr, &e->fabric_, nullptr)) ||
      (rc = fi_domain(e->fabric_, e->info_, &e->domain_, nullptr))) {
    *error = fi_error("opening the fabric domain", rc);
    return nullptr;
  }
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_UNSPEC;  // fi_cq_sread blocks
  cq_attr.size = 4096;
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if ((rc = fi_cq_open(e->domain_, &cq_attr, &e->cq_, nullptr)) ||
      (rc = fi_av_open(e->domain_, &av_attr, &e->av_, nullptr)) ||
      (rc = fi_endpoint(e->domain_, e->info_, &e->ep_, nullptr)) ||
      (rc = fi_ep_bind(e->ep_, &e->cq_->fid, FI_TRANSMIT | FI_RECV)) ||
      (rc = fi_ep_bind(e->ep_, &e->av_->fid, 0)) || (rc = fi_enable(e->ep_))) {
    *error = fi_error(("creating the fabric endpoint on " + options.address +
                       (options.service.empty() ? "" : ":" + options.service))
                          .c_str(),
                      rc);
    return nullptr;
  }
  char name[256];
  size_t len = sizeof name;
  if ((rc = fi_getname(&e->ep_->fid, name, &len))) {
    *error = fi_error("fi_getname", rc);
    return nullptr;
  }
  e->address_.assign(name, len);
  char text[256];
  size_t text_len = sizeof text;
  fi_av_straddr(e->av_, name, text, &text_len);  // truncates, NUL-terminated, if too long
  e->address_text_ = text;
  return e;
}

bool FabricEndpoint::set_peers(const std::vector<std::string>& addresses, int self,
                               std::string* error) {
  self_ = self;
  dead_.assign(addresses.size(), "");
  window_.set_peers(addresses.size());
  peers_.assign(addresses.size(), FI_ADDR_UNSPEC);
  peer_addresses_ = addresses;
  for (size_t i = 0; i < addresses.size(); ++i) {
    int n = fi_av_insert(av_, addresses[i].data(), 1, &peers_[i], 0, nullptr);
    if (n != 1) {
      *error = "fi_av_insert of node " + std::to_string(i) + "'s fabric address failed";
      return false;
    }
  }
  return true;
}

bool FabricEndpoint::reset_peers(const std::vector<std::string>& addresses, int self,
                                 std::string* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = addresses.size();
  // Every rank whose address changes, or that the new table no longer has, leaves the
  // address vector first: a node that moved to another rank is inserted anew there.
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (i < n && addresses[i] == peer_addresses_[i]) continue;
    fi_av_remove(av_, &peers_[i], 1, 0);
    peers_[i] = FI_ADDR_UNSPEC;
    peer_addresses_[i].clear();
  }
  peers_.resize(n, FI_ADDR_UNSPEC);
  peer_addresses_.resize(n);
  dead_.assign(n, "");
  window_.set_peers(n);
  for (size_t i = 0; i < n; ++i) {
    window_.reset(static_cast<int>(i));
    if (peers_[i] != FI_ADDR_UNSPEC) continue;
    if (fi_av_insert(av_, addresses[i].data(), 1, &peers_[i], 0, nullptr) != 1) {
      *error = "fi_av_insert of node " + std::to_string(i) + "'s new fabric address failed";
      dead_[i] = *error;
      return false;
    }
    peer_addresses_[i] = addresses[i];
  }
  self_ = self;
  // Ids of the earlier cluster's variables may be handed out again (a restarted
  // coordinator counts from 1): none of their operations is left (fail_all).
  dead_vars_.clear();
  dead_order_.clear();
  return true;
}

void FabricEndpoint::post_send(int peer, uint64_t tag, const void* buffer, size_t bytes,
                               uint8_t priority, TransferCallback done) {
  auto op = std::make_unique<Op>();
  op->is_send = true;
  op->peer = peer;
  op->tag = tag;
  op->buffer = const_cast<void*>(buffer);
  op->bytes = bytes;
  op->priority = priority;
  op->done = std::move(done);
  post(std::move(op));
}

void FabricEndpoint::recv(int peer, uint64_t tag, void* buffer, size_t bytes,
                          TransferCallback done) {
  post_recv(peer, tag, buffer, bytes, nullptr, std::move(done));
}

void FabricEndpoint::recv_message(int peer, uint64_t tag, void* buffer, size_t capacity,
                                  MessageCallback done) {
  auto received = std::make_shared<size_t>(0);
  post_recv(peer, tag, buffer, capacity, received,
            [received, done = std::move(done)](bool ok, const std::string& e) {
              done(ok, *received, e);
            });
}

void FabricEndpoint::post_recv(int peer, uint64_t tag, void* buffer, size_t bytes,
                               std::shared_ptr<size_t> received, TransferCallback done) {
  auto op = std::make_unique<Op>();
  op->peer = peer;
  op->tag = tag;
  op->buffer = buffer;
  op->bytes = bytes;
  op->received = std::move(received);
  op->done = std::move(done);
  post(std::move(op));
}

std::string FabricEndpoint::refusal(const Op& op) const {
  std::string error = dead_[static_cast<size_t>(op.peer)];
  if (error.empty() && !dead_vars_.empty()) {
    auto dead = dead_vars_.find(tag_var_id(op.tag));
    if (dead != dead_vars_.end()) error = dead->second;
  }
  return error;
}

void FabricEndpoint::post(std::unique_ptr<Op> op) {
  if (op->peer < 0 || static_cast<size_t>(op->peer) >= peers_.size()) {
    op->done(false, "no fabric peer " + std::to_string(op->peer));
    return;
  }
  Failed failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string error = refusal(*op);
    if (!error.empty()) {
      failed.emplace_back(std::move(op), error);
    } else if (op->is_send && op->bytes <= eager_limit_) {
      // Eager sends wait for the link's credit. Receives take none (they hold no bandwidth,
      // and a receive posted early lets the peer's send finish sooner), nor do rendezvous
      // sends (send_window.h says why).
      int peer = op->peer;
      uint8_t priority = op->priority;
      size_t bytes = op->bytes;
      window_.push(peer, priority, bytes, std::move(op));
      pump_locked(peer, &failed);
    } else {
      submit_locked(std::move(op), &failed);
    }
  }
  call_back(failed);
}

void FabricEndpoint::submit_locked(std::unique_ptr<Op> op, Failed* failed) {
  if (!backlog_.empty() || posted_.size() >= max_posted_) {
    backlog_.push_back(std::move(op));
    return;
  }
  std::string error;
  if (try_post(op.get(), &error)) {
    posted_.insert(op.release());
    return;
  }
  if (error.empty()) {  // -FI_EAGAIN: the progress thread retries it
    backlog_.push_back(std::move(op));
    return;
  }
  release_credit_locked(*op, failed);
  failed->emplace_back(std::move(op), error);
}

void FabricEndpoint::pump_locked(int peer, Failed* failed) {
  std::vector<std::unique_ptr<Op>> ready;
  window_.take_ready(peer, &ready);
  for (auto& op : ready) {
    op->holds_credit = true;
    // A hard failure returns the credit and pumps again from release_credit_locked.
    submit_locked(std::move(op), failed);
  }
}

void FabricEndpoint::release_credit_locked(Op& op, Failed* failed) {
  if (!op.holds_credit) return;
  op.holds_credit = false;
  window_.finished(op.peer, op.bytes);
  pump_locked(op.peer, failed);
}

void FabricEndpoint::call_back(Failed& failed) {
  for (auto& [op, error] : failed) op->done(false, error);
}

uint64_t FabricEndpoint::priority_overtakes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return window_.overtakes();
}

void FabricEndpoint::fail_peer(int peer, const std::string& why) {
  std::vector<TransferCallback> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (peer < 0 || static_cast<size_t>(peer) >= dead_.size() ||
        !dead_[static_cast<size_t>(peer)].empty())
      return;
    dead_[static_cast<size_t>(peer)] = why;
    // Posted operations are cancelled and failed now: a provider may never complete a
    // rendezvous send to a peer that stopped receiving. The Op itself stays until the
    // provider gives it back (or the endpoint closes).
    for (Op* op : posted_) {
      if (op->peer != peer || op->abandoned) continue;
      fi_cancel(&ep_->fid, &op->context);
      op->abandoned = true;
      op->holds_credit = false;  // the window of a dead peer starts empty (reset below)
      failed.push_back(std::move(op->done));
    }
    auto of_peer = [peer](const Op& op) { return op.peer == peer; };
    drop_backlog(of_peer, &failed);
    drop_waiting_sends(of_peer, &failed);
    window_.reset(peer);
  }
  for (auto& done : failed) done(false, why);
}

void FabricEndpoint::fail_all(const std::string& why) {
  for (int peer = 0; peer < size(); ++peer) fail_peer(peer, why);
}

void FabricEndpoint::fail_variables(const std::vector<uint32_t>& var_ids, const std::string& why) {
  std::vector<TransferCallback> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (uint32_t id : var_ids)
      if (dead_vars_.emplace(id & 0xffffff, why).second) dead_order_.push_back(id & 0xffffff);
    for (; dead_order_.size() > kMaxDeadVars; dead_order_.pop_front())
      dead_vars_.erase(dead_order_.front());
    auto dead = [&](const Op& op) { return dead_vars_.count(tag_var_id(op.tag)) > 0; };
    for (Op* op : posted_) {
      if (op->is_send || op->abandoned || !op->cancelled.empty() || !dead(*op)) continue;
      op->cancelled = why;
      fi_cancel(&ep_->fid, &op->context);
    }
    drop_backlog(dead, &failed);
    drop_waiting_sends(dead, &failed);
  }
  for (auto& done : failed) done(false, why);
}

void FabricEndpoint::drop_waiting_sends(const std::function<bool(const Op&)>& matches,
                                        std::vector<TransferCallback>* failed) {
  std::vector<std::unique_ptr<Op>> dropped;
  window_.drop_if([&](const std::unique_ptr<Op>& op) { return matches(*op); }, &dropped);
  for (auto& op : dropped) failed->push_back(std::move(op->done));
}

void FabricEndpoint::drop_backlog(const std::function<bool(const Op&)>& matches,
                                  std::vector<TransferCallback>* failed) {
  for (auto it = backlog_.begin(); it != backlog_.end();) {
    if (matches(**it)) {
      failed->push_back(std::move((*it)->done));
      // Its credit returns; the window's next sends go on the next completion or retry.
      if ((*it)->holds_credit) window_.finished((*it)->peer, (*it)->bytes);
      it = backlog_.erase(it);
    } else {
      ++it;
    }
  }
}

bool FabricEndpoint::try_post(Op* op, std::string* error) {
  ssize_t rc;
  if (op->is_send) {
    rc = fi_tsend(ep_, op->buffer, op->bytes, nullptr, peers_[static_cast<size_t>(op->peer)],
                  op->tag, &op->context);
  } else {
    rc = fi_trecv(ep_, op->buffer, op->bytes, nullptr, peers_[static_cast<size_t>(op->peer)],
                  op->tag, 0, &op->context);
  }
  if (rc == 0) {
    if (op->is_send) sent_any_.store(true, std::memory_order_relaxed);
    return true;
  }
  if (rc != -FI_EAGAIN)
    *error = std::string(op->is_send ? "fi_tsend to" : "fi_trecv from") + " node " +
             std::to_string(op->peer) + ": " + fi_strerror(static_cast<int>(-rc));
  return false;
}

void FabricEndpoint::retry_backlog() {
  Failed failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!backlog_.empty() && posted_.size() < max_posted_) {
      std::unique_ptr<Op> op = std::move(backlog_.front());
      backlog_.pop_front();
      std::string error;
      if (try_post(op.get(), &error)) {
        posted_.insert(op.release());
      } else if (error.empty()) {
        backlog_.push_front(std::move(op));
        break;  // still -FI_EAGAIN: wait for completions
      } else {
        release_credit_locked(*op, &failed);
        failed.emplace_back(std::move(op), error);
      }
    }
    // Credit returned by dropped sends (drop_backlog) is used here at the latest.
    for (int peer = 0; peer < size(); ++peer)
      if (dead_[static_cast<size_t>(peer)].empty()) pump_locked(peer, &failed);
  }
  call_back(failed);
}

void FabricEndpoint::start() {
  progress_ = std::thread([this] { progress_loop(); });
}

void FabricEndpoint::stop() {
  if (!progress_.joinable()) return;
  stopping_ = true;
  fi_cq_signal(cq_);
  progress_.join();
}

void FabricEndpoint::complete(Op* op, bool ok, size_t received, const std::string& error) {
  std::unique_ptr<Op> owned(op);
  Failed failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    posted_.erase(op);
    if (op->abandoned) return;  // already failed by fail_peer
    // The link has room again: the highest-priority waiting send to this peer goes next.
    release_credit_locked(*op, &failed);
  }
  call_back(failed);
  if (!owned->cancelled.empty()) return owned->done(false, owned->cancelled);
  if (ok && !op->is_send) {
    if (op->received) {
      *op->received = received;
    } else if (received != op->bytes) {
      return owned->done(false, "receive from node " + std::to_string(op->peer) + ": " +
                                    std::to_string(received) + " bytes arrived, " +
                                    std::to_string(op->bytes) + " expected (malformed message)");
    }
  }
  owned->done(ok, error);
}

void FabricEndpoint::progress_loop() {
  fi_cq_tagged_entry entries[32];
  while (!stopping_) {
    // Blocks until a completion (or fi_cq_signal); the timeout only bounds how long a
    // provider that needs manual progress goes without it.
    ssize_t n = fi_cq_sread(cq_, entries, 32, nullptr, 100);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i)
        complete(static_cast<Op*>(entries[i].op_context), true, entries[i].len, "");
    } else if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0 && err.op_context) {
        Op* op = static_cast<Op*>(err.op_context);
        std::string why = std::string(op->is_send ? "send to" : "receive from") + " node " +
                          std::to_string(op->peer) + " failed: " + fi_strerror(err.err);
        if (err.err == FI_ETRUNC) why += " (message larger than the posted buffer)";
        complete(op, false, 0, why);
      }
    }
    retry_backlog();
  }
}

}  // namespace px
