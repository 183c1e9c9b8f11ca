// The column-wise alltoall route's requests. Every node holds every row's slice of columns
// (column_split.h), so a run sends each node that holds columns the same rows: a push its
// columns of the summed gradients, a load its columns of the values, a pull or read a request
// for its columns, whose replies are put back together into whole rows before they are
// scattered to the workers. A node's sums and optimizer updates are elementwise, so each
// column comes out bit for bit as on the other routes; every node receives a share of every
// row, hot rows included, in proportion to its width.
#include <cstring>

#include "daemon/sparse/sparse_router.h"
#include "daemon/sparse/sparse_run.h"

namespace px {
namespace {

// Columns `range` of rows x dim values (whole) into rows x width values (slice), or back.
void cut_columns(const float* whole, size_t rows, size_t dim, ColumnRange range, float* slice) {
  size_t width = range.width();
  for (size_t i = 0; i < rows; ++i)
    std::memcpy(slice + i * width, whole + i * dim + range.begin, width * sizeof(float));
}
void join_columns(const float* slice, size_t rows, size_t dim, ColumnRange range, float* whole) {
  size_t width = range.width();
  for (size_t i = 0; i < rows; ++i)
    std::memcpy(whole + i * dim + range.begin, slice + i * width, width * sizeof(float));
}

// The nodes that hold columns: the others first, from the next node on (their transfers
// start while this node's own part is served), this node last.
std::vector<int> column_targets(const SparseTable& table) {
  std::vector<int> targets;
  int nodes = static_cast<int>(table.column_ranges.size());
  for (int k = 1; k <= nodes; ++k) {
    int node = (table.node + k) % nodes;
    if (table.column_ranges[static_cast<size_t>(node)].width() > 0) targets.push_back(node);
  }
  return targets;
}

}  // namespace

// The run is kSending; it is kSent once every request is issued.
void SparseRouter::send_columns(const std::shared_ptr<Run>& run) {
  const SparseTable& table = *run->table;
  size_t count = run->row_count();
  // Every node that holds columns hears of every push step, empty or not (sync and bounded
  // owners count them), and with prefetch of every pull step; other operations without
  // rows ask nothing.
  bool counts_pulls = run->op == SparseOp::kPull && table.options.prefetch;
  if (count > 0 || run->op == SparseOp::kPush || counts_pulls) run->targets = column_targets(table);
  run->requests_left = static_cast<int>(run->targets.size());
  if (run->targets.empty()) {
    run->set_state(RunState::kSent);
    return settle(run);
  }
  run->column_values.reset(
      new float[count * run->dim() + table.column_ranges.size() * run->headroom()]);
  if (!sparse_op_carries_values(run->op)) {
    for (int node : run->targets) request_columns(run, node);
    run->set_state(RunState::kSent);
    return settle(run);
  }
  // Push: the workers' gradients summed (one group: every row), load: the values as given;
  // then each node's columns of them.
  auto cut = [this, run, count] {
    if (run->op == SparseOp::kPush) sum_group(*run, 0);  // rounded to the wire dtype there
    const std::vector<ColumnRange>& ranges = run->table->column_ranges;
    for (int node : run->targets)
      cut_columns(run->group_values(0), count, run->dim(), ranges[static_cast<size_t>(node)],
                  run->column_slice(node));
  };
  bool heavy = run->total_rows() * run->dim() > kRouterInlineValues;
  if (!heavy) {
    cut();
    for (int node : run->targets) request_columns(run, node);
    run->set_state(RunState::kSent);
    return settle(run);
  }
  // On the pool; runs after it in the send order wait until its requests are issued.
  ++run->busy;
  offload_.run(true, cut, [this, run] {
    --run->busy;
    for (int node : run->targets) request_columns(run, node);
    run->set_state(RunState::kSent);
    run->table->send_order.pop_front();
    send_next(*run->table);
    settle(run);
  });
}

void SparseRouter::request_columns(const std::shared_ptr<Run>& run, int node) {
  const SparseTable& table = *run->table;
  bool updates = sparse_op_carries_values(run->op);
  float* slice = run->column_slice(node);
  table.channel->request(node, kAllPartitions, 0, run->op, run->step, run->priority,
                         run->row_count(), run->row_ids(), updates ? slice : nullptr,
                         updates ? nullptr : slice, run,
                         [this, run](px_status status, const std::string& error) {
                           if (status != PX_OK && run->status == PX_OK) {
                             run->status = status;
                             run->error = error;
                           }
                           --run->requests_left;
                           if (run->requests_left == 0 && run->status == PX_OK &&
                               sparse_op_returns_rows(run->op) && run->state != RunState::kFinished)
                             return assemble_columns(run);
                           settle(run);
                         });
}

// Pull, read: every node's columns are in; whole rows go to every position that asked.
void SparseRouter::assemble_columns(const std::shared_ptr<Run>& run) {
  bool heavy = run->plan->group_entries(0) * run->dim() > kRouterInlineValues;
  ++run->busy;
  offload_.run(
      heavy,
      [run] {
        size_t count = run->row_count();
        float* whole = run->group_values(0);
        const std::vector<ColumnRange>& ranges = run->table->column_ranges;
        for (int node : run->targets)
          join_columns(run->column_slice(node), count, run->dim(),
                       ranges[static_cast<size_t>(node)], whole);
        run->plan->scatter_group(0, whole, run->outs.data());
      },
      [this, run] {
        --run->busy;
        settle(run);
      });
}

}  // namespace px
