// A synchronous sparse table handed from one run of a job to the next, rather than restored
// from the periodic checkpoint (sharding/handover.h has the plan and why it is one cut).
//
// The old run's side (keep_for_next_run, when a run breaks: a node lost or joined, a worker
// lost): the owner exports what this node holds (its partitions, their push steps and
// journals) once the work queued before is done, and the router keeps it, by job and
// variable, until the job's next run registers the table. One that no run took within ten
// minutes is freed when this daemon next keeps one (no timer: a late run still takes it).
//
// The new run's side (take_over, when every node registered the table): every node of its
// epoch all-gathers its part (an empty one when it kept none: a node that joined, a
// first run), then every node plans alike from the same parts. A plan that holds takes every
// row from them and the table goes on from the cut: restored_steps counts it. One that does
// not leaves the table as its registration restored it (the periodic checkpoint, or the
// initializer), and says why when some node had a part. Only then does the table's channel
// start: its operations, this node's and other nodes' requests, wait until it is laid out.
#include <cinttypes>
#include <cstring>

#include "daemon/common/log.h"
#include "daemon/sparse/sparse_router.h"
#include "sharding/optimizer.h"
#include "transport/collectives/ring_allgatherv.h"
#include "transport/ipc/control_channel.h"  // monotonic_ns
#include "transport/kernels/uninit_vector.h"

namespace px {
namespace {

// How long a broken run's parts wait for the job's next run.
constexpr int64_t kKeptPartNs = 600'000'000'000;

std::pair<std::string, std::string> key_of(const SparseTable& t) {
  return {t.job_name, t.var_name};
}

// No part holds more than every row twice (its own and a copy), each with its journal's
// steps, and a header per partition: a larger announced size is a bug or damage.
uint64_t largest_part(const SparseTable& t) {
  uint64_t slots = optimizer_state_slots(t.options.optimizer);
  uint64_t rows = max_shard_image_bytes(t.shape.rows, t.shape.dim, static_cast<uint32_t>(slots));
  return 2 * (1 + kHandoverJournalSteps) * rows +
         uint64_t{2} * t.map.partitions() * (64 + 64 * kHandoverJournalSteps) + 4096;
}

}  // namespace

bool SparseRouter::hands_over(const SparseTable& t) const {
  // The column-wise alltoall holds a slice of every row, which no one node can hand in for
  // a lost one; a hot-row cache applies sums outside steps. A replicated route's table is
  // one unit, the whole table, which every node holds.
  return handover_ && !t.columns && t.options.consistency == Consistency::kSync &&
         t.options.cache_rows == 0;
}

void SparseRouter::keep_for_next_run(const std::shared_ptr<SparseTable>& table, uint64_t epoch,
                                     uint64_t run) {
  if (!hands_over(*table) || !table->owner) return;
  // A job that does not come back within kKeptPartNs is not waited for: its parts go.
  int64_t now = monotonic_ns();
  for (auto it = kept_.begin(); it != kept_.end();)
    it = now - it->second->kept_ns > kKeptPartNs && it->second->data ? kept_.erase(it)
                                                                     : std::next(it);
  auto part = std::make_shared<KeptPart>();
  part->kept_ns = now;
  kept_[key_of(*table)] = part;
  auto data = std::make_shared<HandoverData>();
  data->epoch = epoch;
  data->run = run;
  data->node = static_cast<uint32_t>(table->node);
  data->nodes = static_cast<uint32_t>(table->nodes);
  data->partitions = table->replicated ? 1 : table->map.partitions();
  data->dim = table->shape.dim;
  data->slots = static_cast<uint32_t>(optimizer_state_slots(table->options.optimizer));
  data->restored_steps = table->restored_steps;
  // The owner stays alive in the callback until its export is done, the job freed or not.
  std::shared_ptr<ShardOwner> owner = table->owner;
  owner->hand_over([owner, part, data](std::vector<HandoverUnit> units) {
    data->units = std::move(units);
    part->data = data;
    auto waiting = std::move(part->waiting);
    for (auto& resume : waiting) resume();
  });
}

void SparseRouter::take_over(const std::shared_ptr<SparseTable>& table) {
  std::shared_ptr<KeptPart> part;
  auto it = kept_.find(key_of(*table));
  if (it != kept_.end()) {
    part = it->second;
    kept_.erase(it);
  }
  if (part && !part->data) {
    part->waiting.push_back([this, table, part] { exchange_parts(table, part->data); });
    return;
  }
  exchange_parts(table, part ? part->data : nullptr);
}

void SparseRouter::exchange_parts(const std::shared_ptr<SparseTable>& table,
                                  std::shared_ptr<const HandoverData> mine) {
  SparseTable& t = *table;
  size_t nodes = static_cast<size_t>(t.nodes), node = static_cast<size_t>(t.node);
  auto sizes = std::make_shared<std::vector<uint64_t>>(nodes, 0);
  (*sizes)[node] = mine ? handover_image_bytes(*mine) : 0;
  AllgathervSpec spec;
  spec.buffer = sizes->data();
  spec.block_bytes.assign(nodes, sizeof(uint64_t));
  spec.tag_base = make_tag(TagKind::kHandover, t.global_id, 0);
  spec.chunk_bytes = chunk_bytes_;
  // release() counts an attempt: a job ended meanwhile drops what comes back.
  uint64_t attempt = t.move.attempt;
  // A collective fails when a node is gone: the job breaks and its operations fail.
  auto failed = [table](const std::string& what, const std::string& error) {
    PX_LOG_ERROR_AT(table->log_fields, "%s: handing the table over: %s failed: %s",
                    table->label.c_str(), what.c_str(), error.c_str());
  };
  start_ring_allgatherv(*fabric_, spec, [=, this](bool ok, const std::string& error) {
    offload_.post()([=, this] {
      if (table->move.attempt != attempt) return;
      if (!ok) return failed("exchanging part sizes", error);
      std::vector<uint64_t> blocks(nodes), offset(nodes + 1, 0);
      uint64_t largest = largest_part(*table);
      bool any_part = false;
      for (size_t i = 0; i < nodes; ++i) {
        if ((*sizes)[i] > largest) {
          PX_LOG_ERROR_AT(table->log_fields,
                          "%s: node %zu announced a handover part of %" PRIu64
                          " bytes, more than the %" PRIu64 " any can hold (a bug)",
                          table->label.c_str(), i, (*sizes)[i], largest);
          return start_channel(*table);  // every node sees the same sizes: none hands over
        }
        any_part = any_part || (*sizes)[i] > 0;
        blocks[i] = ((*sizes)[i] + 7) & ~uint64_t{7};
        offset[i + 1] = offset[i] + blocks[i];
      }
      if (!any_part) return start_channel(*table);  // a first run: nothing was kept
      auto images = std::make_shared<UninitVector<char>>();
      offload_.run(
          true,
          [=] {
            images->resize(offset[nodes]);
            char* own = images->data() + offset[node];
            if (mine) encode_handover(*mine, own);
            std::memset(own + (*sizes)[node], 0, blocks[node] - (*sizes)[node]);
          },
          [=, this] {
            if (table->move.attempt != attempt) return;
            AllgathervSpec parts;
            parts.buffer = images->data();
            parts.block_bytes = blocks;
            parts.tag_base = make_tag(TagKind::kHandover, table->global_id, 1);
            parts.chunk_bytes = chunk_bytes_;
            start_ring_allgatherv(*fabric_, parts, [=, this](bool ok2, const std::string& error2) {
              offload_.post()([=, this] {
                if (table->move.attempt != attempt) return;
                if (!ok2) return failed("exchanging parts", error2);
                auto plan = std::make_shared<HandoverPlan>();
                offload_.run(
                    true,
                    [=] {
                      std::vector<HandoverData> handed;
                      for (size_t i = 0; i < nodes; ++i) {
                        if ((*sizes)[i] == 0) continue;
                        HandoverData d;
                        std::string why;
                        if (!decode_handover(images->data() + offset[i], (*sizes)[i], &d, &why)) {
                          plan->why = "node " + std::to_string(i) + "'s part: " + why;
                          return;
                        }
                        handed.push_back(std::move(d));
                      }
                      *plan = plan_handover(std::move(handed));
                    },
                    [=, this] {
                      if (table->move.attempt != attempt) return;
                      use_plan(table, plan);
                    });
              });
            });
          });
    });
  });
}

void SparseRouter::use_plan(const std::shared_ptr<SparseTable>& table,
                            std::shared_ptr<HandoverPlan> plan) {
  SparseTable& t = *table;
  // Every row of the table once, with this table's width and state: else the parts are of
  // another table (the job's next run changed it), and the registration's rows stay.
  uint64_t rows = 0;
  uint32_t slots = static_cast<uint32_t>(optimizer_state_slots(t.options.optimizer));
  for (const ShardFileData& r : plan->rows) {
    rows += r.rows.size();
    if (plan->ok && (r.dim != t.shape.dim || r.slots != slots))
      plan->ok = false, plan->why = "its parts hold rows of " + std::to_string(r.dim) +
                                    " values and " + std::to_string(r.slots) +
                                    " optimizer slots, the table " + std::to_string(t.shape.dim) +
                                    " and " + std::to_string(slots);
  }
  if (plan->ok && rows != t.shape.rows)
    plan->ok = false, plan->why = "its parts hold " + std::to_string(rows) + " rows, the table " +
                                  std::to_string(t.shape.rows);
  if (!plan->ok) {
    PX_LOG_WARN_AT(t.log_fields, "%s: not handed over from the last run (%s); it is as restored",
                   t.label.c_str(), plan->why.c_str());
    return start_channel(t);
  }
  std::shared_ptr<ShardOwner> owner = t.owner;
  auto taken = std::make_shared<uint64_t>(0);
  uint64_t attempt = t.move.attempt;
  offload_.run(
      true,
      [owner, plan, taken] {
        for (const ShardFileData& r : plan->rows) *taken += owner->import_rows(view_of(r));
      },
      [this, table, owner, plan, taken, attempt] {
        SparseTable& t = *table;
        if (t.move.attempt != attempt) return;
        if (*taken != owner->held_values()) {
          // Every row came once with the table's width: a bug, and the table is mixed now.
          std::string why = t.label + ": handing the table over took " + std::to_string(*taken) +
                            " of the " + std::to_string(owner->held_values()) +
                            " values this node holds (a bug)";
          PX_LOG_ERROR_AT(t.log_fields, "%s", why.c_str());
          if (t.var && t.var->poison_status == PX_OK) {
            t.var->poison_status = PX_ERR_INTERNAL;
            t.var->poison_message = why;
          }
          return start_channel(t);
        }
        owner->continue_from(0, plan->applies);
        t.restored_steps = plan->restored_steps;
        PX_LOG_INFO_AT(t.log_fields,
                       "%s: handed over from the run of epoch %" PRIu64 " after %" PRIu64
                       " push steps (%" PRIu64
                       " of that run; %u partitions taken from copies, "
                       "%u taken back to the cut)",
                       t.label.c_str(), plan->epoch, plan->restored_steps, plan->cut,
                       plan->from_replicas, plan->rolled_back);
        start_channel(t);
      });
}

void SparseRouter::wire_copies(const std::shared_ptr<SparseTable>& table) {
  SparseTable& t = *table;
  // (A replicated route's table is on every node already.)
  if (t.options.replicas < 2 || t.nodes < 2 || t.replicated || !hands_over(t)) return;
  t.channel->set_state_slots(optimizer_state_slots(t.options.optimizer));
  t.owner->keep_copy_of(t.map, (t.node + t.nodes - 1) % t.nodes, kHandoverJournalSteps);
  // The owner may outlive the table (a handover's export holds it): the channel is weak.
  std::weak_ptr<SparseChannel> weak = t.channel;
  int next = (t.node + 1) % t.nodes;
  t.owner->send_copies(
      [weak, next](uint32_t partition, uint64_t step, std::shared_ptr<ReplicaRows> rows) {
        std::shared_ptr<SparseChannel> channel = weak.lock();
        if (!channel) return;
        // A copy that cannot be sent (the next node is gone) fails the job elsewhere; the
        // copy there is what it is.
        channel->request(next, partition, 0, SparseOp::kReplicate, step, 0, rows->rows.size(),
                         rows->rows.data(), rows->values.data(), nullptr, rows,
                         [](px_status, const std::string&) {});
      });
}

void SparseRouter::start_channel(SparseTable& table) {
  table.channel->start(table.global_id);
  if (!table.var) return;
  auto waiting = std::move(table.var->awaiting_global_id);
  table.var->awaiting_global_id.clear();
  for (auto& resume : waiting) resume();
}

}  // namespace px
