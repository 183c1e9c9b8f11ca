// A sparse variable's requests to shard owners: to this node's ShardOwner directly, to
// other nodes' over the fabric (sparse_wire.h), and the receiving side that feeds other
// nodes' requests into this node's ShardOwner, in the order each node sent them. A request's
// header and rows (when few) share one message, a reply's status and rows another; bulk
// parts go from and into their own buffers uncopied, cut into chunks of at most chunk_bytes:
// larger messages would take ofi_rxm's rendezvous path, which runs at about half the link
// rate on rate-limited links (fabric_endpoint.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/sparse/shard_owner.h"
#include "sharding/wire_values.h"
#include "transport/collectives/collective_transport.h"

namespace px {

// The checks on the first message of a request from node `peer` (its header, then the rows
// when inline), made before anything is sized from it: "" with *header filled when it is
// well-formed, else what is wrong. first holds `bytes` bytes. (A free function so that
// tests/fuzz/sparse_header_fuzz.cc drives it without a fabric.)
// step_value_bytes: the bytes of a pull's or push's values (sparse_wire.h).
std::string check_sparse_request(const char* first, size_t bytes, int peer, size_t dim,
                                 SparseRequestHeader* header, size_t step_value_bytes = 4);

class SparseChannel : public std::enable_shared_from_this<SparseChannel> {
 public:
  // fabric is null on a single node. node_label(i) names node i in errors. widths[i]: the
  // values per row node i's shard holds (the table's dim, but on the column-wise alltoall
  // route), what its requests' values and replies carry. wire: the dtype of pull rows and
  // push gradients between nodes; the values handed to request() and produced by the owner
  // are already rounded to it (wire_values.h), so packing is exact.
  SparseChannel(CollectiveTransport* fabric, int node, int nodes, std::vector<size_t> widths,
                size_t chunk_bytes, std::shared_ptr<ShardOwner> owner, PostToLoop post,
                std::function<std::string(int)> node_label, WireDtype wire = WireDtype::kF32,
                bool prefetch = false);

  // Cluster: serve other nodes' requests; the variable's bulk messages use global_id.
  void start(uint32_t global_id);
  bool started() const { return global_id_ != 0 || !fabric_; }

  // Sends a request to node `to` (this node included) for one partition, a group of them
  // (groups > 0) or all of them (sparse_wire.h). rows and values (push, load) must stay valid, and
  // out (pull, read: count x node to's width) writable, until done; keep_alive holds them. done
  // runs on the loop thread. priority orders the request's sends on the fabric
  // (send_window.h), and the owner's reply (the header carries it).
  void request(int to, uint32_t partition, uint32_t groups, SparseOp op, uint64_t step,
               uint8_t priority, size_t count, const int64_t* rows, const float* values, float* out,
               std::shared_ptr<void> keep_alive, StatusCallback done);

  // Moving the table to another route (route_move.cc). expect_layout: the next layout's
  // widths; requests for it (from nodes that moved first) are received with them and wait.
  // switch_layout: nothing is in flight on the old layout; the owner of the new one gets
  // the waiting requests and every later one, and requests go out for the new layout.
  // Copies of partitions (px_sparse_options.replicas): the optimizer state slots a
  // replicate request carries per value besides the value (shard_replica.h).
  void set_state_slots(size_t slots) { state_slots_ = slots; }
  void expect_layout(std::vector<size_t> widths);
  void switch_layout(std::shared_ptr<ShardOwner> owner);
  const std::vector<size_t>& widths() const { return widths_; }

  // The job's state here is freed (its receives were cancelled): drops the requests
  // received and not yet handed to the owner, and the owner's waiting ones
  // (ShardOwner::abandon), which hold this channel through their callbacks.
  void abandon();

  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  struct Incoming;
  struct Call;
  struct Peer {
    uint64_t seq = 0;         // next request sequence number expected from the peer
    std::vector<char> first;  // the next request's first message lands here
    std::deque<std::shared_ptr<Incoming>> in_order;
  };
  // A payload part of `bytes` goes as chunks() messages tagged tag | part | chunk << 2.
  size_t chunk_size(size_t bytes) const;
  size_t chunks(size_t bytes) const;
  void send_part(int peer, uint64_t tag, uint64_t part, const void* data, size_t bytes,
                 uint8_t priority, const TransferCallback& done);
  void recv_part(int peer, uint64_t tag, uint64_t part, void* data, size_t bytes,
                 const TransferCallback& done);
  void post_first(int peer);
  void on_first(int peer, bool ok, size_t bytes, const std::string& error);
  void deliver_ready(int peer);
  void reply(int peer, const std::shared_ptr<Incoming>& in, px_status status);
  // A pull served ahead (ShardRequest::early): the rows in now, then the pending ones.
  void reply_ahead(int peer, const std::shared_ptr<Incoming>& in, std::vector<size_t> pending);
  void reply_rest(int peer, const std::shared_ptr<Incoming>& in, px_status status);
  // The requester's side of the second part; done once it is in.
  void receive_rest(int to, const std::shared_ptr<Call>& call, uint64_t reply_tag, size_t pending,
                    size_t count, size_t width);
  // Pulls and pushes travel in 16 bits (packed here), other operations in f32.
  bool packs(SparseOp op) const {
    return wire_ != WireDtype::kF32 && (op == SparseOp::kPull || op == SparseOp::kPush);
  }

  CollectiveTransport* fabric_;
  int node_;
  int nodes_;
  std::vector<size_t> widths_;
  std::vector<size_t> next_widths_;  // a move under way: the next layout's (else empty)
  bool layout_odd_ = false;          // kLayoutOdd: this node's layout (moves so far) is odd
  size_t chunk_bytes_;
  WireDtype wire_;
  size_t step_value_bytes_;  // wire_value_bytes(wire_)
  bool prefetch_;            // pulls may be served ahead: ask for compact replies
  size_t state_slots_ = 0;   // set_state_slots
  std::shared_ptr<ShardOwner> owner_;
  PostToLoop post_;
  std::function<std::string(int)> node_label_;
  uint32_t global_id_ = 0;
  // Per destination node; atomic since remote requests come from the loop and the pool.
  std::unique_ptr<std::atomic<uint64_t>[]> next_seq_to_;
  std::vector<Peer> peers_;
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace px
