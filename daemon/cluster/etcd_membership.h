// A cluster's membership on etcd (membership = "etcd://HOST:PORT[,...]/PREFIX"), instead of a
// configured node list with node 0 coordinating for good.
//   PREFIX/nodes/<i>      this daemon's control address, under its lease: node index i is
//                         the lowest one free when it starts (assigned, not configured)
//   PREFIX/coordinator    "<node> <control address>", under the coordinator's lease: created
//                         only if absent (an election); its create revision is the term, so
//                         a newer coordinator always has a higher one
// The lease is kept alive from a thread of its own (etcd's HTTP calls block), which also
// watches the coordinator key and campaigns when it is gone; the loop hears of a new
// coordinator through a uv_async. A coordinator only forms a cluster (a new epoch) while
// etcd confirmed within half a lease that it still holds its key (holds()): one that lost
// etcd never starts an epoch another might also start. Jobs already running do not need
// etcd: they go on while it is unreachable, and joins wait for it.
#pragma once

#include <uv.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/cluster/etcd_client.h"
#include "daemon/cluster/membership_url.h"

namespace px {

class EtcdMembership {
 public:
  struct Settings {
    std::string url;      // etcd://HOST:PORT[,...]/PREFIX
    std::string address;  // this daemon's control address (what the coordinator listens on)
    int node_count = 1;
    int64_t lease_s = 5;
    int64_t startup_timeout_ms = 60000;  // how long to wait for a free node index
  };
  struct Coordinator {
    int node = -1;
    std::string address;
    int64_t term = 0;   // the coordinator key's create revision
    bool mine = false;  // the key is this node's, under this daemon's lease
  };

  // Blocking, at start-up: a lease, then the lowest free node index (waiting up to the
  // start-up timeout while every index is held). The lease is kept alive from here on.
  static std::unique_ptr<EtcdMembership> register_node(const Settings& settings, int* node_index,
                                                       std::string* error);
  ~EtcdMembership();

  // From now on, on_coordinator runs on loop's thread whenever the coordinator changes (the
  // first time included); on_fatal if this node's index was given away while it could not
  // reach etcd.
  void start(uv_loop_t* loop, std::function<void(const Coordinator&)> on_coordinator,
             std::function<void(const std::string&)> on_fatal);
  // Whether this node may stand for election when etcd has no coordinator: a member still
  // connected to its coordinator does not (that coordinator recreates its key when etcd
  // returns after its lease expired); a node with no coordinator does. Initially true.
  void set_campaigning(bool allowed) { may_campaign_ = allowed; }
  // This node holds the coordinator key of term, as etcd confirmed within half a lease.
  bool holds(int64_t term) const;
  // While this node coordinates: the node indices registered in etcd (PREFIX/nodes/<i>, each
  // under a live lease), as last read (four times a second). False if not read since
  // since_ms (steady clock): a re-formation waits for a reading newer than the loss.
  bool registered(int64_t since_ms, std::vector<int>* nodes) const;
  static int64_t now_ms();  // the clock of registered()
  // Stops the thread and revokes the lease: the index (and the coordinator key, if held)
  // free at once, not a lease later. Loop thread.
  void stop();
  int node() const { return node_; }
  // "etcd 127.0.0.1:2379 (prefix /parallax/job)"
  std::string describe() const;

 private:
  EtcdMembership(const Settings& settings, MembershipUrl url);
  bool claim_index(std::string* error);  // lowest free index, once; error if none or etcd fails
  void run();                            // the thread
  void keep_lease(int64_t now_ms);
  // Creates PREFIX/nodes/<node_> under the lease until etcd confirms it (after a lease was
  // renewed); fatal if another daemon took the index meanwhile.
  void ensure_node_key();
  void fail(const std::string& why);  // on_fatal, on the loop
  void halt_thread();
  void follow_coordinator(int64_t now_ms);
  void read_registered(int64_t now_ms);
  void post(const Coordinator& c);

  Settings settings_;
  MembershipUrl url_;
  EtcdClient client_;
  int64_t lease_ = 0;
  int node_ = -1;
  bool node_key_confirmed_ = false;  // thread: PREFIX/nodes/<node_> is ours under lease_
  std::string description_;
  int64_t last_keepalive_ms_ = 0;
  bool etcd_down_ = false;  // logged once per outage

  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> may_campaign_{true};
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool following_ = false;  // start() was called: follow (and elect) the coordinator
  Coordinator seen_;        // thread: the coordinator last posted
  // Guarded by mu_: what the loop reads.
  int64_t held_term_ = 0;
  int64_t held_confirmed_ms_ = 0;
  Coordinator pending_;
  std::vector<int> registered_;  // read_registered()
  int64_t registered_ms_ = -1;   // when it was read (the read's start), -1: never
  bool has_pending_ = false;
  std::string fatal_;
  uv_async_t async_{};
  std::atomic<bool> async_open_{false};
  std::function<void(const Coordinator&)> on_coordinator_;
  std::function<void(const std::string&)> on_fatal_;
};

}  // namespace px
