#include "daemon/sparse/sparse_channel.h"

#include <algorithm>
#include <cstring>

#include "daemon/common/log.h"
#include "transport/kernels/uninit_vector.h"

namespace px {
namespace {

constexpr uint64_t kFirstPart = 0, kRowsPart = 1, kValuesPart = 2;
constexpr uint64_t kMaxChunks = 1ull << (kTagAlgorithmBits - 2);
// Largest request accepted from the network (rows per request).
constexpr uint64_t kMaxRequestRows = 1ull << 32;
// ... and values (rows x dim): no more than the largest variable holds (2^40 bytes, the
// session's limit). Without it a few rows of a wide variable asked for terabytes, and
// count x dim x 4 could wrap, so a payload_bytes equal to the wrapped value passed (found by
// tests/fuzz/sparse_header_fuzz.cc; regressions/sparse_header).
constexpr uint64_t kMaxRequestValues = (1ull << 40) / sizeof(float);

}  // namespace

std::string check_sparse_request(const char* first, size_t bytes, int peer, size_t dim,
                                 SparseRequestHeader* header, size_t step_value_bytes) {
  SparseRequestHeader& h = *header;
  h = SparseRequestHeader{};
  std::memcpy(&h, first, std::min(bytes, sizeof h));
  size_t inline_bytes = sparse_rows_inline(h.count) ? h.count * sizeof(int64_t) : 0;
  if (bytes < sizeof h) return std::to_string(bytes) + " bytes, shorter than a header";
  if (!sparse_op_valid(h.op)) return "unknown operation " + std::to_string(h.op);
  if ((h.flags & ~(kCompactReply | kLayoutOdd)) != 0)
    return "unknown flags " + std::to_string(h.flags);
  if (h.from_node != static_cast<uint32_t>(peer))
    return "claims to come from node " + std::to_string(h.from_node);
  if (h.count > kMaxRequestRows || h.count > kMaxRequestValues / std::max<size_t>(dim, 1))
    return std::to_string(h.count) + " rows of " + std::to_string(dim) + " values";
  if (h.payload_bytes !=
      sparse_payload_bytes(static_cast<SparseOp>(h.op), h.count, dim, step_value_bytes))
    return "payload of " + std::to_string(h.payload_bytes) + " bytes for " +
           std::to_string(h.count) + " rows";
  if (bytes != sizeof h + inline_bytes)
    return std::to_string(bytes) + " bytes for a header and " +
           std::to_string(inline_bytes / sizeof(int64_t)) + " inline rows";
  return "";
}

// A request from another node, from its header until the reply left.
struct SparseChannel::Incoming {
  SparseRequestHeader header{};
  uint64_t seq = 0;
  UninitVector<int64_t> rows;  // all three are received or gathered whole
  UninitVector<float> values;
  UninitVector<float> reply;  // kReplyHeadroom for the status, then the rows (pull, read)
  // 16-bit wire dtypes: a push's gradients as received, a pull's reply as sent.
  UninitVector<uint16_t> wire_values;
  UninitVector<char> wire_reply;
  // A pull served ahead: the positions its first reply lacked, and the second reply.
  bool ahead = false;
  std::vector<size_t> pending;
  UninitVector<char> rest;
  std::atomic<int> parts_left{0};
  bool received = false;  // every part arrived (loop thread)
  // A part failed (set by the transport's one progress thread before the last part's
  // completion is posted to the loop).
  bool failed = false;
  std::string error;
};

// A request to another node, from its first message until its reply is in.
struct SparseChannel::Call {
  UninitVector<char> first;            // header + inline rows
  UninitVector<uint16_t> wire_values;  // a push's gradients packed to the wire dtype
  UninitVector<char> wire_reply;       // a pull's reply in the wire dtype, unpacked into out
  UninitVector<char> rest;             // a pull served ahead: its pending rows (reply part 1)
  float* out = nullptr;
  SparseReplyHeader reply{};
  const char* reply_at = nullptr;  // where the reply's status lands
  bool compact = false;            // kCompactReply asked: the first part is one message
  size_t reply_got = 0;            // ... of this length
  std::atomic<int> left{0};
  std::mutex mutex;
  std::string error;
  std::shared_ptr<void> keep_alive;
  StatusCallback done;
};

SparseChannel::SparseChannel(CollectiveTransport* fabric, int node, int nodes,
                             std::vector<size_t> widths, size_t chunk_bytes,
                             std::shared_ptr<ShardOwner> owner, PostToLoop post,
                             std::function<std::string(int)> node_label, WireDtype wire,
                             bool prefetch)
    : fabric_(fabric),
      node_(node),
      nodes_(nodes),
      widths_(std::move(widths)),
      chunk_bytes_(std::max<size_t>(4096, chunk_bytes)),
      wire_(wire),
      step_value_bytes_(wire_value_bytes(wire)),
      prefetch_(prefetch),
      owner_(std::move(owner)),
      post_(std::move(post)),
      node_label_(std::move(node_label)),
      next_seq_to_(new std::atomic<uint64_t>[static_cast<size_t>(nodes)]()),
      peers_(static_cast<size_t>(nodes)) {}

size_t SparseChannel::chunk_size(size_t bytes) const {
  // Both sides derive it from the size alone; huge payloads get larger chunks so the
  // chunk index fits its tag bits.
  return std::max(chunk_bytes_, (bytes + kMaxChunks - 1) / kMaxChunks);
}

size_t SparseChannel::chunks(size_t bytes) const {
  return bytes == 0 ? 0 : (bytes + chunk_size(bytes) - 1) / chunk_size(bytes);
}

void SparseChannel::send_part(int peer, uint64_t tag, uint64_t part, const void* data, size_t bytes,
                              uint8_t priority, const TransferCallback& done) {
  size_t chunk = chunk_size(bytes);
  for (size_t i = 0, at = 0; at < bytes; ++i, at += chunk)
    fabric_->send(peer, tag | part | (i << 2), static_cast<const char*>(data) + at,
                  std::min(chunk, bytes - at), priority, done);
}

void SparseChannel::recv_part(int peer, uint64_t tag, uint64_t part, void* data, size_t bytes,
                              const TransferCallback& done) {
  size_t chunk = chunk_size(bytes);
  for (size_t i = 0, at = 0; at < bytes; ++i, at += chunk)
    fabric_->recv(peer, tag | part | (i << 2), static_cast<char*>(data) + at,
                  std::min(chunk, bytes - at), done);
}

void SparseChannel::start(uint32_t global_id) {
  if (!fabric_ || global_id_ != 0) return;
  global_id_ = global_id;
  for (int peer = 0; peer < nodes_; ++peer)
    if (peer != node_) post_first(peer);
}

void SparseChannel::request(int to, uint32_t partition, uint32_t groups, SparseOp op, uint64_t step,
                            uint8_t priority, size_t count, const int64_t* rows,
                            const float* values, float* out, std::shared_ptr<void> keep_alive,
                            StatusCallback done) {
  if (to == node_) {
    ShardRequest r;
    r.from_node = node_;
    r.op = op;
    r.partition = partition;
    r.groups = groups;
    r.step = step;
    r.count = count;
    r.rows = rows;
    r.values = values;
    r.out = out;
    r.keep_alive = std::move(keep_alive);
    r.done = std::move(done);
    owner_->handle(std::move(r));
    return;
  }
  // Remote: the reply's receives first (so the reply never waits as an unexpected
  // message), then the request's messages; done once every part finished.
  auto call = std::make_shared<Call>();
  // Values per row node `to` holds (and, a copy's, their optimizer state).
  size_t width = sparse_row_values(op, widths_[static_cast<size_t>(to)], state_slots_);
  SparseRequestHeader header{};
  header.op = static_cast<uint16_t>(op);
  header.priority = priority;
  size_t reply_bytes =
      sparse_reply_bytes(op, count, widths_[static_cast<size_t>(to)], step_value_bytes_);
  bool compact = prefetch_ && op == SparseOp::kPull && reply_bytes <= chunk_bytes_;
  header.flags =
      static_cast<uint8_t>((compact ? kCompactReply : 0) | (layout_odd_ ? kLayoutOdd : 0));
  header.from_node = static_cast<uint32_t>(node_);
  header.partition = partition;
  header.groups = groups;
  header.step = step;
  header.count = count;
  header.payload_bytes = sparse_payload_bytes(op, count, width, step_value_bytes_);
  size_t index_bytes = count * sizeof(int64_t);
  bool rows_inline = sparse_rows_inline(count);
  call->first.resize(sizeof header + (rows_inline ? index_bytes : 0));
  std::memcpy(call->first.data(), &header, sizeof header);
  if (rows_inline && index_bytes > 0)
    std::memcpy(call->first.data() + sizeof header, rows, index_bytes);
  call->keep_alive = std::move(keep_alive);
  call->done = std::move(done);
  uint64_t seq = next_seq_to_[static_cast<size_t>(to)].fetch_add(1);
  uint64_t request_tag = make_tag(TagKind::kSparseRequest, global_id_, seq);
  uint64_t reply_tag = make_tag(TagKind::kSparseReply, global_id_, seq);
  char* reply_at = sparse_op_returns_rows(op) ? reinterpret_cast<char*>(out) - kReplyHeadroom
                                              : reinterpret_cast<char*>(&call->reply);
  size_t values_out =
      sparse_op_carries_values(op) ? count * width * sparse_value_bytes(op, step_value_bytes_) : 0;
  const void* values_at = values;
  if (packs(op) && op == SparseOp::kPush) {
    // On the pool for a push (the router's request()): packing is a pass over the values.
    call->wire_values.resize(count * width);
    pack_wire(wire_, values, count * width, call->wire_values.data());
    values_at = call->wire_values.data();
  } else if (packs(op)) {
    call->wire_reply.resize(reply_bytes);
    reply_at = call->wire_reply.data();
    call->out = out;
  }
  call->reply_at = reply_at;
  int parts = static_cast<int>(1 + (rows_inline ? 0 : chunks(index_bytes)) + chunks(values_out) +
                               chunks(reply_bytes));
  call->left.store(parts);
  bytes_sent_ += sizeof(SparseRequestHeader) + header.payload_bytes;
  bytes_received_ += reply_bytes;
  auto self = shared_from_this();
  WireDtype wire = wire_;
  size_t reply_values = count * width;
  auto part_done = [self, call, to, wire, reply_values, reply_tag, op, count, width](
                       bool ok, const std::string& error) {
    if (!ok) {
      std::lock_guard<std::mutex> lock(call->mutex);
      if (call->error.empty()) call->error = error.empty() ? "transfer failed" : error;
    }
    if (call->left.fetch_sub(1) != 1) return;
    self->post_([self, call, to, wire, reply_values, reply_tag, op, count, width] {
      if (!call->error.empty())
        return call->done(PX_ERR_PEER_LOST,
                          "a transfer with " + self->node_label_(to) + " failed: " + call->error);
      auto bad_length = [&] {
        call->done(PX_ERR_PROTOCOL, self->node_label_(to) + " replied " +
                                        std::to_string(call->reply_got) + " bytes to a pull of " +
                                        std::to_string(count) + " rows");
      };
      size_t full = sparse_reply_bytes(op, count, width, self->step_value_bytes_);
      if (call->compact && call->reply_got < sizeof(SparseReplyHeader)) return bad_length();
      SparseReplyHeader reply;
      std::memcpy(&reply, call->reply_at, sizeof reply);
      if (reply.status != PX_OK)
        return call->done(static_cast<px_status>(reply.status),
                          self->node_label_(to) + " refused the request (its log says why)");
      if (reply.pending_rows > 0) {
        if (op != SparseOp::kPull || reply.pending_rows > count)
          return call->done(PX_ERR_PROTOCOL, self->node_label_(to) + " replied with " +
                                                 std::to_string(reply.pending_rows) +
                                                 " rows pending to a " + sparse_op_name(op) +
                                                 " of " + std::to_string(count) + " rows");
        size_t compact =
            sparse_reply_bytes(op, count - reply.pending_rows, width, self->step_value_bytes_);
        if (call->compact && call->reply_got != full && call->reply_got != compact)
          return bad_length();
        return self->receive_rest(to, call, reply_tag, reply.pending_rows, count, width);
      }
      if (call->compact && call->reply_got != full) return bad_length();
      if (!call->wire_reply.empty())
        unpack_wire(wire,
                    reinterpret_cast<const uint16_t*>(call->wire_reply.data() + kReplyHeadroom),
                    reply_values, call->out);
      call->done(PX_OK, "");
    });
  };
  if (compact) {
    // One message of at most reply_bytes: the whole reply, or a compact one (checked when in).
    call->compact = true;
    fabric_->recv_message(to, reply_tag | kFirstPart, reply_at, reply_bytes,
                          [call, part_done](bool ok, size_t bytes, const std::string& error) {
                            call->reply_got = bytes;
                            part_done(ok, error);
                          });
  } else {
    recv_part(to, reply_tag, kFirstPart, reply_at, reply_bytes, part_done);
  }
  fabric_->send(to, request_tag | kFirstPart, call->first.data(), call->first.size(), priority,
                part_done);
  if (!rows_inline) send_part(to, request_tag, kRowsPart, rows, index_bytes, priority, part_done);
  send_part(to, request_tag, kValuesPart, values_at, values_out, priority, part_done);
}

void SparseChannel::post_first(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.first.empty()) p.first.resize(kRequestMessageBytes);
  auto self = shared_from_this();
  fabric_->recv_message(
      peer, make_tag(TagKind::kSparseRequest, global_id_, p.seq) | kFirstPart, p.first.data(),
      p.first.size(), [self, peer](bool ok, size_t bytes, const std::string& error) {
        self->post_([self, peer, ok, bytes, error] { self->on_first(peer, ok, bytes, error); });
      });
}

void SparseChannel::on_first(int peer, bool ok, size_t bytes, const std::string& error) {
  if (!ok) {
    PX_LOG_DEBUG_AT(peer_fields(peer), "sparse requests from %s stop: %s",
                    node_label_(peer).c_str(), error.c_str());
    return;
  }
  Peer& p = peers_[static_cast<size_t>(peer)];
  // What this node's shard holds per row, in the layout the request is for.
  size_t width = widths_[static_cast<size_t>(node_)];
  if (bytes >= sizeof(SparseRequestHeader) && !next_widths_.empty()) {
    SparseRequestHeader peek;
    std::memcpy(&peek, p.first.data(), sizeof peek);
    if (((peek.flags & kLayoutOdd) != 0) != layout_odd_)
      width = next_widths_[static_cast<size_t>(node_)];
  }
  if (bytes >= sizeof(SparseRequestHeader)) {
    SparseRequestHeader peek;
    std::memcpy(&peek, p.first.data(), sizeof peek);
    if (peek.op == static_cast<uint16_t>(SparseOp::kReplicate))
      width = sparse_row_values(SparseOp::kReplicate, width, state_slots_);
  }
  SparseRequestHeader h{};
  std::string bad = check_sparse_request(p.first.data(), bytes, peer, width, &h, step_value_bytes_);
  if (!bad.empty()) {
    // The stream from that node cannot be trusted any further: stop reading it.
    PX_LOG_ERROR_AT(peer_fields(peer),
                    "malformed sparse request from %s (%s); ignoring that node's requests",
                    node_label_(peer).c_str(), bad.c_str());
    return;
  }
  auto in = std::make_shared<Incoming>();
  in->header = h;
  in->seq = p.seq++;
  SparseOp op = static_cast<SparseOp>(h.op);
  in->rows.resize(h.count);
  size_t index_bytes = h.count * sizeof(int64_t);
  bool rows_inline = sparse_rows_inline(h.count);
  if (rows_inline && index_bytes > 0)
    std::memcpy(in->rows.data(), p.first.data() + sizeof h, index_bytes);
  if (sparse_op_carries_values(op)) in->values.resize(h.count * width);
  if (packs(op) && op == SparseOp::kPush) in->wire_values.resize(h.count * width);
  // The owner gathers f32 rows into reply; reply() packs them when the wire dtype is 16-bit.
  in->reply.resize(sparse_reply_bytes(op, h.count, width) / sizeof(float));
  bytes_received_ += sizeof h + h.payload_bytes;
  p.in_order.push_back(in);
  uint64_t tag = make_tag(TagKind::kSparseRequest, global_id_, in->seq);
  bool packed = !in->wire_values.empty();
  void* values_at = packed ? static_cast<void*>(in->wire_values.data()) : in->values.data();
  size_t value_bytes =
      packed ? in->wire_values.size() * sizeof(uint16_t) : in->values.size() * sizeof(float);
  int parts = static_cast<int>((rows_inline ? 0 : chunks(index_bytes)) + chunks(value_bytes));
  if (parts == 0) {
    in->received = true;
  } else {
    in->parts_left.store(parts);
    auto self = shared_from_this();
    auto part_done = [self, in, peer](bool ok, const std::string& error) {
      if (!ok && !in->failed) {
        in->failed = true;
        in->error = error;
      }
      if (in->parts_left.fetch_sub(1) != 1) return;
      self->post_([self, in, peer] {
        if (!in->wire_values.empty() && !in->failed) {
          unpack_wire(self->wire_, in->wire_values.data(), in->wire_values.size(),
                      in->values.data());
          in->wire_values = {};
        }
        in->received = true;
        self->deliver_ready(peer);
      });
    };
    if (!rows_inline) recv_part(peer, tag, kRowsPart, in->rows.data(), index_bytes, part_done);
    recv_part(peer, tag, kValuesPart, values_at, value_bytes, part_done);
  }
  post_first(peer);
  deliver_ready(peer);
}

void SparseChannel::expect_layout(std::vector<size_t> widths) {
  next_widths_ = std::move(widths);
}

void SparseChannel::switch_layout(std::shared_ptr<ShardOwner> owner) {
  owner_ = std::move(owner);
  widths_ = std::move(next_widths_);
  next_widths_.clear();
  layout_odd_ = !layout_odd_;
  for (int peer = 0; peer < nodes_; ++peer)
    if (peer != node_) deliver_ready(peer);
}

void SparseChannel::abandon() {
  std::vector<std::deque<std::shared_ptr<Incoming>>> received;
  for (Peer& p : peers_) received.push_back(std::move(p.in_order));
  for (Peer& p : peers_) p.in_order.clear();
  if (owner_) owner_->abandon();
}

// Hands received requests to the owner in the order the peer sent them.
void SparseChannel::deliver_ready(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  while (!p.in_order.empty() && p.in_order.front()->received) {
    std::shared_ptr<Incoming> in = p.in_order.front();
    // For the layout after a move this node has not finished: it waits for switch_layout.
    if (((in->header.flags & kLayoutOdd) != 0) != layout_odd_) return;
    p.in_order.pop_front();
    if (in->failed) {
      // The peer is gone (its own operations fail there) or sent a part of the wrong size.
      PX_LOG_WARN_AT(peer_fields(peer), "sparse %s request from %s dropped: %s",
                     sparse_op_name(static_cast<SparseOp>(in->header.op)),
                     node_label_(peer).c_str(), in->error.c_str());
      if (sparse_op_answered(static_cast<SparseOp>(in->header.op)))
        reply(peer, in, PX_ERR_PROTOCOL);
      continue;
    }
    ShardRequest r;
    r.from_node = peer;
    r.op = static_cast<SparseOp>(in->header.op);
    r.partition = in->header.partition;
    r.groups = in->header.groups;
    r.step = in->header.step;
    r.count = in->header.count;
    r.rows = in->rows.data();
    r.values = in->values.empty() ? nullptr : in->values.data();
    r.out =
        sparse_op_returns_rows(r.op) ? in->reply.data() + kReplyHeadroom / sizeof(float) : nullptr;
    r.keep_alive = in;
    if (sparse_op_answered(r.op)) {
      auto self = shared_from_this();
      r.done = [self, peer, in](px_status status, const std::string&) {
        if (in->ahead) return self->reply_rest(peer, in, status);
        self->reply(peer, in, status);
      };
    }
    if (r.op == SparseOp::kPull) {
      auto self = shared_from_this();
      r.early = [self, peer, in](std::vector<size_t> pending) {
        // (Past 2^32 pending rows the whole reply waits: the header counts in 32 bits.)
        if (!pending.empty() && pending.size() <= UINT32_MAX)
          self->reply_ahead(peer, in, std::move(pending));
      };
    }
    owner_->handle(std::move(r));
  }
}

void SparseChannel::reply(int peer, const std::shared_ptr<Incoming>& in, px_status status) {
  uint64_t tag = make_tag(TagKind::kSparseReply, global_id_, in->seq);
  SparseReplyHeader header{};
  header.status = status;
  // Rows are sent even when refused, so the requester's posted receives complete (zeros
  // then: the buffer was never filled).
  if (status != PX_OK) std::fill(in->reply.begin(), in->reply.end(), 0.0f);
  std::memcpy(in->reply.data(), &header, sizeof header);
  auto keep = [in](bool, const std::string&) {};
  const void* data = in->reply.data();
  size_t bytes = in->reply.size() * sizeof(float);
  if (packs(static_cast<SparseOp>(in->header.op))) {
    // The rows were rounded to the wire dtype where they were gathered (ShardOwner::serve).
    size_t values = in->reply.size() - kReplyHeadroom / sizeof(float);
    in->wire_reply.resize(kReplyHeadroom + values * sizeof(uint16_t));
    std::memcpy(in->wire_reply.data(), &header, sizeof header);
    pack_wire(wire_, in->reply.data() + kReplyHeadroom / sizeof(float), values,
              reinterpret_cast<uint16_t*>(in->wire_reply.data() + kReplyHeadroom));
    data = in->wire_reply.data();
    bytes = in->wire_reply.size();
  }
  // At the request's priority: a pull's rows are what its worker waits for. A requester
  // that asked for a compact reply posted one receive for it, whatever its size.
  if (in->header.flags & kCompactReply)
    fabric_->send(peer, tag | kFirstPart, data, bytes, in->header.priority, keep);
  else
    send_part(peer, tag, kFirstPart, data, bytes, in->header.priority, keep);
  bytes_sent_ += bytes;
}

void SparseChannel::reply_ahead(int peer, const std::shared_ptr<Incoming>& in,
                                std::vector<size_t> pending) {
  size_t width = widths_[static_cast<size_t>(node_)];
  const float* rows = in->reply.data() + kReplyHeadroom / sizeof(float);
  in->ahead = true;
  in->pending = std::move(pending);
  // The first part goes from a copy: the owner gathers the pending rows into in->reply while
  // it is sent. Compact: without the pending rows' places, as one message (the requester
  // posted one receive, for the whole reply's size at most); otherwise with zeros in them,
  // in chunks as every reply (the requester overwrites them from part 1).
  bool compact = in->header.flags & kCompactReply;
  size_t value_bytes = packs(SparseOp::kPull) ? step_value_bytes_ : sizeof(float);
  size_t count = in->header.count;
  size_t places = compact ? count - in->pending.size() : count;
  in->wire_reply.resize(kReplyHeadroom + places * width * value_bytes);
  SparseReplyHeader header{};
  header.status = PX_OK;
  header.pending_rows = static_cast<uint32_t>(in->pending.size());
  std::memcpy(in->wire_reply.data(), &header, sizeof header);
  char* to = in->wire_reply.data() + kReplyHeadroom;
  size_t row_bytes = width * value_bytes;
  size_t next = 0;
  for (size_t i = 0; i < count; ++i) {
    if (next < in->pending.size() && in->pending[next] == i) {
      ++next;
      if (!compact) {
        std::memset(to, 0, row_bytes);
        to += row_bytes;
      }
      continue;
    }
    if (value_bytes == sizeof(float))
      std::memcpy(to, rows + i * width, row_bytes);
    else
      pack_wire(wire_, rows + i * width, width, reinterpret_cast<uint16_t*>(to));
    to += row_bytes;
  }
  auto keep = [in](bool, const std::string&) {};
  uint64_t tag = make_tag(TagKind::kSparseReply, global_id_, in->seq);
  if (compact)
    fabric_->send(peer, tag | kFirstPart, in->wire_reply.data(), in->wire_reply.size(),
                  in->header.priority, keep);
  else
    send_part(peer, tag, kFirstPart, in->wire_reply.data(), in->wire_reply.size(),
              in->header.priority, keep);
  bytes_sent_ += in->wire_reply.size();
}

void SparseChannel::reply_rest(int peer, const std::shared_ptr<Incoming>& in, px_status status) {
  uint64_t tag = make_tag(TagKind::kSparseReply, global_id_, in->seq);
  size_t width = widths_[static_cast<size_t>(node_)];
  size_t k = in->pending.size();
  size_t value_bytes = packs(SparseOp::kPull) ? step_value_bytes_ : sizeof(float);
  in->rest.resize(sparse_rest_bytes(k, width, value_bytes));
  std::fill(in->rest.begin(), in->rest.end(), 0);
  SparseReplyHeader header{};
  header.status = status;
  std::memcpy(in->rest.data(), &header, sizeof header);
  char* positions = in->rest.data() + sizeof header;
  char* values = positions + k * sizeof(uint64_t);
  const float* rows = in->reply.data() + kReplyHeadroom / sizeof(float);
  for (size_t j = 0; j < k && status == PX_OK; ++j) {
    uint64_t at = in->pending[j];
    std::memcpy(positions + j * sizeof(uint64_t), &at, sizeof at);
    const float* row = rows + at * width;
    char* to = values + j * width * value_bytes;
    if (value_bytes == sizeof(float))
      std::memcpy(to, row, width * sizeof(float));
    else
      pack_wire(wire_, row, width, reinterpret_cast<uint16_t*>(to));
  }
  auto keep = [in](bool, const std::string&) {};
  send_part(peer, tag, kRowsPart, in->rest.data(), in->rest.size(), in->header.priority, keep);
  bytes_sent_ += in->rest.size();
}

void SparseChannel::receive_rest(int to, const std::shared_ptr<Call>& call, uint64_t reply_tag,
                                 size_t pending, size_t count, size_t width) {
  size_t value_bytes = packs(SparseOp::kPull) ? step_value_bytes_ : sizeof(float);
  size_t bytes = sparse_rest_bytes(pending, width, value_bytes);
  call->rest.resize(bytes);
  call->left.store(static_cast<int>(chunks(bytes)));
  bytes_received_ += bytes;
  auto self = shared_from_this();
  auto part_done = [self, call, to, pending, count, width, value_bytes](bool ok,
                                                                        const std::string& error) {
    if (!ok) {
      std::lock_guard<std::mutex> lock(call->mutex);
      if (call->error.empty()) call->error = error.empty() ? "transfer failed" : error;
    }
    if (call->left.fetch_sub(1) != 1) return;
    self->post_([self, call, to, pending, count, width, value_bytes] {
      if (!call->error.empty())
        return call->done(PX_ERR_PEER_LOST,
                          "a transfer with " + self->node_label_(to) + " failed: " + call->error);
      SparseReplyHeader header;
      std::memcpy(&header, call->rest.data(), sizeof header);
      if (header.status != PX_OK)
        return call->done(static_cast<px_status>(header.status),
                          self->node_label_(to) + " refused the request (its log says why)");
      float* out =
          call->out ? call->out
                    : reinterpret_cast<float*>(const_cast<char*>(call->reply_at) + kReplyHeadroom);
      const char* positions = call->rest.data() + sizeof header;
      const char* values = positions + pending * sizeof(uint64_t);
      std::vector<uint64_t> at(pending);
      for (size_t j = 0; j < pending; ++j) {
        std::memcpy(&at[j], positions + j * sizeof(uint64_t), sizeof(uint64_t));
        if (at[j] >= count || (j > 0 && at[j] <= at[j - 1]))
          return call->done(PX_ERR_PROTOCOL, self->node_label_(to) + " sent pending row position " +
                                                 std::to_string(at[j]) + " (entry " +
                                                 std::to_string(j) + ") of a pull of " +
                                                 std::to_string(count) + " rows");
      }
      // The first part's rows (all but the pending ones), then the pending ones over them.
      size_t full = sparse_reply_bytes(SparseOp::kPull, count, width, value_bytes);
      size_t compact = kReplyHeadroom + (count - pending) * width * value_bytes;
      const char* first = call->wire_reply.empty() ? call->reply_at : call->wire_reply.data();
      if (call->compact && call->reply_got == compact && compact != full) {
        self->bytes_received_ -= full - compact;
        // Spread from the back, so a row never lands on one not yet moved (in place for f32).
        const char* rows = first + kReplyHeadroom;
        size_t next = pending, from = count - pending;
        for (size_t i = count; i-- > 0;) {
          if (next > 0 && at[next - 1] == i) {
            --next;
            continue;
          }
          --from;
          const char* src = rows + from * width * value_bytes;
          if (value_bytes == sizeof(float))
            std::memmove(out + i * width, src, width * sizeof(float));
          else
            unpack_wire(self->wire_, reinterpret_cast<const uint16_t*>(src), width,
                        out + i * width);
        }
      } else if (call->compact && call->reply_got != full) {
        return call->done(PX_ERR_PROTOCOL,
                          self->node_label_(to) + " replied " + std::to_string(call->reply_got) +
                              " bytes to a pull of " + std::to_string(count) + " rows with " +
                              std::to_string(pending) + " pending");
      } else if (!call->wire_reply.empty()) {
        unpack_wire(self->wire_, reinterpret_cast<const uint16_t*>(first + kReplyHeadroom),
                    count * width, call->out);
      }
      for (size_t j = 0; j < pending; ++j) {
        const char* from = values + j * width * value_bytes;
        if (value_bytes == sizeof(float))
          std::memcpy(out + at[j] * width, from, width * sizeof(float));
        else
          unpack_wire(self->wire_, reinterpret_cast<const uint16_t*>(from), width,
                      out + at[j] * width);
      }
      call->done(PX_OK, "");
    });
  };
  recv_part(to, reply_tag, kRowsPart, call->rest.data(), bytes, part_done);
}

}  // namespace px
