// The node's side of a sparse variable's table: creating it (partitioning, owner,
// channel, partition search), restoring and checkpointing it, its counters, and the
// request grouping each step uses. The steps themselves are in sparse_router.cc.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "daemon/common/log.h"
#include "daemon/common/status_join.h"
#include "daemon/sparse/sparse_router.h"
#include "sharding/checkpoint.h"
#include "sharding/checkpoint_generations.h"
#include "sharding/optimizer.h"
#include "sharding/wire_values.h"

namespace px {

SparseCounters sparse_counters(const SparseTable& table) {
  SparseCounters c;
  c.pull_steps = table.pull_steps;
  c.push_steps = table.push_steps;
  c.rows_pulled = table.rows_pulled;
  c.rows_unique = table.rows_unique;
  c.rows_applied = table.owner->rows_applied();
  c.rows_served_ahead = table.owner->rows_served_ahead();
  c.bytes_sent = table.channel->bytes_sent() + table.owner->bytes_sent();
  c.bytes_received = table.channel->bytes_received() + table.owner->bytes_received();
  c.restored_steps = table.restored_steps;
  if (table.cache) {
    HotRowCounters h = table.cache->counters();
    c.cache_hits = h.hits;
    c.cache_misses = h.misses;
    c.cache_rows = h.rows;
    c.cache_bytes_saved = h.bytes_saved;
    c.cache_rows_flushed = h.rows_flushed;
  }
  if (table.columns) {
    // Column-wise alltoall: a step's requests, one to each node that holds columns.
    for (const ColumnRange& range : table.column_ranges) c.request_partitions += range.width() > 0;
  } else if (!table.replicated) {
    if (table.search) c.search_steps_left = table.search->steps_left();
    c.request_partitions =
        static_cast<uint64_t>(table.groups_for(table.requests_per_node(table.push_steps))->count());
  }
  return c;
}

std::shared_ptr<SparseTable> SparseRouter::create(const Job& job, const Variable& var,
                                                  SparseShape shape, const SparseOptions& options,
                                                  std::function<std::string(int)> node_label) {
  const JobWorld& world = job.world();
  auto table = std::make_shared<SparseTable>();
  table->shape = shape;
  table->node = world.node_index;
  table->nodes = world.node_count;
  table->world_size = world.world_size;
  table->job_name = job.name();
  table->var_name = var.name;
  table->var = const_cast<Variable*>(&var);  // fail_move poisons it (loop thread)
  table->label = "variable '" + var.name + "' of job '" + job.name() + "'";
  table->log_fields = job_fields(job.name(), var.name);
  // PX_ROUTE_AUTO (and sync hybrid) starts on ps (route_move.cc moves it).
  SparseOptions on = options;
  table->automatic = options.route_chosen_by_router();
  table->declared_partitions = options.partitions;
  if (table->automatic) on.route = Route::kPs;
  std::string why_partitions;
  std::vector<size_t> widths = lay_out(*table, on, &why_partitions);
  table->channel = std::make_shared<SparseChannel>(
      fabric_, world.node_index, world.node_count, widths, chunk_bytes_, table->owner,
      offload_.post(), std::move(node_label), options.wire, options.prefetch);
  wire_copies(table);
  if (options.cache_rows > 0 && world.node_count > 1) {
    table->cache =
        std::make_unique<HotRowCache>(shape.dim, options.cache_rows, options.cache_staleness,
                                      sizeof(int64_t) + shape.dim * wire_value_bytes(options.wire));
    std::weak_ptr<SparseTable> weak = table;
    table->owner->set_flush_hook([this, weak](uint64_t steps) {
      if (std::shared_ptr<SparseTable> t = weak.lock()) flush_cache(t, steps);
    });
  }
  PX_LOG_INFO_AT(
      table->log_fields,
      "%s: %llu x %llu f32, %u partitions (%s), %llu rows (%llu bytes) held here; %s%s",
      table->label.c_str(), static_cast<unsigned long long>(shape.rows),
      static_cast<unsigned long long>(shape.dim), table->map.partitions(), why_partitions.c_str(),
      static_cast<unsigned long long>(table->owner->owned_rows()),
      static_cast<unsigned long long>(table->owner->store_bytes()), options.canonical().c_str(),
      table->automatic && world.node_count > 1
          ? "; starts on ps, moved to the route the estimates choose (route_move.cc)"
          : "");
  return table;
}

std::vector<size_t> SparseRouter::lay_out(SparseTable& table, const SparseOptions& options,
                                          std::string* why_partitions, bool initialise) {
  const SparseShape& shape = table.shape;
  int nodes = table.nodes, node = table.node;
  table.options = options;
  // alltoall: one slice per node (by rows: row % N; by columns: column_split.h).
  bool alltoall = options.route == Route::kAlltoall;
  uint32_t partitions = alltoall             ? static_cast<uint32_t>(nodes)
                        : options.partitions ? options.partitions
                                             : automatic_partitions(shape.rows, nodes);
  table.map = PartitionMap(shape.rows, partitions, nodes);
  table.owner =
      std::make_shared<ShardOwner>(table.label, table.map, node, shape.dim, options,
                                   table.world_size, offload_.pool(), offload_.post(), initialise);
  table.owner->set_names(table.job_name, table.var_name);
  if (!table.learning_rates)
    table.learning_rates = std::make_shared<LearningRates>(options.learning_rate);
  table.owner->set_learning_rates(table.learning_rates);
  table.replicated = table.owner->replicated();
  table.columns = table.owner->column_slice();
  if (hands_over(table)) table.owner->keep_journal(kHandoverJournalSteps);
  table.column_ranges.clear();
  table.search.reset();
  table.request_groups.clear();
  table.last_pull_plan.reset();
  table.last_pull_groups.reset();
  if (table.columns) table.column_ranges = column_ranges(shape.dim, nodes);
  *why_partitions = "as asked, one per request";
  if (alltoall && table.columns) {
    const ColumnRange& held = table.column_ranges[static_cast<size_t>(node)];
    *why_partitions = "alltoall by columns: every row's columns [" + std::to_string(held.begin) +
                      ", " + std::to_string(held.end) + ") held here";
  } else if (alltoall) {
    *why_partitions = "alltoall by rows: one partition per node";
  } else if (!options.partitions && !table.replicated) {
    size_t fewest = table.map.partitions();
    for (int n = 0; n < nodes; ++n) fewest = std::min(fewest, table.map.partitions_of(n).size());
    std::vector<uint32_t> candidates;
    for (uint32_t k = 1; k <= fewest && k <= kAutomaticPartitionsPerNode; k *= 2)
      candidates.push_back(k);
    if (candidates.size() > 1) {
      table.search.emplace(candidates, nodes);
      *why_partitions = "automatic; requests per node are chosen from timed push steps 0-" +
                        std::to_string(table.search->search_steps()) +
                        " (partition_search.h, README: Partitioning)";
    } else {
      *why_partitions = "automatic; too few rows for more than one per node, nothing to search";
    }
  } else if (!options.partitions) {
    *why_partitions = "automatic";
  }
  return row_widths(shape.dim, nodes, options);
}

std::vector<size_t> SparseRouter::row_widths(uint64_t dim, int nodes,
                                             const SparseOptions& options) {
  std::vector<size_t> widths(static_cast<size_t>(nodes), dim);
  if (options.column_split()) {
    std::vector<ColumnRange> ranges = column_ranges(dim, nodes);
    for (size_t i = 0; i < widths.size(); ++i) widths[i] = ranges[i].width();
  }
  return widths;
}

bool SparseRouter::restore(SparseTable& table, const Job& job, const Variable& var,
                           std::string* error) {
  if (restore_dir_.empty()) return true;
  std::string manifest_path = restore_manifest(restore_dir_, job.name(), var.name);
  if (manifest_path.empty()) return true;  // nothing saved for it
  std::string manifest_dir = manifest_path.substr(0, manifest_path.rfind('/'));
  ManifestData manifest;
  if (!read_manifest(manifest_path, &manifest, error)) return false;
  if (manifest.rows != table.shape.rows || manifest.dim != table.shape.dim) {
    *error = manifest_path + " holds " + std::to_string(manifest.rows) + " x " +
             std::to_string(manifest.dim) + ", the variable is " +
             std::to_string(table.shape.rows) + " x " + std::to_string(table.shape.dim);
    return false;
  }
  if (!table.owner->restore(manifest_dir, manifest, error)) {
    *error = manifest_path + ": " + *error;
    return false;
  }
  table.restored_steps = manifest.optimizer_steps;
  PX_LOG_INFO_AT(job_fields(job.name(), var.name),
                 "variable '%s' of job '%s' restored from %s (saved on %u nodes, %u partitions, "
                 "after %llu push steps; options then: %s)",
                 var.name.c_str(), job.name().c_str(), manifest_path.c_str(), manifest.nodes,
                 manifest.partitions, static_cast<unsigned long long>(manifest.optimizer_steps),
                 manifest.options.c_str());
  return true;
}

void SparseRouter::checkpoint(std::shared_ptr<Job> job, Variable& var, uint64_t push_steps,
                              const std::string& dir, StatusCallback done) {
  std::shared_ptr<SparseTable> table = var.sparse;
  if (table->automatic && hold(*table, 0, true, [this, job, &var, push_steps, dir, done] {
        checkpoint(job, var, push_steps, dir, done);
      }))
    return;
  if (fabric_ && !table->channel->started()) {
    var.awaiting_global_id.push_back([this, job, &var, push_steps, dir, done] {
      if (var.poison_status != PX_OK) return done(var.poison_status, var.poison_message);
      if (!job->broken().empty()) return done(PX_ERR_PEER_LOST, job->broken());
      checkpoint(job, var, push_steps, dir, done);
    });
    return;
  }
  // The directory travels as the request's payload, NUL-padded to whole int64 words.
  auto words = std::make_shared<std::vector<int64_t>>((dir.size() + 8) / 8, 0);
  std::memcpy(words->data(), dir.data(), dir.size());
  int nodes = table->map.nodes();
  std::string variable = var.name;
  ++table->checkpoints_in_flight;  // a move waits for it (route_move.cc)
  StatusCallback written = join_statuses(
      static_cast<size_t>(nodes), [this, job, table, variable, dir, push_steps, done, nodes](
                                      px_status status, const std::string& error) {
        --table->checkpoints_in_flight;
        if (move_under_way(table->move.state)) post_move_check(table);
        if (status != PX_OK)
          return done(status, "checkpoint of variable '" + variable + "' failed: " + error);
        // Every shard file is in place: the manifest makes the checkpoint exist.
        ManifestData m;
        m.job = job->name();
        m.variable = variable;
        m.rows = table->shape.rows;
        m.dim = table->shape.dim;
        m.options = table->options.canonical();
        m.state_slots = static_cast<uint32_t>(optimizer_state_slots(table->options.optimizer));
        m.optimizer_steps = table->restored_steps + push_steps;
        m.nodes = static_cast<uint32_t>(nodes);
        m.partitions = table->map.partitions();
        std::string stem = checkpoint_stem(dir, job->name(), variable);
        std::string base = stem.substr(stem.rfind('/') + 1);
        for (int i = 0; i < nodes; ++i)
          m.shard_files.push_back(base + ".node" + std::to_string(i) + ".shard");
        std::string write_error;
        if (!write_manifest(stem + ".manifest", m, &write_error))
          return done(PX_ERR_INVALID, "checkpoint of variable '" + variable + "': " + write_error);
        PX_LOG_INFO_AT(job_fields(job->name(), variable),
                       "checkpoint of variable '%s' of job '%s' after %llu push steps: %s.manifest",
                       variable.c_str(), job->name().c_str(),
                       static_cast<unsigned long long>(push_steps), stem.c_str());
        done(PX_OK, "");
      });
  for (int node = 0; node < nodes; ++node)
    table->channel->request(node, kAllPartitions, 0, SparseOp::kCheckpoint, push_steps, 0,
                            words->size(), words->data(), nullptr, nullptr, words, written);
}

void SparseRouter::start_variable(Variable& var, uint32_t global_id) {
  var.sparse->global_id = global_id;
  var.sparse->owner->attach(fabric_, global_id, chunk_bytes_);
  if (fabric_ && hands_over(*var.sparse)) return take_over(var.sparse);
  var.sparse->channel->start(global_id);
}

// ps/hybrid pulls and pushes: the grouping of this step's requests (the partition search's
// trial or choice; one partition per request when the count was given). A push step's
// start is what the search times.
std::shared_ptr<const RequestGroups> SparseRouter::request_groups_for(SparseTable& table,
                                                                      SparseOp op, uint64_t step,
                                                                      int64_t now_ns) {
  if (table.replicated || table.columns) return nullptr;
  if (table.search && op == SparseOp::kPush &&
      table.search->push_started(step, static_cast<double>(now_ns) * 1e-9))
    PX_LOG_INFO_AT(table.log_fields, "%s: partition search: %s", table.label.c_str(),
                   table.search->report().c_str());
  return table.groups_for(table.requests_per_node(step));
}

}  // namespace px
