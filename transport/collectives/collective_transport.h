// The narrow interface collectives are written against: tagged, asynchronous point-to-point
// messages between the ranks of a group. Implemented by FabricEndpoint (libfabric) and
// InProcTransport (threads in one process, for tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace px {

// Called once when a posted send or receive finishes; ok is false on failure (error names
// the peer). Runs on the transport's progress thread: keep it short.
using TransferCallback = std::function<void(bool ok, const std::string& error)>;
// A receive of a message whose length the receiver does not know in advance: bytes is
// how much arrived.
using MessageCallback = std::function<void(bool ok, size_t bytes, const std::string& error)>;

class CollectiveTransport {
 public:
  virtual ~CollectiveTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A receive matches the send from peer with the same tag; messages with equal
  // (peer, tag) must not be in flight at the same time. recv expects exactly `bytes`: a
  // message of any other length fails it (a peer's malformed message never leaves part of
  // a buffer stale); recv_message takes any message up to `capacity` bytes.
  void send(int peer, uint64_t tag, const void* buffer, size_t bytes, TransferCallback done) {
    post_send(peer, tag, buffer, bytes, 0, std::move(done));
  }
  // priority (0..255, px_op_options.priority): where sends wait for the link, larger goes
  // first and equal ones keep their order (FabricEndpoint: send_window.h). Matching is by
  // tag alone, so the order sends leave in never changes which receive they meet.
  void send(int peer, uint64_t tag, const void* buffer, size_t bytes, uint8_t priority,
            TransferCallback done) {
    post_send(peer, tag, buffer, bytes, priority, std::move(done));
  }
  virtual void recv(int peer, uint64_t tag, void* buffer, size_t bytes, TransferCallback done) = 0;
  virtual void recv_message(int peer, uint64_t tag, void* buffer, size_t capacity,
                            MessageCallback done) = 0;

 protected:
  virtual void post_send(int peer, uint64_t tag, const void* buffer, size_t bytes, uint8_t priority,
                         TransferCallback done) = 0;
};

// Tag layout: kind (4 bits) | variable id (24) | step (16, wraps) | per-algorithm (20).
enum class TagKind : uint64_t {
  kAllreduce = 1,
  kAllgatherv = 2,
  kBroadcast = 3,
  kBarrier = 4,
  kSparseRequest = 5,  // a node asks a shard owner (per-algorithm bits: 0 header, 1 payload)
  kSparseReply = 6,
  kSparseCounts = 7,    // replicated sparse routes: rows per node before the allgatherv
  kAllgather = 8,       // dense px_allgather (its steps are numbered apart from allgatherv's)
  kRouteAgree = 9,      // PX_ROUTE_AUTO: the nodes' route samples (step: the estimate)
  kRouteMove = 10,      // PX_ROUTE_AUTO: a move's row counts, then rows (step: 2 x move + part)
  kReduceScatter = 11,  // dense px_reduce_scatter
  kAlltoall = 12,       // dense px_alltoall(v): per node pair a counts header, then the blocks
  kHandover = 13,       // a sparse table's parts from the last run (step: 0 sizes, 1 parts)
};

inline uint64_t make_tag(TagKind kind, uint32_t var_id, uint64_t step) {
  return (static_cast<uint64_t>(kind) << 60) | (static_cast<uint64_t>(var_id & 0xffffff) << 36) |
         ((step & 0xffff) << 20);
}
constexpr uint64_t kTagAlgorithmBits = 20;

inline uint32_t tag_var_id(uint64_t tag) {
  return static_cast<uint32_t>((tag >> 36) & 0xffffff);
}

}  // namespace px
