// What each client operation (Opcode) is to the daemon, in one table: its name in
// messages, whether it is a step, which variables take it, and the inter-daemon values it
// maps to (its SparseOp request, its fabric TagKind).
//
// Opcode, SparseOp and TagKind stay three enums, each with one home, because they are three
// wire namespaces with their own values: Opcode (transport/ipc/shm_layout.h) is the client
// ring's value and part of the ABI; SparseOp (transport/fabric/sparse_wire.h) is the value in
// a sparse request header between daemons, and covers checkpoints, which no client submits;
// TagKind (transport/collectives/collective_transport.h) is a tag namespace, also taken by
// messages that are no operation (sparse requests, replies, counts). One merged enum would
// change one of those wire values or give one name to different things; this table is the
// only place that translates between them.
#pragma once

#include <cstdint>

#include "transport/collectives/collective_transport.h"
#include "transport/fabric/sparse_wire.h"
#include "transport/ipc/shm_layout.h"

namespace px {

// Which variables take an operation.
enum class OperandKind : uint8_t { kBarrier, kDense, kSparse };

struct OperationInfo {
  const char* name = nullptr;  // null: not an opcode
  OperandKind operand = OperandKind::kDense;
  // Matched across the local workers and numbered (the n-th on a variable is step n); the
  // others (sparse load and read) run for one worker alone.
  bool step = true;
  SparseOp sparse_op = SparseOp::kPull;  // kSparse only: the request to the owners
  TagKind tag = TagKind::kAllreduce;     // dense and barrier: the cross-node tags
};

namespace detail {
inline constexpr OperationInfo kOperations[] = {
    {},  // 0 is no opcode
    {"allreduce", OperandKind::kDense, true, SparseOp::kPull, TagKind::kAllreduce},
    {"barrier", OperandKind::kBarrier, true, SparseOp::kPull, TagKind::kBarrier},
    {"pull", OperandKind::kSparse, true, SparseOp::kPull, TagKind::kSparseRequest},
    {"push", OperandKind::kSparse, true, SparseOp::kPush, TagKind::kSparseRequest},
    {"load", OperandKind::kSparse, false, SparseOp::kLoad, TagKind::kSparseRequest},
    {"read", OperandKind::kSparse, false, SparseOp::kRead, TagKind::kSparseRequest},
    {"broadcast", OperandKind::kDense, true, SparseOp::kPull, TagKind::kBroadcast},
    {"allgather", OperandKind::kDense, true, SparseOp::kPull, TagKind::kAllgather},
    {"allgatherv", OperandKind::kDense, true, SparseOp::kPull, TagKind::kAllgatherv},
    {"reduce_scatter", OperandKind::kDense, true, SparseOp::kPull, TagKind::kReduceScatter},
    {"alltoall", OperandKind::kDense, true, SparseOp::kPull, TagKind::kAlltoall},
};
constexpr uint16_t kOperationCount = sizeof kOperations / sizeof kOperations[0];
static_assert(kOperations[static_cast<uint16_t>(Opcode::kAllgatherv)].tag == TagKind::kAllgatherv);
static_assert(kOperations[static_cast<uint16_t>(Opcode::kAlltoall)].tag == TagKind::kAlltoall);
static_assert(kOperations[static_cast<uint16_t>(Opcode::kReadRows)].sparse_op == SparseOp::kRead);
}  // namespace detail

// The row for opcode (a client's value, unchecked): name is null for none.
inline const OperationInfo& operation_info(uint16_t opcode) {
  return opcode < detail::kOperationCount ? detail::kOperations[opcode] : detail::kOperations[0];
}
inline const OperationInfo& operation_info(Opcode opcode) {
  return operation_info(static_cast<uint16_t>(opcode));
}

}  // namespace px
