// A libfabric RDM endpoint for daemon<->daemon bulk data: tagged messages, a completion
// queue drained by one progress thread that blocks in fi_cq_sread (no busy-waiting), and
// a backlog that absorbs -FI_EAGAIN so the number of posted operations stays bounded.
// Sends to each peer first wait in a SendWindow (send_window.h): a window of bytes per link,
// highest priority first, so an urgent small transfer does not queue behind a large one.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "transport/collectives/collective_transport.h"
#include "transport/fabric/send_window.h"

struct fid_fabric;
struct fid_domain;
struct fid_ep;
struct fid_cq;
struct fid_av;

namespace px {

struct FabricOptions {
  std::string provider = "tcp;ofi_rxm";  // fi_info -l lists what is there
  std::string address = "127.0.0.1";     // local address to bind (FI_SOURCE)
  std::string service;                   // local port; empty: any
  size_t max_posted = 256;               // posted operations before the backlog holds more
  // Largest message ofi_rxm sends eagerly (FI_OFI_RXM_EAGER_LIMIT over tcp, else its buffer
  // size, FI_OFI_RXM_BUFFER_SIZE, unless the environment sets it; capped at 256 KiB): the
  // collectives' chunk size. Larger messages take rxm's rendezvous path, which measured at
  // half the link rate on tc-limited links.
  size_t eager_bytes = 0;
  // Bytes of eager sends handed to the provider per peer at once (send_window.h); 0: four
  // eager messages. Smaller lets priority act sooner; too small leaves a fast link idle
  // between completions. Larger (rendezvous) sends are not windowed (send_window.h says why).
  size_t send_window_bytes = 0;
};

class FabricEndpoint : public CollectiveTransport {
 public:
  ~FabricEndpoint();
  FabricEndpoint(const FabricEndpoint&) = delete;
  FabricEndpoint& operator=(const FabricEndpoint&) = delete;

  static std::unique_ptr<FabricEndpoint> open(const FabricOptions& options, std::string* error);

  // The endpoint's address (fi_getname), to hand to the other daemons.
  const std::string& address() const { return address_; }
  // The same, readable (fi_av_straddr: "fi_sockaddr_in://127.0.0.1:7071"), for the log.
  const std::string& address_text() const { return address_text_; }
  const std::string& provider_name() const { return provider_name_; }
  // Inserts the group's addresses (this endpoint's own at index self); rank i is then
  // addressed by index i.
  bool set_peers(const std::vector<std::string>& addresses, int self, std::string* error);
  // A re-formed cluster (a node restarted under its index, a restarted coordinator, or with
  // membership on etcd an epoch of fewer or more nodes, this one now rank self): a rank whose
  // address changed (a restarted daemon's endpoint is a new one, or another node has the
  // rank now) is addressed anew, and every peer and variable lives again. Only after
  // fail_all: nothing of the earlier cluster may still be under way.
  bool reset_peers(const std::vector<std::string>& addresses, int self, std::string* error);

  int rank() const override { return self_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  void recv(int peer, uint64_t tag, void* buffer, size_t bytes, TransferCallback done) override;
  void recv_message(int peer, uint64_t tag, void* buffer, size_t capacity,
                    MessageCallback done) override;

  // Declares a peer dead: its posted operations are cancelled and fail with why, and every
  // later one fails at once. (Liveness comes from the control plane, not from here.)
  void fail_peer(int peer, const std::string& why);
  // Fails every peer: what a daemon does when the cluster loses a node, since collectives
  // in flight also wait on survivors that stopped at the failure.
  void fail_all(const std::string& why);
  // Fails the operations of these variables (tag_var_id), now and from now on: what a
  // daemon does when a job breaks while its peers are alive. Posted receives are cancelled
  // and fail once the provider gives them back (a peer may still be sending into them);
  // posted sends finish as usual.
  void fail_variables(const std::vector<uint32_t>& var_ids, const std::string& why);
  static constexpr size_t kMaxDeadVars = 1 << 16;

  // How many sends went ahead of sends to the same peer that had come before them (a higher
  // priority overtook): for stats and tests.
  uint64_t priority_overtakes();
  size_t send_window_bytes() const { return window_.window_bytes(); }
  // Sends up to this size are eager (ofi_rxm's eager limit) and wait in the window.
  size_t eager_limit() const { return eager_limit_; }
  // ofi_rxm's bounce buffers, estimated: it allocates them 1,024 at a time (libfabric
  // 1.17), a batch for receives when the endpoint opens and one for sends at the first
  // send; each of its buffer size (plus a header not counted). 0 for other providers.
  uint64_t bounce_buffer_bytes() const {
    return rxm_batch_bytes_ * (sent_any_.load(std::memory_order_relaxed) ? 2 : 1);
  }

  // Starts the progress thread (after set_peers).
  void start();
  // Stops the progress thread; operations still posted are abandoned (never called back).
  void stop();

 private:
  struct Op;
  FabricEndpoint() = default;
  void post(std::unique_ptr<Op> op);
  // received: where the length that arrived goes (recv_message); null for an exact recv.
  void post_recv(int peer, uint64_t tag, void* buffer, size_t bytes,
                 std::shared_ptr<size_t> received, TransferCallback done);
  bool try_post(Op* op, std::string* error);  // false + error on a hard failure
  void retry_backlog();
  // Removes the backlogged operations that match (mutex_ held), collecting their callbacks.
  void drop_backlog(const std::function<bool(const Op&)>& matches,
                    std::vector<TransferCallback>* failed);
  // The same for the sends waiting in window_ (mutex_ held).
  void drop_waiting_sends(const std::function<bool(const Op&)>& matches,
                          std::vector<TransferCallback>* failed);
  void progress_loop();
  void complete(Op* op, bool ok, size_t received, const std::string& error);
  using Failed = std::vector<std::pair<std::unique_ptr<Op>, std::string>>;
  void post_send(int peer, uint64_t tag, const void* buffer, size_t bytes, uint8_t priority,
                 TransferCallback done) override;
  // "" if op may go (mutex_ held); else why it fails at once (dead peer or variable).
  std::string refusal(const Op& op) const;
  // Hands op to the provider, or to the backlog when it is full (mutex_ held); a hard
  // failure goes to *failed, to be called back once the mutex is released.
  void submit_locked(std::unique_ptr<Op> op, Failed* failed);
  // Sends to peer that fit its window now go to the provider (mutex_ held).
  void pump_locked(int peer, Failed* failed);
  // A send that held window credit finished or failed: the credit returns (mutex_ held).
  void release_credit_locked(Op& op, Failed* failed);
  static void call_back(Failed& failed);

  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  std::string address_;
  std::string address_text_;
  std::string provider_name_;
  std::vector<fi_addr_t> peers_;
  std::vector<std::string> peer_addresses_;  // what peers_ were inserted from
  // Read by collectives on the pool while reset_peers() moves it on the loop thread.
  std::atomic<int> self_{0};
  size_t max_posted_ = 256;
  size_t eager_limit_ = 0;
  uint64_t rxm_batch_bytes_ = 0;
  std::atomic<bool> sent_any_{false};

  std::mutex mutex_;  // guards everything below
  std::deque<std::unique_ptr<Op>> backlog_;
  SendWindow<std::unique_ptr<Op>> window_;
  std::unordered_set<Op*> posted_;
  std::vector<std::string> dead_;  // per peer: why it is dead, empty while alive
  std::unordered_map<uint32_t, std::string> dead_vars_;  // var id -> why its operations fail
  // dead_vars_'s ids, oldest first: only the last kMaxDeadVars are kept, so a daemon that
  // runs job after job holds a bounded set, and an id reused once the 24-bit tag ids wrap
  // (after 16 M variables) is not refused for an old job's sake.
  std::deque<uint32_t> dead_order_;
  std::atomic<bool> stopping_{false};
  std::thread progress_;
};

}  // namespace px
