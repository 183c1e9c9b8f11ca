// PX_ROUTE_AUTO: a sparse table that moves between routes as its estimates choose
// (route_estimate.cc, route_model.h), without changing a result.
//
// Every estimate is agreed: when a node has sent the pull step that completes an estimate's
// sample (step s), it all-gathers its sample with the other nodes', and every node estimates
// from the same sum, so all choose alike. Operations of steps after s wait until then (a
// synchronous job's next pull waits for a few hundred bytes from every node, once every
// --route-estimate-steps pull steps). When the choice is another route, the move happens at
// the cut between push step s and pull step s + 1:
//   1. the table's operations drain (push step s still goes on the old route);
//   2. each node exports its rows, values and optimizer state once every node's push steps
//      through s are applied here (a checkpoint in memory);
//   3. the nodes all-gather the exports (a replicated table skips this: every node has
//      every row), lay the table out for the new route, and each takes what it now holds
//      from them; every row must be covered;
//   4. the channel switches layouts: requests from nodes that moved first (marked with the
//      layout's parity, sparse_wire.h) waited for this, and the held operations start.
// Every node receives the whole table's exports, (N-1)/N of it, where a targeted exchange
// would need 1/N (README: Limits).
#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "daemon/sparse/sparse_router.h"
#include "daemon/sparse/sparse_run.h"
#include "sharding/checkpoint.h"
#include "sharding/optimizer.h"
#include "sharding/route_model.h"
#include "transport/collectives/ring_allgatherv.h"
#include "transport/ipc/control_channel.h"  // monotonic_ns
#include "transport/kernels/huge_pages.h"
#include "transport/kernels/uninit_vector.h"

namespace px {
namespace {

// The options of the route named as route_model.h names them.
SparseOptions options_for(const SparseTable& table, const std::string& route) {
  return route_model_options(table.options, route, table.declared_partitions);
}

}  // namespace

// Checked in every build (every tree here is Release): a move is rare, and one that went
// wrong would lay a table out from the wrong rows, so a bug stops the daemon, named.
void RouteMove::set(MoveState to_state, const std::string& label) {
  if (!move_transition_legal(state, to_state)) {
    PX_LOG_ERROR("%s: illegal route move state change from %s to %s (a bug)", label.c_str(),
                 move_state_name(state), move_state_name(to_state));
    std::abort();
  }
  state = to_state;
}

bool SparseRouter::hold(SparseTable& table, uint64_t step, bool stepless,
                        std::function<void()> later) {
  RouteMove& move = table.move;
  if (!move_holds(move.state)) return false;
  // Operations of earlier steps (push step s) go on: the cut waits for them. So do loads,
  // reads and checkpoints started before push step s: they reach every owner before it, so
  // before any export (and a worker may wait for one before it pushes). Later ones wait.
  if (stepless ? table.pushes_started < move.hold_from : step < move.hold_from) return false;
  move.held.push_back(std::move(later));
  return true;
}

void SparseRouter::agree_route(const std::shared_ptr<SparseTable>& table, const RouteSample& s) {
  SparseTable& t = *table;
  size_t nodes = static_cast<size_t>(t.nodes), words = 2 + 2 * nodes;
  auto all = std::make_shared<std::vector<double>>(nodes * words, 0.0);
  double* mine = all->data() + static_cast<size_t>(t.node) * words;
  mine[0] = static_cast<double>(s.pulls);
  mine[1] = s.unique_rows;
  std::copy(s.ps_rows.begin(), s.ps_rows.end(), mine + 2);
  std::copy(s.alltoall_rows.begin(), s.alltoall_rows.end(), mine + 2 + nodes);
  // (run_step set the hold when this window's last pull started.)
  if (t.move.state == MoveState::kIdle) t.move.hold_from = s.first_step + s.pulls;
  t.move.set(MoveState::kAgreeing, t.label);
  uint64_t attempt = ++t.move.attempt;
  AllgathervSpec spec;
  spec.buffer = all->data();
  spec.block_bytes.assign(nodes, words * sizeof(double));
  spec.tag_base = make_tag(TagKind::kRouteAgree, t.global_id, t.move.agreements++);
  spec.chunk_bytes = chunk_bytes_;
  uint64_t first = s.first_step, pulls = s.pulls;
  start_ring_allgatherv(
      *fabric_, spec, [this, table, all, attempt, first, pulls](bool ok, const std::string& error) {
        offload_.post()([this, table, all, attempt, first, pulls, ok, error] {
          if (table->move.attempt != attempt) return;  // given up or released
          if (!ok) {
            PX_LOG_ERROR_AT(table->log_fields, "%s: agreeing on the route estimate failed: %s",
                            table->label.c_str(), error.c_str());
            return end_hold(*table);
          }
          agreed(table, *all, first, pulls);
        });
      });
}

// Every node's sample summed in node order (the same sums everywhere), as the mean node's.
void SparseRouter::agreed(const std::shared_ptr<SparseTable>& table,
                          const std::vector<double>& samples, uint64_t first_step, uint64_t pulls) {
  SparseTable& t = *table;
  RouteSample s;
  s.first_step = first_step;
  s.pulls = pulls;
  size_t nodes = static_cast<size_t>(t.nodes), words = 2 + 2 * nodes;
  double n = static_cast<double>(nodes);
  s.ps_rows.assign(nodes, 0);
  s.alltoall_rows.assign(nodes, 0);
  for (size_t i = 0; i < nodes; ++i) {
    const double* theirs = samples.data() + i * words;
    s.unique_rows += theirs[1] / n;
    for (size_t j = 0; j < nodes; ++j) {
      s.ps_rows[j] += theirs[2 + j] / n;
      s.alltoall_rows[j] += theirs[2 + nodes + j] / n;
    }
  }
  std::string to = estimate_route(t, s);
  if (to.empty() || to == route_model_name(t.options)) return end_hold(t);
  start_move(table, to);
}

void SparseRouter::start_move(const std::shared_ptr<SparseTable>& table, const std::string& to) {
  SparseTable& t = *table;
  t.move.set(MoveState::kDraining, t.label);
  t.move.to = to;
  t.move.start_ns = monotonic_ns();
  t.channel->expect_layout(row_widths(t.shape.dim, t.nodes, options_for(t, to)));
  move_when_drained(table);
}

// Steps 1-2, then 3 once the table's last operations are done. Before any node exports,
// every node has drained (an all-gather of nothing): on the replicated routes a node's load
// or checkpoint request travels apart from its push steps' collectives, so its arrival
// before an export is known only once its sender saw it answered.
void SparseRouter::move_when_drained(const std::shared_ptr<SparseTable>& table) {
  SparseTable& t = *table;
  MoveState state = t.move.state;
  if ((state != MoveState::kDraining && state != MoveState::kGathered) || !t.in_flight.empty() ||
      !t.send_order.empty() || t.checkpoints_in_flight > 0)
    return;
  if (state == MoveState::kGathered) return lay_out_moved(table, std::move(t.move.rows));
  t.move.set(MoveState::kExporting, t.label);
  uint64_t attempt = t.move.attempt;
  auto nothing = std::make_shared<std::vector<char>>(static_cast<size_t>(t.nodes), 0);
  AllgathervSpec drained;
  drained.buffer = nothing->data();
  drained.block_bytes.assign(static_cast<size_t>(t.nodes), 1);
  drained.tag_base = make_tag(TagKind::kRouteMove, t.global_id, 3 * t.move.completed);
  start_ring_allgatherv(
      *fabric_, drained, [this, table, attempt, nothing](bool ok, const std::string& error) {
        offload_.post()([this, table, attempt, ok, error] {
          if (table->move.attempt != attempt) return;
          if (!ok) {
            PX_LOG_ERROR_AT(table->log_fields,
                            "%s: moving the table to %s: waiting for every node "
                            "to drain failed: %s",
                            table->label.c_str(), table->move.to.c_str(), error.c_str());
            return;  // a node is gone: the job breaks and fail_in_flight ends the hold
          }
          table->owner->export_at(table->move.hold_from,
                                  [this, table, attempt](std::shared_ptr<ShardFileData> mine) {
                                    if (table->move.attempt != attempt) return;
                                    exchange_rows(table, std::move(mine));
                                  });
        });
      });
}

void SparseRouter::exchange_rows(const std::shared_ptr<SparseTable>& table,
                                 std::shared_ptr<ShardFileData> mine) {
  SparseTable& t = *table;
  t.move.set(MoveState::kExchanging, t.label);
  t.move.exported_ns = monotonic_ns();
  auto moved = std::make_shared<RouteMove::Rows>();
  if (t.replicated) {  // this node's replica holds every row
    t.move.gathered_ns = t.move.exported_ns;
    t.move.applies = t.owner->applies();
    moved->views.push_back(view_of(*mine));
    moved->own = std::move(mine);
    t.move.rows = moved;
    t.move.set(MoveState::kGathered, t.label);
    return move_when_drained(table);
  }
  size_t nodes = static_cast<size_t>(t.nodes), node = static_cast<size_t>(t.node);
  // Every node's image size and optimizer applications: a node that held no rows (fewer
  // partitions than nodes, no columns) has counted no optimizer steps, so the most any node
  // counted is the table's.
  auto counts = std::make_shared<std::vector<uint64_t>>(2 * nodes, 0);
  (*counts)[2 * node] = shard_image_bytes(*mine);
  auto exported = std::make_shared<std::shared_ptr<ShardFileData>>(std::move(mine));
  (*counts)[2 * node + 1] = t.owner->applies();
  AllgathervSpec spec;
  spec.buffer = counts->data();
  spec.block_bytes.assign(nodes, 2 * sizeof(uint64_t));
  spec.tag_base = make_tag(TagKind::kRouteMove, t.global_id, 3 * t.move.completed + 1);
  spec.chunk_bytes = chunk_bytes_;
  uint64_t attempt = t.move.attempt;
  // A collective fails when a node is gone: the job breaks, fail_in_flight ends the hold.
  auto failed = [table](const std::string& what, const std::string& error) {
    PX_LOG_ERROR_AT(table->log_fields, "%s: moving the table to %s: %s failed: %s",
                    table->label.c_str(), table->move.to.c_str(), what.c_str(), error.c_str());
  };
  start_ring_allgatherv(*fabric_, spec, [=, this](bool ok, const std::string& error) {
    offload_.post()([=, this] {
      if (table->move.attempt != attempt) return;
      if (!ok) return failed("exchanging row counts", error);
      // The images side by side, each from an 8-byte boundary (views read their rows in
      // place); the padding is sent as zeros.
      std::vector<uint64_t> sizes(nodes), blocks(nodes), offset(nodes + 1, 0);
      uint64_t most = 0;
      // No export holds more than every row of the table with its number and state. Every
      // node sees the same sizes, so all refuse alike (none is left in the all-gather).
      const SparseShape& shape = table->shape;
      uint64_t state_slots = optimizer_state_slots(table->options.optimizer);
      uint64_t largest =
          max_shard_image_bytes(shape.rows, shape.dim, static_cast<uint32_t>(state_slots));
      for (size_t i = 0; i < nodes; ++i) {
        sizes[i] = (*counts)[2 * i];
        if (sizes[i] > largest)
          return fail_move(table, "node " + std::to_string(i) + " announced an export of " +
                                      std::to_string(sizes[i]) + " bytes, more than the " +
                                      std::to_string(largest) + " of the whole table (a bug)");
        blocks[i] = (sizes[i] + 7) & ~uint64_t{7};
        offset[i + 1] = offset[i] + blocks[i];
        most = std::max(most, (*counts)[2 * i + 1]);
      }
      offload_.run(
          true,
          [=] {  // every byte is received or written here: not zeroed first
            resize_on_huge_pages(moved->images, offset[nodes]);
            char* own = moved->images.data() + offset[node];
            encode_shard(**exported, own);
            std::memset(own + sizes[node], 0, blocks[node] - sizes[node]);
            exported->reset();  // its bytes are in the image now
          },
          [=, this] {
            if (table->move.attempt != attempt) return;
            AllgathervSpec rows;
            rows.buffer = moved->images.data();
            rows.block_bytes = blocks;
            rows.tag_base =
                make_tag(TagKind::kRouteMove, table->global_id, 3 * table->move.completed + 2);
            rows.chunk_bytes = chunk_bytes_;
            start_ring_allgatherv(*fabric_, rows, [=, this](bool ok2, const std::string& error2) {
              offload_.post()([=, this] {
                if (table->move.attempt != attempt) return;
                if (!ok2) return failed("exchanging rows", error2);
                for (size_t i = 0; i < nodes; ++i) {
                  ShardView view;
                  if (!view_shard(moved->images.data() + offset[i], sizes[i], &view))
                    return fail_move(table, "the export of node " + std::to_string(i) + " (" +
                                                std::to_string(sizes[i]) +
                                                " bytes) is not a shard image (a bug)");
                  moved->views.push_back(view);
                }
                table->move.rows = moved;
                table->move.applies = most;
                table->move.gathered_ns = monotonic_ns();
                table->move.set(MoveState::kGathered, table->label);
                move_when_drained(table);
              });
            });
          });
    });
  });
}

// Step 3-4: the new layout takes its rows from every node's export.
void SparseRouter::lay_out_moved(const std::shared_ptr<SparseTable>& table,
                                 std::shared_ptr<RouteMove::Rows> moved) {
  SparseTable& t = *table;
  t.move.set(MoveState::kLayingOut, t.label);
  std::string from = route_model_name(t.options);
  uint64_t applies = t.move.applies;
  uint32_t kept = t.search && t.search->decided() ? t.search->chosen() : t.kept_per_node;
  std::string why;
  lay_out(t, options_for(t, t.move.to), &why, false);  // every cell comes from the exports
  wire_copies(table);  // on ps again: the copies start from the same exports
  if (t.options.route == Route::kPs) {
    t.search.reset();  // its trials are numbered from step 0: the earlier choice stays
    t.kept_per_node = kept ? kept : PartitionSearch::kInitialPerNode;
  }
  std::shared_ptr<ShardOwner> owner = t.owner;
  auto taken = std::make_shared<uint64_t>(0);
  uint64_t attempt = t.move.attempt;
  offload_.run(
      true,
      [owner, moved, taken] {
        for (const ShardView& view : moved->views) {
          *taken += owner->import_rows(view);
          if (ShardReplica* copy = owner->replica()) copy->import_rows(view);
        }
      },
      [this, table, owner, moved, taken, applies, from, why, attempt] {
        SparseTable& t = *table;
        if (t.move.attempt != attempt) return;
        if (*taken != owner->held_values())
          return fail_move(table, "the nodes' rows held " + std::to_string(*taken) + " of the " +
                                      std::to_string(owner->held_values()) +
                                      " values this node holds (a bug)");
        owner->continue_from(t.move.hold_from, applies);
        if (fabric_) owner->attach(fabric_, t.global_id, chunk_bytes_);
        t.channel->switch_layout(owner);
        ++t.move.completed;
        auto ms = [](int64_t from_ns, int64_t to_ns) {
          return static_cast<double>(to_ns - from_ns) / 1e6;
        };
        int64_t now = monotonic_ns();
        // Drained and exported (waiting for every node's last push step included), the
        // exports exchanged, the new layout built and filled.
        PX_LOG_INFO_AT(
            t.log_fields,
            "%s: moved from %s to %s before pull step %" PRIu64 " (move %" PRIu64
            ", %.1f ms: export %.1f, exchange %.1f, lay-out %.1f):"
            " %u partitions (%s), %llu rows held here",
            t.label.c_str(), from.c_str(), t.move.to.c_str(), t.move.hold_from, t.move.completed,
            ms(t.move.start_ns, now), ms(t.move.start_ns, t.move.exported_ns),
            ms(t.move.exported_ns, t.move.gathered_ns), ms(t.move.gathered_ns, now),
            t.map.partitions(), why.c_str(), static_cast<unsigned long long>(owner->owned_rows()));
        end_hold(t);
      });
}

void SparseRouter::fail_move(const std::shared_ptr<SparseTable>& table, const std::string& why) {
  std::string message = table->label + ": moving the table to " + table->move.to + ": " + why;
  PX_LOG_ERROR_AT(table->log_fields, "%s", message.c_str());
  if (!table->var) return;
  Variable& var = *table->var;
  if (var.poison_status == PX_OK) {
    var.poison_status = PX_ERR_INTERNAL;
    var.poison_message = message;
  }
  fail_in_flight(var, var.poison_status, var.poison_message);
}

void SparseRouter::end_hold(SparseTable& table) {
  RouteMove& move = table.move;
  if (move.state != MoveState::kIdle) move.set(MoveState::kIdle, table.label);
  move.hold_from = UINT64_MAX;
  move.rows.reset();
  std::deque<std::function<void()>> held = std::move(move.held);
  move.held.clear();
  for (auto& later : held) later();
}

}  // namespace px
