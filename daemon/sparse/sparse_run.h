// One of the router's sparse operations (a pull or push step, a load, a read) from its
// workers' entries until they are answered: what it asks of which node, and where the
// answers land. Shared by the router's files (sparse_router.cc, column_requests.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daemon/common/job.h"
#include "daemon/observe/step_trace.h"
#include "daemon/sparse/hot_row_cache.h"
#include "daemon/sparse/sparse_router.h"
#include "daemon/sparse/sparse_run_state.h"
#include "sharding/row_plan.h"
#include "transport/fabric/sparse_wire.h"

namespace px {

// Row work above this many values goes to the pool.
constexpr size_t kRouterInlineValues = 32 * 1024;

inline std::string op_noun(SparseOp op) {
  bool step = op == SparseOp::kPull || op == SparseOp::kPush;
  return std::string(sparse_op_name(op)) + (step ? " step" : "");
}

struct SparseRun {
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  std::shared_ptr<SparseTable> table;
  SparseOp op = SparseOp::kPull;
  uint64_t step = 0;
  uint8_t priority = 0;  // of the run's requests on the fabric (PendingStep::priority)
  int64_t start_ns = 0;
  // ps/hybrid pulls and pushes: how this run's requests group the partitions.
  std::shared_ptr<const RequestGroups> request_groups;
  struct Worker {
    std::shared_ptr<Completer> worker;
    uint64_t request_id = 0;
    const int64_t* indices = nullptr;
    size_t n = 0;
    char* rows = nullptr;  // pull/read: out; push: gradients; load: values
    px_status status = PX_OK;
    std::string message;
  };
  std::vector<Worker> workers;
  // Requests, group-major: group i's rows are row_ids()[group_begin(i) .. group_begin(i+1)),
  // from the plan (pull, read, push) or from rows and begin (load). values is left
  // uninitialised: every byte is written before it is read or sent.
  std::vector<int64_t> rows;
  std::unique_ptr<float[]> values;
  std::vector<size_t> begin;
  // pull/read/push: the workers' rows by group (partition or node); a pull scatters each
  // group's reply through it as soon as that reply is in, a push sums each group's
  // gradients just before its request is sent (the first leaves while the rest are summed).
  std::shared_ptr<const RowPlan> plan;
  std::shared_ptr<const RowPlan> last_pull_plan;          // push: reused if its indices match
  std::shared_ptr<const RequestGroups> last_pull_groups;  // ... and it grouped them alike
  std::vector<RowBatch> batches;                          // the workers whose input was accepted
  std::vector<float*> outs;                               // pull/read: by batch, where rows go
  std::vector<int> targets;                               // groups that get a request, in order
  int requests_left = 0;  // requests issued whose reply (or failure) is not in yet
  // A pull or push step through the table's hot-row cache (cached_requests.cc), and a push's
  // held sums that leave with it, by group.
  bool cached = false;
  std::vector<std::vector<HeldRow>> held_out;
  // Column-wise alltoall: node i's columns of every row of the request (row_count() x its
  // width, after the headroom its reply's status arrives in), what node i is sent or replies.
  std::unique_ptr<float[]> column_values;
  px_status status = PX_OK;
  std::string error;
  RunState state = RunState::kCreated;  // sparse_run_state.h
  int busy = 0;                         // pool tasks working on the workers' buffers
  StepTrace trace;  // metrics, timeline, stall report (observe/): its stages are its states

  // Every move goes through here; one run_transition_legal does not list is a bug (debug
  // builds abort on it, naming both states).
  void set_state(RunState to);
  bool has_sent() const { return run_has_sent(state); }
  // Sent and not finished: what is still out (replies, pool tasks) decides when it ends.
  bool outstanding() const { return state == RunState::kSent || state == RunState::kAbandoned; }

  // Appended piece by piece: GCC 12's -O3 -Wrestrict misfires on the chain of operator+.
  std::string where() const {
    std::string text = " (variable '";
    text += var->name;
    text += "', ";
    text += op_noun(op);
    if (op == SparseOp::kPull || op == SparseOp::kPush) {
      text += ' ';
      text += std::to_string(step);
    }
    text += ')';
    return text;
  }
  size_t dim() const { return table->shape.dim; }
  // The node group g's request goes to (groups are nodes without request_groups).
  int group_node(int g) const { return request_groups ? request_groups->node(g) : g; }
  // The order of rows within a group's request (partition by partition where grouped).
  RowOrder row_order() const { return request_groups ? request_groups->row_order() : RowOrder{}; }
  int groups() const { return static_cast<int>(plan ? plan->group_count() : begin.size() - 1); }
  size_t group_begin(int g) const {
    return plan ? plan->group_begin(g) : begin[static_cast<size_t>(g)];
  }
  const int64_t* row_ids() const { return plan ? plan->rows().data() : rows.data(); }
  size_t row_count() const { return plan ? plan->unique_rows() : rows.size(); }
  // Takes the plan the requests follow and room for their values (pull, read: each group's
  // rows preceded by the headroom its reply's status arrives in).
  void use_plan(std::shared_ptr<const RowPlan> p) {
    plan = std::move(p);
    values.reset(new float[plan->unique_rows() * dim() + plan->group_count() * headroom()]);
  }
  size_t headroom() const {
    return sparse_op_returns_rows(op) ? kReplyHeadroom / sizeof(float) : 0;
  }
  // Group g's values: what a push or load sends, where a pull's or read's reply lands.
  float* group_values(int g) const {
    return values.get() + group_begin(g) * dim() + static_cast<size_t>(g + 1) * headroom();
  }
  float* column_slice(int node) const {
    const std::vector<ColumnRange>& ranges = table->column_ranges;
    return column_values.get() + row_count() * ranges[static_cast<size_t>(node)].begin +
           static_cast<size_t>(node + 1) * headroom();
  }
  size_t total_rows() const {
    size_t n = 0;
    for (auto& w : workers) n += w.n;
    return n;
  }
};

}  // namespace px
