// Fuzz target: the sparse wire header parser, what an owner does with the first message of
// another node's sparse request (transport/fabric/sparse_wire.h): check_sparse_request
// (daemon/sparse/sparse_channel.cc) checks the header and the inline rows before anything
// is sized from them; a request it accepts then goes, as SparseChannel delivers it, to a
// real ShardOwner (daemon/sparse/shard_owner.cc), which checks the partition, the group and
// every row before touching its store.
//
// Contract: no crash, no sanitizer report, no leak. An accepted header has a known
// operation, names the node it came from, and the message is exactly the header plus its
// inline rows; every size derived from it (rows, values, reply, payload) is computed
// without wrapping, matches payload_bytes, and stays within the largest variable (2^40
// bytes). The owner answers every request it is handed PX_OK or PX_ERR_PROTOCOL, and a
// pull or read it serves from a fresh table reads zeros.
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "daemon/common/thread_pool.h"
#include "daemon/sparse/shard_owner.h"
#include "daemon/sparse/sparse_channel.h"
#include "fuzz_check.h"
#include "fuzz_inputs.h"

namespace px::fuzz {
namespace {

using u128 = unsigned __int128;

constexpr u128 kMaxVariableBytes = u128(1) << 40;
constexpr uint64_t kTableRows = 50;
constexpr uint32_t kTablePartitions = 8;
constexpr uint64_t kOwnerMaxDim = 4;  // keeps the owner's work inline (no pool round trip)

void check_sizes(const SparseRequestHeader& h, size_t bytes, int peer, uint64_t dim) {
  PX_FUZZ_CHECK(bytes >= sizeof h && bytes <= kRequestMessageBytes);
  PX_FUZZ_CHECK(sparse_op_valid(h.op));
  PX_FUZZ_CHECK(h.from_node == static_cast<uint32_t>(peer));
  auto op = static_cast<SparseOp>(h.op);
  u128 index_bytes = u128(h.count) * 8;
  u128 value_bytes = u128(h.count) * dim * 4;
  u128 payload = index_bytes + (sparse_op_carries_values(op) ? value_bytes : 0);
  u128 reply = !sparse_op_answered(op) ? 0 : 8 + (sparse_op_returns_rows(op) ? value_bytes : 0);
  PX_FUZZ_CHECK(value_bytes <= kMaxVariableBytes);
  PX_FUZZ_CHECK(payload == h.payload_bytes);
  PX_FUZZ_CHECK(reply == sparse_reply_bytes(op, h.count, dim));
  u128 inline_bytes = sparse_rows_inline(h.count) ? index_bytes : 0;
  PX_FUZZ_CHECK(u128(bytes) == sizeof h + inline_bytes);
}

struct Outcome {
  bool done = false;
  px_status status = PX_OK;
};

// Hands the request to a fresh owner of node 0's partitions, as SparseChannel::deliver_ready
// does, and checks what comes back.
void to_owner(const SparseRequestHeader& h, const char* first, uint64_t dim, uint8_t knobs) {
  static ThreadPool pool(1);  // idle: the owner's work stays inline at these sizes
  std::deque<std::function<void()>> posted;
  SparseOptions options;
  options.consistency = static_cast<Consistency>(knobs % 3);
  options.optimizer = static_cast<Optimizer>((knobs / 3) % 3);
  options.learning_rate = 0.5;
  PartitionMap map(kTableRows, kTablePartitions, kSparseNodes);
  ShardOwner owner("fuzz", map, 0, dim, options, kSparseNodes, pool,
                   [&posted](std::function<void()> fn) { posted.push_back(std::move(fn)); });
  std::vector<int64_t> rows(h.count);
  if (h.count) std::memcpy(rows.data(), first + sizeof h, h.count * sizeof(int64_t));
  auto op = static_cast<SparseOp>(h.op);
  std::vector<float> values(sparse_op_carries_values(op) ? h.count * dim : 0, 1.0f);
  std::vector<float> out(sparse_op_returns_rows(op) ? h.count * dim : 0, -1.0f);
  Outcome outcome;
  ShardRequest r;
  r.from_node = static_cast<int>(h.from_node);
  r.op = op;
  r.partition = h.partition;
  r.groups = h.groups;
  r.step = h.step;
  r.count = h.count;
  r.rows = rows.data();
  r.values = values.empty() ? nullptr : values.data();
  r.out = out.empty() ? nullptr : out.data();
  r.done = [&outcome](px_status status, const std::string&) {
    PX_FUZZ_CHECK(!outcome.done);
    outcome.done = true;
    outcome.status = status;
  };
  owner.handle(std::move(r));
  while (!posted.empty()) {
    auto fn = std::move(posted.front());
    posted.pop_front();
    fn();
  }
  if (!outcome.done) return;  // a pull of a step not applied yet waits
  PX_FUZZ_CHECK(outcome.status == PX_OK || outcome.status == PX_ERR_PROTOCOL);
  if (outcome.status == PX_OK && sparse_op_returns_rows(op))
    for (float v : out) PX_FUZZ_CHECK(v == 0.0f);
}

}  // namespace
}  // namespace px::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace px::fuzz;
  if (size < kSparsePrefix) return 0;
  int peer = data[0] % kSparseNodes;
  uint8_t knobs = data[0] / kSparseNodes;
  uint64_t dim = 0;
  for (int i = 0; i < 8; ++i) dim |= static_cast<uint64_t>(data[1 + i]) << (8 * i);
  dim = 1 + dim % kSparseMaxDim;
  size_t bytes = size - kSparsePrefix;
  if (bytes > px::kRequestMessageBytes) bytes = px::kRequestMessageBytes;
  // The receive buffer is kRequestMessageBytes long, as SparseChannel's; the message fills
  // its start.
  std::vector<char> first(px::kRequestMessageBytes, 0);
  std::memcpy(first.data(), data + kSparsePrefix, bytes);
  px::SparseRequestHeader h{};
  std::string bad = px::check_sparse_request(first.data(), bytes, peer, dim, &h);
  if (!bad.empty()) return 0;
  check_sizes(h, bytes, peer, dim);
  // Checkpoint requests write a file at the path they carry: never from a fuzzer.
  if (dim <= kOwnerMaxDim && px::sparse_rows_inline(h.count) &&
      h.op != static_cast<uint16_t>(px::SparseOp::kCheckpoint))
    to_owner(h, first.data(), dim, knobs);
  return 0;
}
