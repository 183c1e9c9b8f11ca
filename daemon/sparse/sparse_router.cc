#include "daemon/sparse/sparse_router.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "daemon/common/log.h"
#include "daemon/common/operation.h"
#include "daemon/observe/step_trace.h"
#include "daemon/sparse/sparse_run.h"
#include "sharding/coalesce.h"
#include "sharding/row_plan.h"
#include "sharding/wire_values.h"
#include "transport/ipc/control_channel.h"  // monotonic_ns

namespace px {

// Checked in every build: every tree here is Release (NDEBUG), so a debug-only check would
// never run; the check is one switch, a few times per operation.
void SparseRun::set_state(RunState to) {
  if (!run_transition_legal(state, to)) {
    PX_LOG_ERROR("sparse run%s: illegal state change from %s to %s (a bug)", where().c_str(),
                 run_state_name(state), run_state_name(to));
    std::abort();
  }
  state = to;
  if (to != RunState::kAbandoned && to != RunState::kFinished)
    trace_stage(trace, run_state_name(to));
}

namespace {

// The metrics' route label: what the variable's steps run (hybrid runs ps for sparse ones).
const char* sparse_route_label(const SparseOptions& options) {
  return options.route == Route::kHybrid ? "ps" : route_label(options);
}

// The node a request for row goes to: its owner, or this node's replica.
int target_node(const SparseTable& table, int64_t row) {
  return table.replicated ? table.node : table.map.owner(static_cast<uint64_t>(row));
}

// A run's requests go per group: per group of partitions for ps/hybrid pulls and pushes
// (each partition is applied on its own, so its replies can leave while the pushes of
// others are still arriving; request_groups.h), one for every row on the column-wise
// alltoall route (each node gets all of them, column_requests.cc), per node otherwise.
int group_count(const SparseTable& table, const SparseRun& run) {
  if (table.columns) return 1;
  return run.request_groups ? run.request_groups->count() : table.map.nodes();
}
std::function<int(int64_t)> group_of_row(const SparseTable& table, const SparseRun& run) {
  if (run.request_groups)
    return [&groups = *run.request_groups](int64_t row) {
      return groups.group_of_row(static_cast<uint64_t>(row));
    };
  return [&table](int64_t row) { return target_node(table, row); };
}

// A worker's indices and rows: in its arena, or (device memory) staged in host memory by
// device_rows_step, which the worker (its wrapper there) keeps alive.
void set_buffers(SparseRun::Worker& w, const Completer& worker, const BufferRef& in,
                 const BufferRef& out, StagedRows* staged) {
  if (staged) {
    w.indices = staged->indices.data();
    w.n = staged->status == PX_OK ? staged->indices.size() : 0;
    w.rows = reinterpret_cast<char*>(staged->rows.data());
    w.status = staged->status;
    w.message = staged->message;
    return;
  }
  char* base = worker.arena().base();
  w.indices = reinterpret_cast<const int64_t*>(base + in.offset);
  w.n = in.bytes / sizeof(int64_t);
  w.rows = base + out.offset;
}

}  // namespace

void SparseRouter::run_step(std::shared_ptr<Job> job, Variable& var, Opcode opcode, uint64_t step,
                            PendingStep pending) {
  if (var.sparse->automatic) {  // waits for the route's agreement or move (route_move.cc)
    auto later = std::make_shared<PendingStep>(std::move(pending));
    std::function<void()> resume = [this, job, &var, opcode, step, later] {
      run_step(job, var, opcode, step, std::move(*later));
    };
    if (hold(*var.sparse, step, false, resume)) return;
    pending = std::move(*later);
    SparseTable& t = *var.sparse;
    SparseOp op = operation_info(opcode).sparse_op;
    if (op == SparseOp::kPush) t.pushes_started = std::max(t.pushes_started, step + 1);
    // The pull that closes an estimate's window: later steps wait for the agreement from
    // now on (a next pull may start before this one is sent).
    bool live = var.poison_status == PX_OK && job->broken().empty();
    if (op == SparseOp::kPull && t.nodes > 1 && live &&
        ++t.pulls_started % route_estimate_steps_ == 0) {
      t.move.set(MoveState::kHolding, t.label);
      t.move.hold_from = step + 1;
    }
  }
  auto run = std::make_shared<Run>();
  run->job = std::move(job);
  run->var = &var;
  run->table = var.sparse;
  run->op = operation_info(opcode).sparse_op;
  run->step = step;
  run->priority = pending.priority;
  run->start_ns = monotonic_ns();
  run->request_groups = request_groups_for(*run->table, run->op, step, run->start_ns);
  var.stats.wait_ns += static_cast<uint64_t>(run->start_ns - pending.first_ns);
  trace_started(run->trace, run->job, var, sparse_op_name(run->op), step, pending.first_ns);
  for (auto& c : pending.by_rank) {
    Run::Worker w;
    w.worker = c->worker;
    w.request_id = c->request_id;
    set_buffers(w, *c->worker, c->in, c->out, c->staged.get());
    run->workers.push_back(std::move(w));
  }
  start(run);
}

void SparseRouter::run_single(std::shared_ptr<Job> job, std::shared_ptr<Completer> worker,
                              Variable& var, const SubmitEntry& entry,
                              std::shared_ptr<StagedRows> staged) {
  if (var.sparse->automatic && hold(*var.sparse, 0, true, [this, job, worker, &var, entry, staged] {
        run_single(job, worker, var, entry, staged);
      }))
    return;
  auto run = std::make_shared<Run>();
  run->job = std::move(job);
  run->var = &var;
  run->table = var.sparse;
  run->op = operation_info(entry.opcode).sparse_op;
  run->start_ns = monotonic_ns();
  trace_started(run->trace, run->job, var, sparse_op_name(run->op), 0, 0);
  Run::Worker w;
  set_buffers(w, *worker, entry.in, entry.out, staged.get());
  w.worker = std::move(worker);
  w.request_id = entry.request_id;
  run->workers.push_back(std::move(w));
  start(run);
}

// Runs of a variable send in the order they started (a node's pushes must reach each owner
// in step order), whatever order their preparation on the pool finishes in.
void SparseRouter::start(const std::shared_ptr<Run>& run) {
  run->table->in_flight[run.get()] = run;  // a dropped run's address may come back
  run->table->send_order.push_back(run);
  if (run->op == SparseOp::kPull) {
    for (const auto& earlier : run->table->send_order) {
      if (earlier->op == SparseOp::kPush && !earlier->has_sent()) {
        run->set_state(RunState::kWaitingForPush);
        return;
      }
    }
  }
  run->set_state(RunState::kPreparing);
  prepare(run);
}

// A pull cannot be served before the pushes ahead of it are applied, so its preparation
// waits until they have been sent rather than take CPU from them (on a busy node the
// pushes would leave later, and the pull be served later too).
void SparseRouter::release_pulls(SparseTable& table) {
  std::vector<std::shared_ptr<Run>> ready;
  for (const auto& run : table.send_order) {
    if (run->op == SparseOp::kPush && !run->has_sent()) break;
    if (run->state == RunState::kWaitingForPush) {
      run->set_state(RunState::kPreparing);  // before any prepare: one may release again
      ready.push_back(run);
    }
  }
  for (const auto& run : ready) prepare(run);
}

// The run is kPreparing (set by the caller).
void SparseRouter::prepare(const std::shared_ptr<Run>& run) {
  bool heavy = run->total_rows() * run->dim() > kRouterInlineValues;
  bool updates = run->op == SparseOp::kPush || run->op == SparseOp::kLoad;
  if (run->op == SparseOp::kPush) {
    run->last_pull_plan = run->table->last_pull_plan;
    run->last_pull_groups = run->table->last_pull_groups;
  }
  ++run->busy;
  offload_.run(
      heavy, [this, run, updates] { updates ? prepare_updates(*run) : prepare_rows(*run); },
      [this, run] {
        --run->busy;
        // Workers whose input was refused learn it now; the others go on.
        for (auto& w : run->workers)
          if (w.status != PX_OK) w.worker->complete(w.request_id, w.status, w.message);
        if (run->op == SparseOp::kPull) {
          run->table->last_pull_plan = run->plan;
          run->table->last_pull_groups = run->request_groups;
        }
        run->set_state(RunState::kPrepared);
        send_next(*run->table);
      });
}

void SparseRouter::send_next(SparseTable& table) {
  release_pulls(table);
  while (!table.send_order.empty()) {
    std::shared_ptr<Run> run = table.send_order.front();
    if (run->state != RunState::kPrepared) return;  // not ready yet, or still sending
    run->set_state(RunState::kSending);
    send(run);
    if (!run->has_sent()) return;  // still summing, or waiting for the variable's global id
    table.send_order.pop_front();
    release_pulls(table);
  }
}

namespace {

// Refuses a worker's request for a bad index (or value); nothing of it is used.
bool check_worker(const SparseTable& table, SparseOp op, size_t dim, const std::string& where,
                  const std::string& who, const int64_t* indices, size_t n, const char* rows,
                  px_status* status, std::string* message) {
  int64_t bad = find_bad_index(indices, n, table.shape.rows);
  if (bad >= 0) {
    *status = PX_ERR_INDEX;
    *message = "index " + std::to_string(indices[bad]) + " at position " + std::to_string(bad) +
               " is outside [0, " + std::to_string(table.shape.rows) + ") in " + who + "'s " +
               op_noun(op) + where + "; nothing of it was applied";
    return false;
  }
  if ((op == SparseOp::kPush && table.options.nonfinite == NonFinite::kReject) ||
      op == SparseOp::kLoad) {
    int64_t row = find_nonfinite_row(reinterpret_cast<const float*>(rows), n, dim);
    if (row >= 0) {
      *status = PX_ERR_INVALID;
      *message = "NaN or Inf in the values for row " + std::to_string(indices[row]) +
                 " (position " + std::to_string(row) + ") from " + who + where +
                 "; nothing of it was applied";
      return false;
    }
  }
  return true;
}

}  // namespace

// pull/read: the union of the workers' rows, grouped by owner.
void SparseRouter::prepare_rows(Run& run) {
  for (auto& w : run.workers) {
    if (!check_worker(*run.table, run.op, run.dim(), run.where(), w.worker->label(), w.indices, w.n,
                      w.rows, &w.status, &w.message))
      continue;
    run.batches.push_back({w.indices, w.n, nullptr});
    run.outs.push_back(reinterpret_cast<float*>(w.rows));
  }
  const SparseTable& table = *run.table;
  run.use_plan(std::make_shared<RowPlan>(run.batches, run.dim(), false, group_count(table, run),
                                         group_of_row(table, run), run.row_order()));
}

// push: the workers' gradients sorted by group (summed later, group by group, as they are
// sent); load: the values as given (last one wins at the owner), grouped by owner, order
// kept within each owner.
void SparseRouter::prepare_updates(Run& run) {
  size_t dim = run.dim();
  std::vector<RowBatch>& batches = run.batches;
  for (auto& w : run.workers) {
    if (!check_worker(*run.table, run.op, dim, run.where(), w.worker->label(), w.indices, w.n,
                      w.rows, &w.status, &w.message))
      continue;
    batches.push_back({w.indices, w.n, reinterpret_cast<const float*>(w.rows)});
  }
  const SparseTable& table = *run.table;
  if (run.op == SparseOp::kPush) {
    bool skip = table.options.nonfinite == NonFinite::kSkip;
    auto all_finite = [&] {
      for (const RowBatch& b : batches)
        if (find_nonfinite_row(b.values, b.n, dim) >= 0) return false;
      return true;
    };
    // The pull's plan serves if it grouped the rows alike (the partition search may have
    // changed the grouping between them).
    if (run.last_pull_plan && run.last_pull_groups == run.request_groups &&
        run.last_pull_plan->matches(batches) && (!skip || all_finite()))
      run.use_plan(std::move(run.last_pull_plan));
    else
      run.use_plan(std::make_shared<RowPlan>(batches, dim, skip, group_count(table, run),
                                             group_of_row(table, run), run.row_order()));
    run.last_pull_plan.reset();
    run.last_pull_groups.reset();
    return;
  }
  // Column-wise: one group, every row (each node gets its columns of all of them).
  size_t groups = table.columns ? 1 : static_cast<size_t>(table.map.nodes());
  auto group_of = [&](int64_t row) {
    return table.columns ? size_t{0} : static_cast<size_t>(target_node(table, row));
  };
  run.begin.assign(groups + 1, 0);
  size_t total = 0;
  for (auto& b : batches) total += b.n;
  for (auto& b : batches)
    for (size_t i = 0; i < b.n; ++i) ++run.begin[group_of(b.rows[i]) + 1];
  for (size_t i = 0; i < groups; ++i) run.begin[i + 1] += run.begin[i];
  std::vector<size_t> fill(run.begin.begin(), run.begin.end() - 1);
  run.rows.resize(total);
  run.values.reset(new float[total * dim]);
  for (auto& b : batches) {
    for (size_t i = 0; i < b.n; ++i) {
      size_t at = fill[group_of(b.rows[i])]++;
      run.rows[at] = b.rows[i];
      std::memcpy(run.values.get() + at * dim, b.values + i * dim, dim * sizeof(float));
    }
  }
}

void SparseRouter::send(const std::shared_ptr<Run>& run) {
  Variable& var = *run->var;
  Job& job = *run->job;
  auto refuse = [&](px_status status, const std::string& why) {
    run->set_state(RunState::kSent);
    finish(*run, status, why);
    // A refused pull that was to close an estimate's window: nothing will be agreed.
    SparseTable& t = *run->table;
    if (t.move.state == MoveState::kHolding && run->op == SparseOp::kPull &&
        run->step + 1 == t.move.hold_from)
      end_hold(t);
  };
  if (run->state == RunState::kFinished) return;  // (a run finishes only once sent)
  if (var.poison_status != PX_OK) return refuse(var.poison_status, var.poison_message);
  if (!job.broken().empty()) return refuse(PX_ERR_PEER_LOST, job.broken() + run->where());
  if (fabric_ && !run->table->channel->started()) {  // not every node registered it yet
    var.awaiting_global_id.push_back([this, run] {
      send(run);
      if (run->has_sent()) {
        run->table->send_order.pop_front();
        send_next(*run->table);
      }
    });
    return;
  }
  SparseTable& table = *run->table;
  if (run->op == SparseOp::kPull) {
    ++table.pull_steps;
    for (auto& w : run->workers) table.rows_pulled += w.n;
    table.rows_unique += run->plan->unique_rows();
    if (table.map.nodes() > 1) sample_route(table, *run);
  }
  if (run->op == SparseOp::kPush) ++table.push_steps;
  // Pulls use the hot-row cache once this node's earlier pushes are decided; every push does.
  if (table.cache && (run->op == SparseOp::kPush ||
                      (run->op == SparseOp::kPull && table.cache->serves(run->step)))) {
    run->cached = true;
    run->trace.cache_rows = 0;
  }
  // A read sees the push steps this node sent before it (sent in order: send_order), once
  // their owners applied them: a table read after training (state_dict, an export) is the
  // trained one even where the last pushes are still on their way to an owner or waiting
  // for another node's part of their step (sync consistency; shard_owner.cc).
  if (run->op == SparseOp::kRead) run->step = table.push_steps;
  if (table.columns) return send_columns(run);
  // Every partition hears of every push step (empty or not): sync and bounded owners count
  // them (and, with prefetch, of every pull step). A replica hears only of this node's pushes
  // (exchanging them is its business); a load goes to every replica. Other nodes' groups first,
  // taking the nodes in turn (from the next node on), so their transfers start while this node's
  // own part is prepared.
  int nodes = table.map.nodes();
  bool to_every_replica = table.replicated && run->op == SparseOp::kLoad;
  // A read of a cached table reaches every node: each flushes its held sums for it.
  bool reads_everywhere = run->op == SparseOp::kRead && table.cache;
  std::vector<std::pair<std::pair<int, int>, int>> order;  // ((turn, node distance), group)
  std::vector<int> turn(static_cast<size_t>(nodes), 0);
  for (int g = 0; g < run->groups(); ++g) {
    int node = run->group_node(g);
    size_t count = run->group_begin(g + 1) - run->group_begin(g);
    bool pushes_here = run->op == SparseOp::kPush && (!table.replicated || node == table.node);
    // With prefetch every partition hears of every pull step too: the rows all nodes pulled
    // in a step are what the next pull step may not be served ahead of.
    bool counts_pulls = run->op == SparseOp::kPull && table.options.prefetch;
    if (count == 0 && !pushes_here && !counts_pulls && !reads_everywhere &&
        !(to_every_replica && run->row_count() > 0))
      continue;
    int distance = (node - table.node - 1 + nodes) % nodes;  // this node last
    int t = node == table.node ? 1 << 30 : turn[static_cast<size_t>(node)]++;
    order.push_back({{t, distance}, g});
  }
  std::sort(order.begin(), order.end());
  for (auto& o : order) run->targets.push_back(o.second);
  run->requests_left = static_cast<int>(run->targets.size());
  if (run->targets.empty()) {
    run->set_state(RunState::kSent);
    return settle(run);
  }
  if (run->op != SparseOp::kPush) {
    for (int group : run->targets) {
      if (run->cached && run->group_node(group) != table.node)
        request_cached_pull(run, group);
      else
        request(run, group);
    }
    run->set_state(RunState::kSent);
    return settle(run);
  }
  if (run->cached) {
    run->table->cache->push_started();
    take_due_rows(*run);
  }
  // Push: sum each group's rows, then send them; on the pool when heavy, where each
  // request to another node leaves as soon as its sums are ready (the channel takes remote
  // requests from any thread; a hop through the loop cost a millisecond on a busy node).
  bool heavy = run->total_rows() * run->dim() > kRouterInlineValues;
  if (!heavy) {
    for (int group : run->targets) {
      sum_group(*run, group);
      request(run, group);
    }
    run->set_state(RunState::kSent);
    if (run->cached) cache_pushed(run->table, run->step);
    return settle(run);
  }
  // Not Offload::run: this task posts to the loop once per local group on the way, not once
  // at its end.
  ++run->busy;
  offload_.pool().submit([this, run] {
    const SparseTable& table = *run->table;
    for (size_t i = 0; i < run->targets.size(); ++i) {
      int group = run->targets[i];
      sum_group(*run, group);
      bool local = run->group_node(group) == table.node;
      if (!local) request(run, group);
      bool last = i + 1 == run->targets.size();
      if (!local && !last) continue;
      offload_.post()([this, run, group, local, last] {
        if (local) request(run, group);
        if (!last) return;
        --run->busy;
        run->set_state(RunState::kSent);
        if (run->cached) cache_pushed(run->table, run->step);
        run->table->send_order.pop_front();
        send_next(*run->table);
        settle(run);  // the requests may all have completed already
      });
    }
  });
}

void SparseRouter::sum_group(Run& run, int group) {
  run.plan->sum_group(group, run.batches, run.values.get());
  // A 16-bit wire dtype: the node's sum is rounded once, here, whether it goes to another
  // node or to this one's shards (wire_values.h).
  WireDtype wire = run.table->options.wire;
  if (wire != WireDtype::kF32 && run.op == SparseOp::kPush)
    round_to_wire(wire, run.group_values(group),
                  (run.group_begin(group + 1) - run.group_begin(group)) * run.table->shape.dim);
}

// One group's request (for a load on a replicated route: every row, to every replica). On
// the loop, or on the pool for a push to another node (nothing here changes shared state).
void SparseRouter::request(const std::shared_ptr<Run>& run, int group) {
  const SparseTable& table = *run->table;
  int node = run->group_node(group);
  if (run->cached && run->op == SparseOp::kPush && node != table.node)
    return request_cached_push(run, group);
  int rows_of = table.replicated && run->op == SparseOp::kLoad ? table.node : group;
  size_t at = run->group_begin(rows_of);
  size_t count = run->group_begin(rows_of + 1) - at;
  bool updates = run->op == SparseOp::kPush || run->op == SparseOp::kLoad;
  float* group_values = run->group_values(rows_of);
  const float* values = updates ? group_values : nullptr;
  float* out = updates ? nullptr : group_values;
  const RequestGroups* groups = run->request_groups.get();
  uint32_t partition = groups ? groups->index(group) : kAllPartitions;
  uint32_t of = groups ? groups->groups_on(node) : 0;
  table.channel->request(
      node, partition, of, run->op, run->step, run->priority, count, run->row_ids() + at, values,
      out, run, [this, run, group](px_status status, const std::string& error) {
        if (status != PX_OK && run->status == PX_OK) {
          run->status = status;
          run->error = error;
        }
        --run->requests_left;
        if (status == PX_OK && sparse_op_returns_rows(run->op) && run->state != RunState::kFinished)
          return scatter(run, group);
        settle(run);
      });
}

// Copies one group's reply rows to every worker position that asked for them.
void SparseRouter::scatter(const std::shared_ptr<Run>& run, int group) {
  bool heavy = run->plan->group_entries(group) * run->dim() > kRouterInlineValues;
  ++run->busy;
  offload_.run(
      heavy,
      [run, group] { run->plan->scatter_group(group, run->group_values(group), run->outs.data()); },
      [this, run] {
        --run->busy;
        settle(run);
      });
}

// Finishes the run once nothing of it is outstanding.
void SparseRouter::settle(const std::shared_ptr<Run>& run) {
  if (!run->outstanding() || run->busy > 0) return;
  if (run->requests_left > 0 && run->state != RunState::kAbandoned) return;
  if (run->status == PX_OK) return finish(*run, PX_OK, "");
  const Job& job = *run->job;
  std::string why = !job.broken().empty() ? job.broken() : run->error;
  finish(*run, run->status, why + run->where());
}

void SparseRouter::release(Variable& var) {
  if (!var.sparse) return;
  SparseTable& table = *var.sparse;
  ++table.move.attempt;  // a route agreement or move under way is given up
  if (table.move.state != MoveState::kIdle) table.move.set(MoveState::kIdle, table.label);
  std::deque<std::function<void()>> held = std::move(table.move.held);
  table.move.held.clear();
  table.move.rows.reset();
  std::deque<std::shared_ptr<Run>> unsent = std::move(table.send_order);
  table.send_order.clear();
  table.in_flight.clear();
  if (table.channel) table.channel->abandon();
  if (table.owner) table.owner->abandon();
}

void SparseRouter::fail_in_flight(Variable& var, px_status status, const std::string& why) {
  if (!var.sparse) return;
  // A route agreement or move cannot complete: the operations it held start (and fail).
  if (move_holds(var.sparse->move.state)) {
    ++var.sparse->move.attempt;
    end_hold(*var.sparse);
  }
  std::vector<std::shared_ptr<Run>> runs;
  for (auto it = var.sparse->in_flight.begin(); it != var.sparse->in_flight.end();) {
    if (std::shared_ptr<Run> run = it->second.lock()) {
      runs.push_back(std::move(run));
      ++it;
    } else {
      PX_LOG_ERROR_AT(var.sparse->log_fields,
                      "variable '%s': an operation was dropped before it completed (a bug); "
                      "its workers get no answer",
                      var.name.c_str());
      it = var.sparse->in_flight.erase(it);
    }
  }
  // Runs still preparing or scattering (a pool thread works on their workers' buffers)
  // finish when that work ends; runs not sent yet see the poison or broken job then.
  for (const std::shared_ptr<Run>& run : runs) {
    if (!run->outstanding()) continue;
    if (run->busy > 0) {
      if (run->status == PX_OK) {
        run->status = status;
        run->error = why;
      }
      if (run->state == RunState::kSent) run->set_state(RunState::kAbandoned);
      continue;
    }
    finish(*run, status, why + run->where());
  }
}

void SparseRouter::finish(Run& run, px_status status, const std::string& message) {
  if (run.state == RunState::kFinished) return;
  run.set_state(RunState::kFinished);
  run.table->in_flight.erase(&run);
  if (move_under_way(run.table->move.state)) post_move_check(run.table);
  Variable& var = *run.var;
  uint64_t bytes = run.total_rows() * (8 + run.dim() * sizeof(float));
  if (status == PX_OK) {
    var.stats.ops += 1;
    var.stats.bytes += bytes;
  }
  trace_finished(run.trace, sparse_route_label(run.table->options), status,
                 status == PX_OK ? bytes : 0);
  var.stats.reduce_ns += static_cast<uint64_t>(monotonic_ns() - run.start_ns);
  for (auto& w : run.workers)
    if (w.status == PX_OK) w.worker->complete(w.request_id, status, message);
}

}  // namespace px
