#include "sparse_router.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "checkpoint.h"
#include "coalesce.h"
#include "log.h"
#include "optimizer.h"
#include "session.h"

namespace px {
namespace {

// Row work above this many values goes to the pool.
constexpr size_t kInlineValues = 32 * 1024;

std::string op_noun(SparseOp op) {
  bool step = op == SparseOp::kPull || op == SparseOp::kPush;
  return std::string(sparse_op_name(op)) + (step ? " step" : "");
}

}  // namespace

struct SparseRun {
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  std::shared_ptr<SparseTable> table;
  SparseOp op = SparseOp::kPull;
  uint64_t step = 0;
  int64_t start_ns = 0;
  struct Worker {
    std::shared_ptr<Session> session;
    uint64_t request_id = 0;
    const int64_t* indices = nullptr;
    size_t n = 0;
    char* rows = nullptr;  // pull/read: out; push: gradients; load: values
    px_status status = PX_OK;
    std::string message;
  };
  std::vector<Worker> workers;
  // Requests, owner-major: node i's rows are rows[begin[i] .. begin[i+1]).
  std::vector<int64_t> rows;
  std::vector<float> values;
  std::vector<size_t> begin;
  // pull/read: the sorted unique rows, and where each sits in `rows`.
  std::vector<int64_t> unique;
  std::vector<size_t> slot;
  int requests_left = 0;
  px_status status = PX_OK;
  std::string error;
  bool finished = false;
  // Only a run waiting on transfers may be failed from outside: while preparing or
  // scattering a pool thread works on its workers' buffers (and it finishes soon anyway).
  bool waiting = false;

  std::string where() const {
    return " (variable '" + var->name + "', " + op_noun(op) +
           (op == SparseOp::kPull || op == SparseOp::kPush ? " " + std::to_string(step) : "") + ")";
  }
  size_t dim() const { return table->shape.dim; }
  size_t total_rows() const {
    size_t n = 0;
    for (auto& w : workers) n += w.n;
    return n;
  }
};

SparseCounters sparse_counters(const SparseTable& table) {
  SparseCounters c;
  c.pull_steps = table.pull_steps;
  c.push_steps = table.push_steps;
  c.rows_pulled = table.rows_pulled;
  c.rows_unique = table.rows_unique;
  c.rows_applied = table.owner->rows_applied();
  c.bytes_sent = table.channel->bytes_sent() + table.owner->bytes_sent();
  c.bytes_received = table.channel->bytes_received() + table.owner->bytes_received();
  return c;
}

std::shared_ptr<SparseTable> SparseRouter::create(const Job& job, const Variable& var,
                                                  SparseShape shape, const SparseOptions& options,
                                                  std::function<std::string(int)> node_label) {
  const JobWorld& world = job.world();
  auto table = std::make_shared<SparseTable>();
  table->shape = shape;
  table->options = options;
  uint32_t partitions =
      options.partitions ? options.partitions : automatic_partitions(shape.rows, world.node_count);
  table->map = PartitionMap(shape.rows, partitions, world.node_count);
  std::string label = "variable '" + var.name + "' of job '" + job.name() + "'";
  table->owner = std::make_shared<ShardOwner>(label, table->map, world.node_index, shape.dim,
                                              options, world.world_size, pool_, post_);
  table->owner->set_names(job.name(), var.name);
  table->replicated = table->owner->replicated();
  table->node = world.node_index;
  table->channel =
      std::make_shared<SparseChannel>(fabric_, world.node_index, world.node_count, shape.dim,
                                      chunk_bytes_, table->owner, post_, std::move(node_label));
  PX_LOG_INFO(
      "%s: %llu x %llu f32, %u partitions, %llu rows (%llu bytes) held here; %s", label.c_str(),
      static_cast<unsigned long long>(shape.rows), static_cast<unsigned long long>(shape.dim),
      table->map.partitions(), static_cast<unsigned long long>(table->owner->owned_rows()),
      static_cast<unsigned long long>(table->owner->store_bytes()), options.canonical().c_str());
  return table;
}

bool SparseRouter::restore(SparseTable& table, const Job& job, const Variable& var,
                           std::string* error) {
  if (restore_dir_.empty()) return true;
  std::string manifest_path = checkpoint_stem(restore_dir_, job.name(), var.name) + ".manifest";
  if (access(manifest_path.c_str(), F_OK) != 0) return true;  // nothing saved for it
  ManifestData manifest;
  if (!read_manifest(manifest_path, &manifest, error)) return false;
  if (manifest.rows != table.shape.rows || manifest.dim != table.shape.dim) {
    *error = manifest_path + " holds " + std::to_string(manifest.rows) + " x " +
             std::to_string(manifest.dim) + ", the variable is " +
             std::to_string(table.shape.rows) + " x " + std::to_string(table.shape.dim);
    return false;
  }
  if (!table.owner->restore(restore_dir_, manifest, error)) {
    *error = manifest_path + ": " + *error;
    return false;
  }
  PX_LOG_INFO(
      "variable '%s' of job '%s' restored from %s (saved on %u nodes, %u partitions, "
      "after %llu push steps; options then: %s)",
      var.name.c_str(), job.name().c_str(), manifest_path.c_str(), manifest.nodes,
      manifest.partitions, static_cast<unsigned long long>(manifest.optimizer_steps),
      manifest.options.c_str());
  return true;
}

void SparseRouter::checkpoint(std::shared_ptr<Job> job, Variable& var, uint64_t push_steps,
                              const std::string& dir,
                              std::function<void(px_status, const std::string&)> done) {
  std::shared_ptr<SparseTable> table = var.sparse;
  if (fabric_ && !table->channel->started()) {
    var.awaiting_global_id.push_back([this, job, &var, push_steps, dir, done] {
      if (var.poison_status != PX_OK) return done(var.poison_status, var.poison_message);
      checkpoint(job, var, push_steps, dir, done);
    });
    return;
  }
  // The directory travels as the request's payload, NUL-padded to whole int64 words.
  auto words = std::make_shared<std::vector<int64_t>>((dir.size() + 8) / 8, 0);
  std::memcpy(words->data(), dir.data(), dir.size());
  int nodes = table->map.nodes();
  struct Pending {
    int left = 0;
    px_status status = PX_OK;
    std::string error;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = nodes;
  std::string variable = var.name;
  for (int node = 0; node < nodes; ++node) {
    table->channel->request(
        node, SparseOp::kCheckpoint, push_steps, words->size(), words->data(), nullptr, nullptr,
        words,
        [job, table, variable, dir, push_steps, pending, done, nodes](px_status status,
                                                                      const std::string& error) {
          if (status != PX_OK && pending->status == PX_OK) {
            pending->status = status;
            pending->error = error;
          }
          if (--pending->left > 0) return;
          if (pending->status != PX_OK)
            return done(pending->status,
                        "checkpoint of variable '" + variable + "' failed: " + pending->error);
          // Every shard file is in place: the manifest makes the checkpoint exist.
          ManifestData m;
          m.job = job->name();
          m.variable = variable;
          m.rows = table->shape.rows;
          m.dim = table->shape.dim;
          m.options = table->options.canonical();
          m.state_slots = static_cast<uint32_t>(optimizer_state_slots(table->options.optimizer));
          m.optimizer_steps = push_steps;
          m.nodes = static_cast<uint32_t>(nodes);
          m.partitions = table->map.partitions();
          std::string stem = checkpoint_stem(dir, job->name(), variable);
          std::string base = stem.substr(stem.rfind('/') + 1);
          for (int i = 0; i < nodes; ++i)
            m.shard_files.push_back(base + ".node" + std::to_string(i) + ".shard");
          std::string write_error;
          if (!write_manifest(stem + ".manifest", m, &write_error))
            return done(PX_ERR_INVALID,
                        "checkpoint of variable '" + variable + "': " + write_error);
          PX_LOG_INFO("checkpoint of variable '%s' of job '%s' after %llu push steps: %s.manifest",
                      variable.c_str(), job->name().c_str(),
                      static_cast<unsigned long long>(push_steps), stem.c_str());
          done(PX_OK, "");
        });
  }
}

void SparseRouter::start_variable(Variable& var, uint32_t global_id) {
  var.sparse->owner->attach(fabric_, global_id, chunk_bytes_);
  var.sparse->channel->start(global_id);
}

namespace {

// The node a request for row goes to: its owner, or this node's replica.
int target_node(const SparseTable& table, int64_t row) {
  return table.replicated ? table.node : table.map.owner(static_cast<uint64_t>(row));
}

}  // namespace

void SparseRouter::run_step(std::shared_ptr<Job> job, Variable& var, Opcode opcode, uint64_t step,
                            PendingStep pending) {
  auto run = std::make_shared<Run>();
  run->job = std::move(job);
  run->var = &var;
  run->table = var.sparse;
  run->op = opcode == Opcode::kPullRows ? SparseOp::kPull : SparseOp::kPush;
  run->step = step;
  run->start_ns = monotonic_ns();
  var.stats.wait_ns += static_cast<uint64_t>(run->start_ns - pending.first_ns);
  for (auto& c : pending.by_rank) {
    Run::Worker w;
    w.session = c->session;
    w.request_id = c->request_id;
    char* base = c->session->arena().base();
    w.indices = reinterpret_cast<const int64_t*>(base + c->in.offset);
    w.n = c->in.bytes / sizeof(int64_t);
    w.rows = base + c->out.offset;
    run->workers.push_back(std::move(w));
  }
  start(run);
}

void SparseRouter::run_single(std::shared_ptr<Session> session, Variable& var,
                              const SubmitEntry& entry) {
  auto run = std::make_shared<Run>();
  run->job = session->job_ref();
  run->var = &var;
  run->table = var.sparse;
  run->op =
      entry.opcode == static_cast<uint16_t>(Opcode::kLoadRows) ? SparseOp::kLoad : SparseOp::kRead;
  run->start_ns = monotonic_ns();
  Run::Worker w;
  char* base = session->arena().base();
  w.indices = reinterpret_cast<const int64_t*>(base + entry.in.offset);
  w.n = entry.in.bytes / sizeof(int64_t);
  w.rows = base + entry.out.offset;
  w.session = std::move(session);
  w.request_id = entry.request_id;
  run->workers.push_back(std::move(w));
  start(run);
}

void SparseRouter::start(const std::shared_ptr<Run>& run) {
  run->table->in_flight.insert(run.get());
  bool heavy = run->total_rows() * run->dim() > kInlineValues;
  bool updates = run->op == SparseOp::kPush || run->op == SparseOp::kLoad;
  offload(
      heavy, [this, run, updates] { updates ? prepare_updates(*run) : prepare_rows(*run); },
      [this, run] {
        run->waiting = true;
        // Workers whose input was refused learn it now; the others go on.
        for (auto& w : run->workers)
          if (w.status != PX_OK) w.session->complete(w.request_id, w.status, w.message);
        send(run);
      });
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
  std::vector<RowBatch> batches;
  for (auto& w : run.workers) {
    if (!check_worker(*run.table, run.op, run.dim(), run.where(), w.session->label(), w.indices,
                      w.n, w.rows, &w.status, &w.message))
      continue;
    batches.push_back({w.indices, w.n, nullptr});
  }
  run.unique = unique_rows(batches);
  const PartitionMap& map = run.table->map;
  size_t nodes = static_cast<size_t>(map.nodes());
  run.begin.assign(nodes + 1, 0);
  std::vector<int> owner(run.unique.size());
  for (size_t i = 0; i < run.unique.size(); ++i) {
    owner[i] = target_node(*run.table, run.unique[i]);
    ++run.begin[static_cast<size_t>(owner[i]) + 1];
  }
  for (size_t i = 0; i < nodes; ++i) run.begin[i + 1] += run.begin[i];
  std::vector<size_t> fill(run.begin.begin(), run.begin.end() - 1);
  run.rows.resize(run.unique.size());
  run.slot.resize(run.unique.size());
  for (size_t i = 0; i < run.unique.size(); ++i) {
    size_t at = fill[static_cast<size_t>(owner[i])]++;
    run.rows[at] = run.unique[i];
    run.slot[i] = at;
  }
  run.values.resize(run.rows.size() * run.dim());
}

// push: the workers' gradients coalesced; load: the values as given (last one wins at the
// owner). Either way grouped by owner, order kept within each owner.
void SparseRouter::prepare_updates(Run& run) {
  size_t dim = run.dim();
  std::vector<RowBatch> batches;
  for (auto& w : run.workers) {
    if (!check_worker(*run.table, run.op, dim, run.where(), w.session->label(), w.indices, w.n,
                      w.rows, &w.status, &w.message))
      continue;
    batches.push_back({w.indices, w.n, reinterpret_cast<const float*>(w.rows)});
  }
  std::vector<int64_t> rows;
  std::vector<float> values;
  if (run.op == SparseOp::kPush) {
    CoalescedRows sum;
    coalesce(batches, dim, run.table->options.nonfinite == NonFinite::kSkip, &sum);
    rows = std::move(sum.rows);
    values = std::move(sum.values);
  } else {
    for (auto& b : batches) {
      rows.insert(rows.end(), b.rows, b.rows + b.n);
      values.insert(values.end(), b.values, b.values + b.n * dim);
    }
  }
  const PartitionMap& map = run.table->map;
  size_t nodes = static_cast<size_t>(map.nodes());
  run.begin.assign(nodes + 1, 0);
  for (int64_t r : rows) ++run.begin[static_cast<size_t>(target_node(*run.table, r)) + 1];
  for (size_t i = 0; i < nodes; ++i) run.begin[i + 1] += run.begin[i];
  std::vector<size_t> fill(run.begin.begin(), run.begin.end() - 1);
  run.rows.resize(rows.size());
  run.values.resize(values.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    size_t at = fill[static_cast<size_t>(target_node(*run.table, rows[i]))]++;
    run.rows[at] = rows[i];
    std::memcpy(run.values.data() + at * dim, values.data() + i * dim, dim * sizeof(float));
  }
}

void SparseRouter::send(const std::shared_ptr<Run>& run) {
  Variable& var = *run->var;
  Job& job = *run->job;
  if (var.poison_status != PX_OK) return finish(*run, var.poison_status, var.poison_message);
  if (!job.broken().empty()) return finish(*run, PX_ERR_PEER_LOST, job.broken() + run->where());
  if (run->finished) return;
  if (fabric_ && !run->table->channel->started()) {  // not every node registered it yet
    var.awaiting_global_id.push_back([this, run] { send(run); });
    return;
  }
  if (run->op == SparseOp::kPull) {
    ++run->table->pull_steps;
    for (auto& w : run->workers) run->table->rows_pulled += w.n;
    run->table->rows_unique += run->unique.size();
  }
  if (run->op == SparseOp::kPush) ++run->table->push_steps;
  int nodes = run->table->map.nodes();
  // Every owner hears of every push step (empty or not): sync and bounded owners count them.
  // A replica hears only of this node's pushes (exchanging them is its business); a load
  // goes to every replica.
  const SparseTable& table = *run->table;
  bool to_every_replica = table.replicated && run->op == SparseOp::kLoad;
  std::vector<int> targets;
  for (int node = 0; node < nodes; ++node) {
    size_t count =
        run->begin[static_cast<size_t>(node) + 1] - run->begin[static_cast<size_t>(node)];
    bool pushes_here = run->op == SparseOp::kPush && (!table.replicated || node == table.node);
    if (count > 0 || pushes_here || (to_every_replica && !run->rows.empty()))
      targets.push_back(node);
  }
  run->requests_left = static_cast<int>(targets.size());
  if (targets.empty()) return deliver(run);
  size_t dim = run->dim();
  for (int node : targets) {
    size_t at = run->begin[static_cast<size_t>(node)];
    size_t count = run->begin[static_cast<size_t>(node) + 1] - at;
    if (to_every_replica) {  // every row was grouped under this node: send them everywhere
      at = run->begin[static_cast<size_t>(table.node)];
      count = run->begin[static_cast<size_t>(table.node) + 1] - at;
    }
    bool updates = run->op == SparseOp::kPush || run->op == SparseOp::kLoad;
    const float* values = updates ? run->values.data() + at * dim : nullptr;
    float* out = updates ? nullptr : run->values.data() + at * dim;
    run->table->channel->request(node, run->op, run->step, count, run->rows.data() + at, values,
                                 out, run, [this, run](px_status status, const std::string& error) {
                                   if (status != PX_OK && run->status == PX_OK) {
                                     run->status = status;
                                     run->error = error;
                                   }
                                   if (--run->requests_left == 0) deliver(run);
                                 });
  }
}

void SparseRouter::deliver(const std::shared_ptr<Run>& run) {
  if (run->finished) return;
  if (run->status != PX_OK) {
    const Job& job = *run->job;
    std::string why = !job.broken().empty() ? job.broken() : run->error;
    return finish(*run, run->status, why + run->where());
  }
  if (!sparse_op_returns_rows(run->op)) return finish(*run, PX_OK, "");
  run->waiting = false;
  bool heavy = run->total_rows() * run->dim() > kInlineValues;
  offload(
      heavy, [this, run] { scatter(*run); }, [this, run] { finish(*run, PX_OK, ""); });
}

// Each worker's rows, in its own order (duplicates included), from the owners' replies.
void SparseRouter::scatter(Run& run) {
  size_t dim = run.dim();
  for (auto& w : run.workers) {
    if (w.status != PX_OK) continue;
    float* out = reinterpret_cast<float*>(w.rows);
    for (size_t i = 0; i < w.n; ++i) {
      size_t u =
          static_cast<size_t>(std::lower_bound(run.unique.begin(), run.unique.end(), w.indices[i]) -
                              run.unique.begin());
      std::memcpy(out + i * dim, run.values.data() + run.slot[u] * dim, dim * sizeof(float));
    }
  }
}

void SparseRouter::fail_in_flight(Variable& var, px_status status, const std::string& why) {
  if (!var.sparse) return;
  std::set<Run*> runs = var.sparse->in_flight;
  for (Run* run : runs)
    if (run->waiting) finish(*run, status, why + run->where());
}

void SparseRouter::finish(Run& run, px_status status, const std::string& message) {
  if (run.finished) return;
  run.finished = true;
  run.table->in_flight.erase(&run);
  Variable& var = *run.var;
  if (status == PX_OK) {
    var.stats.ops += 1;
    var.stats.bytes += run.total_rows() * (8 + run.dim() * sizeof(float));
  }
  var.stats.reduce_ns += static_cast<uint64_t>(monotonic_ns() - run.start_ns);
  for (auto& w : run.workers)
    if (w.status == PX_OK) w.session->complete(w.request_id, status, message);
}

void SparseRouter::offload(bool heavy, std::function<void()> work, std::function<void()> then) {
  if (!heavy) {
    work();
    then();
    return;
  }
  auto shared_then = std::make_shared<std::function<void()>>(std::move(then));
  pool_.submit([this, work = std::move(work), shared_then] {
    work();
    post_([shared_then] { (*shared_then)(); });
  });
}

}  // namespace px
