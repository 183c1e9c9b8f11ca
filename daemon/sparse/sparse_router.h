// The node side of sparse variables: turns the local workers' pulls and pushes into one
// request per owning shard (the union of their rows; their gradients coalesced), sends them
// through the variable's SparseChannel and hands the results back to every worker.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "daemon/common/job.h"
#include "daemon/common/log.h"
#include "daemon/common/offload.h"
#include "daemon/sparse/hot_row_cache.h"
#include "daemon/sparse/route_move_state.h"
#include "daemon/sparse/shard_owner.h"
#include "daemon/sparse/sparse_channel.h"
#include "sharding/column_split.h"
#include "sharding/handover.h"
#include "sharding/partition_map.h"
#include "sharding/partition_search.h"
#include "sharding/request_groups.h"
#include "sharding/row_plan.h"
#include "sharding/sparse_spec.h"
#include "transport/collectives/collective_transport.h"
#include "transport/kernels/uninit_vector.h"

namespace px {

struct SparseRun;

// The push steps a handed-over partition can go back (sharding/step_journal.h): partitions
// stand at most a step or two apart when a node is lost mid-step.
constexpr size_t kHandoverJournalSteps = 3;

// What the route model (route_model.h) measures, over the pull steps since the last
// estimate: unique rows, and how many fell on each node under the ps map and under
// alltoall's (route_estimate.cc).
struct RouteSample {
  uint64_t first_step = 0, pulls = 0;
  double unique_rows = 0;
  std::vector<double> ps_rows, alltoall_rows;
};

// A table's route estimates: the window being sampled, the maps it is sampled under, the
// route the last estimate chose (logged when it changes; a PX_ROUTE_AUTO table then moves
// to it), and where a scripted sequence (--route-auto-sequence) goes on.
struct RouteEstimates {
  RouteSample sample;
  std::optional<PartitionMap> ps_map, alltoall_map;
  std::string chosen;
  size_t script_at = 0;
};

// A PX_ROUTE_AUTO table's estimate and move (route_move.cc). Every estimate is agreed: the
// nodes all-gather their samples and decide alike; operations of steps from hold_from on
// (and, once a move drains, every operation) wait in held until the agreement and any move
// are done, then start in the order they came. A move drains the table's operations, takes
// every node's rows at the cut (push steps before hold_from applied everywhere) and lays the
// table out anew. Where it is: state (route_move_state.h, changed only through set()).
struct RouteMove {
  MoveState state = MoveState::kIdle;
  uint64_t hold_from = UINT64_MAX;
  std::deque<std::function<void()>> held;
  uint64_t attempt = 0;  // a failed agreement or move: its late callbacks see a newer one
  uint64_t agreements = 0, completed = 0;  // sample all-gathers started, moves done (tags)
  std::string to;                          // the route a move goes to
  // A move's rows, every node's export, kept while the table's operations still drain.
  struct Rows {
    std::shared_ptr<ShardFileData> own;  // a replicated table's: this node's replica, whole
    UninitVector<char> images;           // the nodes' exports as exchanged (shard images)
    std::vector<ShardView> views;        // into own or images
  };
  std::shared_ptr<Rows> rows;  // kGathered
  uint64_t applies = 0;        // the most optimizer applications any node counted
  int64_t start_ns = 0, exported_ns = 0, gathered_ns = 0;  // for its log line

  // Changes state; an illegal change is a bug (logged, then the daemon aborts).
  void set(MoveState to_state, const std::string& label);
};

// What a node holds for one sparse variable.
struct SparseTable {
  std::string label;     // "variable 'v' of job 'j'", for logs
  LogFields log_fields;  // the same, as log fields
  std::string job_name, var_name;
  SparseShape shape;
  SparseOptions options;  // the route is the one the table is on (never kAuto)
  int nodes = 1, world_size = 1;
  PartitionMap map;         // ps: where rows live
  bool replicated = false;  // allgatherv/allreduce routes: every node holds every row
  // Column-wise alltoall: every node holds every row's columns column_ranges[node]; a step
  // sends every node the rows and its columns of them (column_requests.cc).
  bool columns = false;
  std::vector<ColumnRange> column_ranges;
  int node = 0;
  std::shared_ptr<ShardOwner> owner;
  std::shared_ptr<SparseChannel> channel;
  // px_set_sparse_lr's changes, by push step; every owner the table has reads them.
  std::shared_ptr<LearningRates> learning_rates;
  // Counters for stats: rows the local workers pulled (duplicates included) and the rows
  // this node asked the shards for (their union), summed over pull steps.
  uint64_t pull_steps = 0;
  uint64_t push_steps = 0;
  // The optimizer steps of the checkpoint the table was restored from (0: not restored);
  // a checkpoint of this run records restored_steps + push_steps.
  uint64_t restored_steps = 0;
  uint64_t rows_pulled = 0;
  uint64_t rows_unique = 0;
  // ps/hybrid: the automatic partition count's search (absent when the count was given),
  // and the requests of a step grouped for K requests per node (cached by K).
  std::optional<PartitionSearch> search;
  uint32_t requests_per_node(uint64_t step) const {
    return search ? search->per_node_for(step) : kept_per_node ? kept_per_node : map.partitions();
  }
  uint32_t kept_per_node = 0;  // moved onto ps: the search's earlier choice (or its start)
  std::shared_ptr<const RequestGroups> groups_for(uint32_t per_node) const {
    std::shared_ptr<const RequestGroups>& groups = request_groups[per_node];
    if (!groups) groups = std::make_shared<const RequestGroups>(map, per_node);
    return groups;
  }
  mutable std::map<uint32_t, std::shared_ptr<const RequestGroups>> request_groups;
  // The last pull's plan: a push of the same indices (the usual step) sums through it.
  std::shared_ptr<const RowPlan> last_pull_plan;
  std::shared_ptr<const RequestGroups> last_pull_groups;
  // Operations past local matching, not yet complete. Weak: the last reference to a run
  // may go on a pool or progress thread, so a run can never be erased by its destructor; one
  // dropped unfinished (a bug) is then found expired here rather than left dangling.
  std::map<SparseRun*, std::weak_ptr<SparseRun>> in_flight;
  // Operations in the order they started; each sends once those before it have sent.
  std::deque<std::shared_ptr<SparseRun>> send_order;
  // Cluster: the route estimates (route_estimate.cc) and, PX_ROUTE_AUTO, the moves they
  // choose (route_move.cc).
  RouteEstimates estimates;
  bool automatic = false;
  uint32_t declared_partitions = 0;  // px_sparse_options.partitions (ps after a move)
  RouteMove move;
  uint32_t global_id = 0;
  uint64_t pushes_started = 0;         // push steps started here (the next one's number)
  uint64_t pulls_started = 0;          // pull steps started here (windows of the estimates)
  uint64_t checkpoints_in_flight = 0;  // a move waits for them (they bypass the runs)
  Variable* var = nullptr;             // the variable whose table this is (fail_move)
  // px_sparse_options.cache_rows on a cluster: this node's copies of other nodes' hot rows
  // and its held gradient sums (hot_row_cache.h, cached_requests.cc).
  std::unique_ptr<HotRowCache> cache;
};

struct SparseCounters {
  uint64_t pull_steps = 0, push_steps = 0, rows_pulled = 0, rows_unique = 0, rows_applied = 0,
           bytes_sent = 0, bytes_received = 0, request_partitions = 0, search_steps_left = 0,
           restored_steps = 0, rows_served_ahead = 0, cache_hits = 0, cache_misses = 0,
           cache_rows = 0, cache_bytes_saved = 0, cache_rows_flushed = 0;
};
SparseCounters sparse_counters(const SparseTable& table);

class SparseRouter {
 public:
  SparseRouter(ThreadPool& pool, PostToLoop post) : offload_(pool, std::move(post)) {}

  void set_fabric(CollectiveTransport* fabric, size_t chunk_bytes) {
    fabric_ = fabric;
    chunk_bytes_ = chunk_bytes;
  }

  // Sets up the variable's table on this node (its shards allocated and initialised).
  std::shared_ptr<SparseTable> create(const Job& job, const Variable& var, SparseShape shape,
                                      const SparseOptions& options,
                                      std::function<std::string(int)> node_label);

  // Pull steps between route estimates; the routes PX_ROUTE_AUTO tables move through instead
  // of the estimates' choices (empty: the estimates'). Config: [routes].
  void set_route_choice(uint64_t estimate_steps, std::vector<std::string> sequence) {
    route_estimate_steps_ = estimate_steps;
    route_sequence_ = std::move(sequence);
  }
  // Checkpoints are restored from this directory when variables are registered.
  void set_restore_dir(std::string dir) { restore_dir_ = std::move(dir); }
  // Loads the variable's rows from the restore directory's checkpoint, if it has one.
  bool restore(SparseTable& table, const Job& job, const Variable& var, std::string* error);
  // Writes every node's shards of the variable to dir once push_steps push steps are
  // applied everywhere, then the manifest; done on the loop thread.
  void checkpoint(std::shared_ptr<Job> job, Variable& var, uint64_t push_steps,
                  const std::string& dir, StatusCallback done);

  // Cluster: every node registered the variable alike; its bulk messages use global_id.
  // A table handed over (below) starts once every node's part is in.
  void start_variable(Variable& var, uint32_t global_id);

  // Elastic handover (table_handover.cc, sharding/handover.h): with membership on, a
  // synchronous table's partitions are kept when its run breaks, and the job's next run
  // takes them rather than the periodic checkpoint.
  void set_handover(bool on) { handover_ = on; }
  bool hands_over(const SparseTable& table) const;
  bool handover_on() const { return handover_; }
  // The table's run (`run` of epoch `epoch`) broke: what this node holds of it is kept for
  // the job's next run. One no run took within ten minutes is freed at the next keep.
  void keep_for_next_run(const std::shared_ptr<SparseTable>& table, uint64_t epoch, uint64_t run);

  // A pull or push step every local worker submitted.
  void run_step(std::shared_ptr<Job> job, Variable& var, Opcode opcode, uint64_t step,
                PendingStep pending);
  // One worker's load or read (not steps); staged: its buffers staged in host memory
  // (device memory: device_rows_step.h), read and written instead of entry's.
  void run_single(std::shared_ptr<Job> job, std::shared_ptr<Completer> worker, Variable& var,
                  const SubmitEntry& entry, std::shared_ptr<StagedRows> staged = nullptr);
  // Completes the variable's operations in flight with status (poisoned variable, broken
  // job); their transfers still under way are ignored when they finish.
  void fail_in_flight(Variable& var, px_status status, const std::string& why);
  // The job's state here is freed (its transfers cancelled, its workers gone): breaks the
  // references the variable's table keeps to itself through unfinished work (runs waiting
  // to send, requests waiting at the owner), so it is freed with the job.
  void release(Variable& var);

 private:
  using Run = SparseRun;
  std::shared_ptr<const RequestGroups> request_groups_for(SparseTable& table, SparseOp op,
                                                          uint64_t step, int64_t now_ns);
  void start(const std::shared_ptr<Run>& run);
  void prepare(const std::shared_ptr<Run>& run);
  void release_pulls(SparseTable& table);
  void prepare_rows(Run& run);
  void prepare_updates(Run& run);
  void send_next(SparseTable& table);
  // Route model (route_estimate.cc): a pull's rows measured; an estimate every
  // kRouteSampleSteps pull steps, logged when the chosen route changes.
  void sample_route(SparseTable& table, const Run& run);
  // The chosen route's name ("" when nothing was measured).
  std::string estimate_route(SparseTable& table, const RouteSample& sample);
  // PX_ROUTE_AUTO (route_move.cc): an operation that must wait (queued in held: true);
  // the estimate agreed between the nodes; the move to its choice.
  bool hold(SparseTable& table, uint64_t step, bool stepless, std::function<void()> later);
  void agree_route(const std::shared_ptr<SparseTable>& table, const RouteSample& s);
  void agreed(const std::shared_ptr<SparseTable>& table, const std::vector<double>& samples,
              uint64_t first_step, uint64_t pulls);
  void start_move(const std::shared_ptr<SparseTable>& table, const std::string& to);
  void move_when_drained(const std::shared_ptr<SparseTable>& table);
  void exchange_rows(const std::shared_ptr<SparseTable>& table,
                     std::shared_ptr<ShardFileData> mine);
  void lay_out_moved(const std::shared_ptr<SparseTable>& table,
                     std::shared_ptr<RouteMove::Rows> moved);
  void end_hold(SparseTable& table);
  // A move that cannot complete without the job breaking (a bug): the variable is poisoned
  // and its operations, held ones included, fail naming why.
  void fail_move(const std::shared_ptr<SparseTable>& table, const std::string& why);
  // A run of a moving table finished: the move may go on (from the loop, not inside finish).
  void post_move_check(std::shared_ptr<SparseTable> table) {
    offload_.post()([this, table] { move_when_drained(table); });
  }
  // The table laid out for options' route: map, owner, slices, search; the values per row
  // every node's shard holds (sparse_tables.cc). initialise false: the rows are left for
  // import_rows (a move).
  std::vector<size_t> lay_out(SparseTable& table, const SparseOptions& options,
                              std::string* why_partitions, bool initialise = true);
  // The values of a row each node holds on options' route: the row, or its column slice.
  static std::vector<size_t> row_widths(uint64_t dim, int nodes, const SparseOptions& options);
  // The new run's side of a handover: every node's part exchanged, planned alike, the rows
  // taken; then the channel starts and the operations waiting for it go.
  void take_over(const std::shared_ptr<SparseTable>& table);
  void exchange_parts(const std::shared_ptr<SparseTable>& table,
                      std::shared_ptr<const HandoverData> mine);
  void use_plan(const std::shared_ptr<SparseTable>& table, std::shared_ptr<HandoverPlan> plan);
  void start_channel(SparseTable& table);
  // px_sparse_options.replicas 2 on a table handed over: its owner keeps a copy of the
  // previous node's partitions and sends the next node its rows after each push step.
  void wire_copies(const std::shared_ptr<SparseTable>& table);
  void send(const std::shared_ptr<Run>& run);
  void sum_group(Run& run, int group);
  void request(const std::shared_ptr<Run>& run, int group);
  void scatter(const std::shared_ptr<Run>& run, int group);
  void settle(const std::shared_ptr<Run>& run);
  void finish(Run& run, px_status status, const std::string& message);
  // Column-wise alltoall (column_requests.cc): every node gets the run's rows and sends or
  // receives its columns of them.
  void send_columns(const std::shared_ptr<Run>& run);
  void request_columns(const std::shared_ptr<Run>& run, int node);
  void assemble_columns(const std::shared_ptr<Run>& run);
  // The hot-row cache (cached_requests.cc): a pull's group served from the cache where it
  // can, the rest asked for; a push's group less the rows held, plus the held sums that
  // leave with it (take_due_rows, on the loop before its groups); a push decided; the held
  // sums of every push step before `steps` sent to their owners with a marker (a read or
  // checkpoint waits for every node's).
  void request_cached_pull(const std::shared_ptr<Run>& run, int group);
  void request_cached_push(const std::shared_ptr<Run>& run, int group);
  void take_due_rows(Run& run);
  void cache_pushed(const std::shared_ptr<SparseTable>& table, uint64_t step);
  void flush_cache(const std::shared_ptr<SparseTable>& table, uint64_t steps);
  void send_flush(const std::shared_ptr<SparseTable>& table);

  Offload offload_;
  CollectiveTransport* fabric_ = nullptr;
  size_t chunk_bytes_ = 256 * 1024;
  std::string restore_dir_;
  uint64_t route_estimate_steps_ = 32;
  std::vector<std::string> route_sequence_;
  // Handover: what this node kept of each table (job, variable) at the last epoch's end. A
  // part is exported on the owner's queue; a run that asks before it is ready waits.
  bool handover_ = false;
  struct KeptPart {
    int64_t kept_ns = 0;                 // monotonic
    std::shared_ptr<HandoverData> data;  // null until exported
    std::vector<std::function<void()>> waiting;
  };
  std::map<std::pair<std::string, std::string>, std::shared_ptr<KeptPart>> kept_;
};

}  // namespace px
