// Bulk messages between a node and the owner of a shard, over the fabric. A request starts
// with one message (part 0) holding its fixed header and, when they fit in
// kRequestMessageBytes, its rows; rows that do not fit follow as part 1, values as part 2:
//   pull, read  payload: int64 rows[count]                reply: status, float rows[count][dim]
//   push        payload: int64 rows[count], float grads   (no reply)
// (pull rows and push gradients are bf16/f16 instead of float when the variable's wire dtype
// says so: sparse_value_bytes)
//   load        payload: int64 rows[count], float values  reply: status
//   checkpoint  payload: the directory, NUL-padded to count int64 words; step = push steps
//               to wait for                               reply: status
//   flush       payload: int64 rows[count], float sums    reply: status
//               (a hot-row cache's held gradient sums, daemon/sparse/hot_row_cache.h; step:
//               the sender's push steps all sent before it, which a read or checkpoint of
//               a cached table waits for from every node)
//   replicate   payload: int64 rows[count], float values[count][dim] then state
//               [count][slots][dim]                       (no reply)
//               (a partition's rows after a push step, from its owner to the node after
//               it, which keeps a copy: px_sparse_options.replicas, daemon/sparse/
//               shard_replica.h; step: the push step, partition: the partition)
// A reply is one stream (part 0): the status, then the rows, so a pull of a partition is
// one message each way when it fits a chunk (a pull served ahead: two, SparseReplyHeader). The
// requester receives it into its rows buffer and the kReplyHeadroom bytes just before it. Every
// part is cut into chunks (sparse_channel.h). Tags carry the variable's cluster-wide id and the
// sender's request sequence number to that owner (collective_transport.h).
#pragma once

#include <cstdint>

namespace px {

enum class SparseOp : uint32_t {
  kPull = 1,
  kPush = 2,
  kLoad = 3,
  kRead = 4,
  kCheckpoint = 5,
  kFlush = 6,
  kReplicate = 7
};

// Pulls and pushes on the ps/hybrid routes go per group of the owner's partitions (each
// partition is applied on its own, so a reply can leave while other partitions' pushes are
// still arriving); other requests, and every request on the replicated routes, cover all
// the owner's partitions.
constexpr uint32_t kAllPartitions = 0xffffffffu;

struct SparseRequestHeader {
  uint16_t op;       // SparseOp
  uint8_t priority;  // the request's px_op_options.priority: its reply goes at the same
  uint8_t flags;     // kCompactReply
  uint32_t from_node;
  uint64_t step;  // pull/push step; 0 for load/read
  uint64_t count;
  uint64_t payload_bytes;
  uint32_t partition;  // or kAllPartitions; with groups > 0, a group (request_groups.h)
  uint32_t groups;     // 0: partition is one partition; else the groups it is one of
};
static_assert(sizeof(SparseRequestHeader) == 40);

struct SparseReplyHeader {
  int32_t status;  // px_status; details are in the owner's log
  // A pull served ahead of the previous push step (px_sparse_options.prefetch): this many
  // of its rows are not in this reply yet. They follow as part 1 of the reply tag: another
  // header (its status), their positions (uint64 each, ascending), then their values. The
  // first part holds either every row's place (the pending ones zero) or, when the request
  // asked for kCompactReply, only the others, in order.
  uint32_t pending_rows;
};
static_assert(sizeof(SparseReplyHeader) == 8);

// A pull whose reply is one message (it fits a chunk) of a prefetch variable: when served
// ahead, the first part of the reply may leave out the pending rows' places (their count
// in the header says how many; the requester spreads the rows it got over the others).
constexpr uint8_t kCompactReply = 1;
// The sender's layout of the table is odd-numbered: it counts the moves between routes
// (PX_ROUTE_AUTO), so an owner tells a request for its next layout (from a node that moved
// first) from one for the layout it holds.
constexpr uint8_t kLayoutOdd = 2;

// The owner posts a receive of this size for every node's next request.
constexpr uint64_t kRequestMessageBytes = 64 * 1024;
constexpr uint64_t kReplyHeadroom = sizeof(SparseReplyHeader);

inline bool sparse_rows_inline(uint64_t count) {
  return sizeof(SparseRequestHeader) + count * sizeof(int64_t) <= kRequestMessageBytes;
}
inline bool sparse_op_valid(uint32_t op) {
  return op >= 1 && op <= 7;
}
inline bool sparse_op_carries_values(SparseOp op) {
  return op == SparseOp::kPush || op == SparseOp::kLoad || op == SparseOp::kFlush ||
         op == SparseOp::kReplicate;
}
// Pushes and copies get no reply: the sender goes on once they are sent.
inline bool sparse_op_answered(SparseOp op) {
  return op != SparseOp::kPush && op != SparseOp::kReplicate;
}
// The values a request carries per row: its width, and a copy's optimizer state besides.
inline uint64_t sparse_row_values(SparseOp op, uint64_t width, uint64_t slots) {
  return op == SparseOp::kReplicate ? width * (1 + slots) : width;
}
inline bool sparse_op_returns_rows(SparseOp op) {
  return op == SparseOp::kPull || op == SparseOp::kRead;
}
// Bytes of one value of an operation's rows: pulls and pushes carry the variable's wire
// dtype (step_value_bytes: 4, or 2 for bf16/f16, sharding/wire_values.h); loads and reads
// are always f32.
inline uint64_t sparse_value_bytes(SparseOp op, uint64_t step_value_bytes) {
  return op == SparseOp::kPull || op == SparseOp::kPush ? step_value_bytes : 4;
}
inline uint64_t sparse_payload_bytes(SparseOp op, uint64_t count, uint64_t dim,
                                     uint64_t step_value_bytes = 4) {
  return count * 8 + (sparse_op_carries_values(op)
                          ? count * dim * sparse_value_bytes(op, step_value_bytes)
                          : 0);
}
// The second part of a pull served ahead: `pending` rows' positions and values.
inline uint64_t sparse_rest_bytes(uint64_t pending, uint64_t dim, uint64_t step_value_bytes) {
  return sizeof(SparseReplyHeader) + pending * (8 + dim * step_value_bytes);
}
// 0: no reply.
inline uint64_t sparse_reply_bytes(SparseOp op, uint64_t count, uint64_t dim,
                                   uint64_t step_value_bytes = 4) {
  if (!sparse_op_answered(op)) return 0;
  return sizeof(SparseReplyHeader) +
         (sparse_op_returns_rows(op) ? count * dim * sparse_value_bytes(op, step_value_bytes) : 0);
}
inline const char* sparse_op_name(SparseOp op) {
  switch (op) {
    case SparseOp::kPull:
      return "pull";
    case SparseOp::kPush:
      return "push";
    case SparseOp::kLoad:
      return "load";
    case SparseOp::kRead:
      return "read";
    case SparseOp::kCheckpoint:
      return "checkpoint";
    case SparseOp::kFlush:
      return "flush";
    case SparseOp::kReplicate:
      return "replicate";
  }
  return "?";
}

}  // namespace px
