// A table's steps through this node's hot-row cache (hot_row_cache.h): which rows of a pull
// are asked of their owners and which are served here, which gradients of a push are held
// and which held sums leave with it, and the flushes a read or checkpoint waits for.
#include <algorithm>
#include <cstring>

#include "daemon/common/log.h"
#include "daemon/sparse/sparse_router.h"
#include "daemon/sparse/sparse_run.h"
#include "sharding/wire_values.h"

namespace px {
namespace {

// What a step's group sends instead of the plan's rows, kept alive until its reply.
struct CachedPart {
  std::shared_ptr<SparseRun> run;
  std::vector<size_t> misses;  // pull: positions in the group that were asked for
  std::vector<int64_t> rows;
  std::vector<float> values;  // push: the gradients; pull: the reply, after its headroom
};

}  // namespace

void SparseRouter::request_cached_pull(const std::shared_ptr<Run>& run, int group) {
  SparseTable& table = *run->table;
  size_t dim = run->dim();
  size_t at = run->group_begin(group);
  size_t count = run->group_begin(group + 1) - at;
  const int64_t* rows = run->row_ids() + at;
  float* values = run->group_values(group);
  auto part = std::make_shared<CachedPart>();
  part->run = run;
  table.cache->lookup(rows, count, run->step, values, &part->misses);
  run->trace.cache_rows += static_cast<int64_t>(count - part->misses.size());
  if (part->misses.empty()) {  // every row served here
    --run->requests_left;
    return scatter(run, group);
  }
  // Every row missed: the reply lands in place, as without a cache. Else only the misses
  // are asked for, into a buffer of their own, and spread into place when in.
  bool whole = part->misses.size() == count;
  const int64_t* ask = rows;
  float* out = values;
  size_t n = count;
  if (!whole) {
    n = part->misses.size();
    part->rows.reserve(n);
    for (size_t i : part->misses) part->rows.push_back(rows[i]);
    size_t headroom = run->headroom();
    part->values.resize(headroom + n * dim);
    ask = part->rows.data();
    out = part->values.data() + headroom;
  }
  int node = run->group_node(group);
  const RequestGroups* groups = run->request_groups.get();
  uint32_t partition = groups ? groups->index(group) : kAllPartitions;
  uint32_t of = groups ? groups->groups_on(node) : 0;
  table.channel->request(
      node, partition, of, SparseOp::kPull, run->step, run->priority, n, ask, nullptr, out, part,
      [this, part, group, whole, ask, out, n, dim](px_status status, const std::string& error) {
        const std::shared_ptr<Run>& run = part->run;
        if (status != PX_OK && run->status == PX_OK) {
          run->status = status;
          run->error = error;
        }
        --run->requests_left;
        if (status != PX_OK || run->state == RunState::kFinished) return settle(run);
        // The copies refreshed, the asked rows put in place and every row scattered to the
        // workers, on the pool when heavy (the cache locks), as scatter() does.
        bool heavy = run->plan->group_entries(group) * dim > kRouterInlineValues;
        ++run->busy;
        offload_.run(
            heavy,
            [part, group, whole, ask, out, n, dim] {
              const std::shared_ptr<Run>& r = part->run;
              r->table->cache->fetched(ask, n, r->step, out);
              float* values = r->group_values(group);
              if (!whole)
                for (size_t j = 0; j < n; ++j)
                  std::memcpy(values + part->misses[j] * dim, out + j * dim, dim * sizeof(float));
              r->plan->scatter_group(group, values, r->outs.data());
            },
            [this, part] {
              --part->run->busy;
              settle(part->run);
            });
      });
}

// On the loop, before the push's groups are summed (maybe on the pool): the held sums due in
// this push for rows it has no gradient for, by group.
void SparseRouter::take_due_rows(Run& run) {
  const SparseTable& table = *run.table;
  RowOrder order = run.row_order();
  auto in_push = [&](int64_t row) {
    int g = run.request_groups ? run.request_groups->group_of_row(static_cast<uint64_t>(row))
                               : table.map.owner(static_cast<uint64_t>(row));
    const int64_t* begin = run.row_ids() + run.group_begin(g);
    const int64_t* end = run.row_ids() + run.group_begin(g + 1);
    int64_t key = order.key(row);
    const int64_t* it =
        std::lower_bound(begin, end, key, [&](int64_t r, int64_t k) { return order.key(r) < k; });
    return it != end && *it == row;
  };
  std::vector<HeldRow> due;
  table.cache->take_due(run.step, in_push, &due);
  run.held_out.assign(static_cast<size_t>(run.groups()), {});
  for (HeldRow& h : due) {
    int g = run.request_groups ? run.request_groups->group_of_row(static_cast<uint64_t>(h.row))
                               : table.map.owner(static_cast<uint64_t>(h.row));
    run.held_out[static_cast<size_t>(g)].push_back(std::move(h));
  }
}

// The group's rows the cache does not hold, merged in row order with the held sums that
// leave now. On the loop or the pool (the cache locks; nothing else shared is touched).
void SparseRouter::request_cached_push(const std::shared_ptr<Run>& run, int group) {
  const SparseTable& table = *run->table;
  size_t dim = run->dim();
  size_t at = run->group_begin(group);
  size_t count = run->group_begin(group + 1) - at;
  const int64_t* rows = run->row_ids() + at;
  float* sums = run->group_values(group);
  std::vector<HeldRow> none;
  std::vector<HeldRow>& extra = static_cast<size_t>(group) < run->held_out.size()
                                    ? run->held_out[static_cast<size_t>(group)]
                                    : none;
  auto part = std::make_shared<CachedPart>();
  part->run = run;
  part->rows.reserve(count + extra.size());
  WireDtype wire = table.options.wire;
  const float* values = sums;
  int64_t held = 0;  // (this run's groups are summed one at a time: no race on the trace)
  // Whether row i leaves now (else the cache holds its gradient). A held sum added to it was
  // summed in f32: a 16-bit wire's values go rounded (packing is exact).
  auto leaves = [&](size_t i) {
    float* sum = sums + i * dim;
    bool added = false;
    if (table.cache->hold(rows[i], run->step, sum, &added)) {
      ++held;
      return false;
    }
    if (added && wire != WireDtype::kF32) round_to_wire(wire, sum, dim);
    return true;
  };
  if (extra.empty()) {
    // The usual case: the rows that leave are compacted in place, in their order.
    size_t kept = 0;
    for (size_t i = 0; i < count; ++i) {
      if (!leaves(i)) continue;
      if (kept != i) std::memmove(sums + kept * dim, sums + i * dim, dim * sizeof(float));
      part->rows.push_back(rows[i]);
      ++kept;
    }
  } else {
    // Held sums of rows this push has no gradient for: merged in row order (the owner
    // takes a group's rows partition by partition).
    RowOrder order = run->row_order();
    std::sort(extra.begin(), extra.end(), [&](const HeldRow& a, const HeldRow& b) {
      return order.key(a.row) < order.key(b.row);
    });
    part->values.reserve((count + extra.size()) * dim);
    size_t next_extra = 0;
    auto add = [&](int64_t row, const float* v) {
      part->rows.push_back(row);
      part->values.insert(part->values.end(), v, v + dim);
    };
    auto add_extras_before = [&](int64_t key) {
      for (; next_extra < extra.size() && order.key(extra[next_extra].row) < key; ++next_extra) {
        HeldRow& h = extra[next_extra];
        if (wire != WireDtype::kF32) round_to_wire(wire, h.sum.data(), dim);
        add(h.row, h.sum.data());
      }
    };
    for (size_t i = 0; i < count; ++i) {
      if (!leaves(i)) continue;
      add_extras_before(order.key(rows[i]));
      add(rows[i], sums + i * dim);
    }
    add_extras_before(INT64_MAX);
    values = part->values.data();
  }
  run->trace.cache_rows += held;
  int node = run->group_node(group);
  const RequestGroups* groups = run->request_groups.get();
  uint32_t partition = groups ? groups->index(group) : kAllPartitions;
  uint32_t of = groups ? groups->groups_on(node) : 0;
  table.channel->request(node, partition, of, SparseOp::kPush, run->step, run->priority,
                         part->rows.size(), part->rows.data(), values, nullptr, part,
                         [this, part](px_status status, const std::string& error) {
                           const std::shared_ptr<Run>& run = part->run;
                           if (status != PX_OK && run->status == PX_OK) {
                             run->status = status;
                             run->error = error;
                           }
                           --run->requests_left;
                           settle(run);
                         });
}

void SparseRouter::cache_pushed(const std::shared_ptr<SparseTable>& table, uint64_t step) {
  table->cache->pushed(step);
  HotRowCache& cache = *table->cache;
  if (cache.flush_wanted() > cache.flushed_through() &&
      cache.pushes_decided() >= cache.flush_wanted())
    send_flush(table);
}

// A read or checkpoint reached this node's owner: its held sums of the push steps before
// `steps` go once those steps are decided here.
void SparseRouter::flush_cache(const std::shared_ptr<SparseTable>& table, uint64_t steps) {
  HotRowCache& cache = *table->cache;
  if (cache.flushed_through() >= steps) return;  // a marker covering them is on its way
  cache.want_flush(steps);
  // A push being summed on the pool holds sums it took out; its requests must go first
  // (cache_pushed flushes then).
  if (cache.pushes_decided() >= steps && !cache.pushing()) send_flush(table);
}

// Every held sum, to its owner, and a marker to every node (an empty flush where it holds
// none): after every push this node decided, in each owner's ordered stream.
void SparseRouter::send_flush(const std::shared_ptr<SparseTable>& table) {
  if (!table->channel->started()) return;  // no step was sent: nothing held
  HotRowCache& cache = *table->cache;
  uint64_t through = cache.pushes_decided();
  std::vector<HeldRow> held;
  cache.take_all(&held);
  cache.set_flushed_through(through);
  int nodes = table->map.nodes();
  struct Flush {
    std::vector<int64_t> rows;
    std::vector<float> values;
  };
  std::vector<std::shared_ptr<Flush>> to(static_cast<size_t>(nodes));
  for (auto& f : to) f = std::make_shared<Flush>();
  std::sort(held.begin(), held.end(),
            [](const HeldRow& a, const HeldRow& b) { return a.row < b.row; });
  for (HeldRow& h : held) {
    Flush& f = *to[static_cast<size_t>(table->map.owner(static_cast<uint64_t>(h.row)))];
    // Rounded as a push would send it: a row's applied value must not depend on whether a
    // read came before its push (a flush itself travels in f32).
    if (table->options.wire != WireDtype::kF32)
      round_to_wire(table->options.wire, h.sum.data(), h.sum.size());
    f.rows.push_back(h.row);
    f.values.insert(f.values.end(), h.sum.begin(), h.sum.end());
  }
  for (int node = 0; node < nodes; ++node) {
    std::shared_ptr<Flush> f = to[static_cast<size_t>(node)];
    table->channel->request(
        node, kAllPartitions, 0, SparseOp::kFlush, through, 0, f->rows.size(), f->rows.data(),
        f->values.data(), nullptr, f, [table, node](px_status status, const std::string& error) {
          if (status != PX_OK)
            PX_LOG_ERROR_AT(table->log_fields, "%s: flushing held gradients to node %d: %s",
                            table->label.c_str(), node, error.c_str());
        });
  }
}

}  // namespace px
