#include "sharding/handover.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace px {
namespace {

constexpr uint32_t kHandoverMagic = 0x4f485850;  // "PXHO"
constexpr uint32_t kHandoverVersion = 1;

struct ImageHeader {
  uint32_t magic, version;
  uint64_t epoch, run;
  uint32_t node, nodes, partitions, slots;
  uint64_t dim, restored_steps, units;
};
struct UnitHeader {
  uint32_t partition, replica;
  uint64_t applied, applies, records, rows_bytes;
};
struct RecordHeader {
  uint64_t step, bytes;
};

size_t padded(size_t bytes) {
  return (bytes + 7) / 8 * 8;
}

class Writer {
 public:
  explicit Writer(char* out) : out_(out) {}
  void put(const void* from, size_t bytes) {
    if (out_) std::memcpy(out_ + at_, from, bytes);
    at_ += bytes;
  }
  void shard(const ShardFileData& data) {
    size_t bytes = shard_image_bytes(data);
    if (out_) {
      encode_shard(data, out_ + at_);
      std::memset(out_ + at_ + bytes, 0, padded(bytes) - bytes);
    }
    at_ += padded(bytes);
  }
  size_t at() const { return at_; }

 private:
  char* out_;
  size_t at_ = 0;
};

// Both the size and the bytes: out null only counts.
size_t write_image(const HandoverData& d, char* out) {
  Writer w(out);
  ImageHeader h{kHandoverMagic, kHandoverVersion, d.epoch,       d.run,
                d.node,         d.nodes,          d.partitions,  d.slots,
                d.dim,          d.restored_steps, d.units.size()};
  w.put(&h, sizeof h);
  for (const HandoverUnit& u : d.units) {
    UnitHeader uh{u.partition, u.replica ? 1u : 0u, u.applied,
                  u.applies,   u.journal.size(),    padded(shard_image_bytes(u.rows))};
    w.put(&uh, sizeof uh);
    w.shard(u.rows);
    for (const StepJournal::Record& r : u.journal) {
      RecordHeader rh{r.step, padded(shard_image_bytes(r.rows))};
      w.put(&rh, sizeof rh);
      w.shard(r.rows);
    }
  }
  return w.at();
}

bool copy_shard(const char* bytes, size_t size, uint64_t dim, uint32_t slots, ShardFileData* to) {
  ShardView v;
  if (!view_shard(bytes, size, &v) || v.column_slice || v.dim != dim || v.slots != slots)
    return false;
  to->dim = dim;
  to->slots = slots;
  to->rows.assign(v.rows, v.rows + v.count);
  to->values.assign(v.values, v.values + v.count * dim);
  to->state.assign(v.state, v.state + v.count * dim * slots);
  return true;
}

}  // namespace

size_t handover_image_bytes(const HandoverData& data) {
  return write_image(data, nullptr);
}

void encode_handover(const HandoverData& data, char* out) {
  write_image(data, out);
}

bool decode_handover(const char* bytes, size_t size, HandoverData* data, std::string* why) {
  size_t at = 0;
  auto read = [&](void* to, size_t n) {
    if (size - at < n) return false;
    std::memcpy(to, bytes + at, n);
    at += n;
    return true;
  };
  // A shard image of `n` bytes here, checked for the table's dim and slots.
  auto shard = [&](uint64_t n, const ImageHeader& h, ShardFileData* to) {
    if (n % 8 != 0 || size - at < n || !copy_shard(bytes + at, n, h.dim, h.slots, to)) return false;
    at += n;
    return true;
  };
  ImageHeader h{};
  if (!read(&h, sizeof h) || h.magic != kHandoverMagic) return *why = "not a handover image", false;
  if (h.version != kHandoverVersion)
    return *why = "handover image version " + std::to_string(h.version), false;
  if (h.nodes == 0 || h.node >= h.nodes || h.partitions == 0 || h.dim == 0)
    return *why = "handover image of node " + std::to_string(h.node) + " of " +
                  std::to_string(h.nodes) + ", " + std::to_string(h.partitions) +
                  " partitions of " + std::to_string(h.dim) + " values",
           false;
  // Each unit takes at least its header: a count past that is damage, not a size to trust.
  if (h.units > (size - at) / sizeof(UnitHeader))
    return *why = "handover image claims " + std::to_string(h.units) + " partitions", false;
  HandoverData d;
  d.epoch = h.epoch;
  d.run = h.run;
  d.node = h.node;
  d.nodes = h.nodes;
  d.partitions = h.partitions;
  d.dim = h.dim;
  d.slots = h.slots;
  d.restored_steps = h.restored_steps;
  d.units.resize(h.units);
  for (HandoverUnit& u : d.units) {
    UnitHeader uh{};
    if (!read(&uh, sizeof uh)) return *why = "handover image truncated", false;
    if (uh.partition >= h.partitions || uh.replica > 1 || uh.applies < uh.applied ||
        uh.records > (size - at) / sizeof(RecordHeader))
      return *why = "handover image: partition " + std::to_string(uh.partition) + " malformed",
             false;
    u.partition = uh.partition;
    u.replica = uh.replica != 0;
    u.applied = uh.applied;
    u.applies = uh.applies;
    if (!shard(uh.rows_bytes, h, &u.rows))
      return *why =
                 "handover image: partition " + std::to_string(uh.partition) + "'s rows malformed",
             false;
    for (uint64_t i = 0; i < uh.records; ++i) {
      RecordHeader rh{};
      StepJournal::Record r;
      if (!read(&rh, sizeof rh) || !shard(rh.bytes, h, &r.rows))
        return *why = "handover image: partition " + std::to_string(uh.partition) +
                      "'s journal malformed",
               false;
      r.step = rh.step;
      u.journal.push_back(std::move(r));
    }
  }
  if (at != size) return *why = "handover image has trailing bytes", false;
  *data = std::move(d);
  return true;
}

HandoverPlan plan_handover(std::vector<HandoverData> handed, uint64_t uncommitted) {
  HandoverPlan plan;
  if (handed.empty()) return plan.why = "no node held the table", plan;
  std::pair<uint64_t, uint64_t> newest{0, 0};
  for (const HandoverData& d : handed) newest = std::max(newest, {d.epoch, d.run});
  handed.erase(std::remove_if(handed.begin(), handed.end(),
                              [newest](const HandoverData& d) {
                                return std::pair<uint64_t, uint64_t>{d.epoch, d.run} != newest;
                              }),
               handed.end());
  uint64_t epoch = newest.first;
  plan.epoch = epoch;
  const HandoverData& first = handed.front();
  for (const HandoverData& d : handed)
    if (d.nodes != first.nodes || d.partitions != first.partitions || d.dim != first.dim ||
        d.slots != first.slots || d.restored_steps != first.restored_steps)
      return plan.why = "the nodes' parts of epoch " + std::to_string(epoch) + " disagree", plan;
  // Each partition from its own node where that node handed it in, else from a copy. A
  // replicated route's table (every node's own) from the node that applied the most: the
  // cut is then the furthest every node's pushes reached.
  std::vector<const HandoverUnit*> source(first.partitions, nullptr);
  for (const HandoverData& d : handed)
    for (const HandoverUnit& u : d.units) {
      const HandoverUnit*& s = source[u.partition];
      if (!s || (s->replica && !u.replica) || (s->replica == u.replica && u.applied > s->applied))
        s = &u;
    }
  for (uint32_t p = 0; p < first.partitions; ++p)
    if (!source[p])
      return plan.why = "partition " + std::to_string(p) + " of epoch " + std::to_string(epoch) +
                        " is held by no node of this one",
             plan;
  uint64_t cut = UINT64_MAX;
  for (const HandoverUnit* u : source) cut = std::min(cut, u->applied);
  cut -= std::min(cut, uncommitted);
  plan.cut = cut;
  plan.restored_steps = first.restored_steps + cut;
  for (const HandoverUnit* u : source) {
    StepJournal journal(first.dim, first.slots, u->journal.size());
    if (!journal.adopt(u->journal) || !journal.can_roll_back(u->applied, cut))
      return plan.why = "partition " + std::to_string(u->partition) + " applied " +
                        std::to_string(u->applied) + " push steps, too far past the " +
                        std::to_string(cut) + " every partition applied to go back",
             plan;
    if (u->replica) ++plan.from_replicas;
    if (u->applied > cut) ++plan.rolled_back;
    plan.applies = std::max(plan.applies, u->applies - (u->applied - cut));
    ShardFileData rows = u->rows;
    if (u->applied > cut) {
      std::unordered_map<int64_t, size_t> at;
      for (size_t i = 0; i < rows.rows.size(); ++i) at.emplace(rows.rows[i], i);
      size_t dim = first.dim, slots = first.slots;
      bool stray = false;
      journal.roll_back(u->applied, cut, [&](int64_t row, const float* values, const float* state) {
        auto it = at.find(row);
        if (it == at.end()) return void(stray = true);
        std::memcpy(rows.values.data() + it->second * dim, values, dim * sizeof(float));
        if (slots > 0)  // (SGD keeps no state: its arrays are empty, their data() null)
          std::memcpy(rows.state.data() + it->second * slots * dim, state,
                      slots * dim * sizeof(float));
      });
      if (stray)
        return plan.why = "partition " + std::to_string(u->partition) +
                          "'s journal names a row it does not hold",
               plan;
    }
    plan.rows.push_back(std::move(rows));
  }
  plan.ok = true;
  return plan;
}

}  // namespace px
