// A node's cache of one PX_BOUNDED sparse table's hot rows owned by other nodes
// (px_sparse_options.cache_rows, cache_staleness = s). The rule, in pull and push steps of
// this node (every local worker issues each step, so they are the node's):
//   * a copy fetched by pull step c serves pull steps c..c+s instead of the owner;
//   * a row asked of its owner in two pull steps at most s apart is kept (a row seen once,
//     the long tail of a Zipf batch, never is); when full, the least recently pulled goes;
//   * this node's push step k sums a kept row's gradient into its held sum, here, while the
//     copy serves pull step k+1; else the row leaves in push k with its held sum added. So
//     a held sum leaves at the latest in push c+s, before the pull that refreshes the copy,
//     and every gradient is sent exactly once, at most s push steps late;
//   * an evicted row's held sum leaves with the next push step; a read or checkpoint of
//     the table takes every held sum (flush, sparse_wire.h) once the push steps it waits
//     for are decided.
// Thread-safe: the pool sums a heavy push's groups while the loop may serve a pull.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace px {

// A held gradient sum on its way out: its row and dim values.
struct HeldRow {
  int64_t row = 0;
  std::vector<float> sum;
};

struct HotRowCounters {
  uint64_t hits = 0, misses = 0, rows = 0, bytes_saved = 0, rows_flushed = 0;
};

class HotRowCache {
 public:
  // row_bytes: what one row costs on the wire (its index and its values), for bytes_saved.
  HotRowCache(size_t dim, uint32_t capacity, uint32_t staleness, size_t row_bytes);

  uint32_t staleness() const { return staleness_; }
  // Whether pull `step` may use the cache: every earlier push step of this node is decided
  // (pushed()), so no held sum it must wait for is still undecided. A worker that pulls
  // ahead of its pushes gets its rows from the owners (counted as neither hit nor miss).
  bool serves(uint64_t pull_step) const;

  // Pull `step`: rows[0..count) owned elsewhere. A row with a copy that serves this step is
  // copied to out + i * dim; the others' positions are appended to misses.
  void lookup(const int64_t* rows, size_t count, uint64_t step, float* out,
              std::vector<size_t>* misses);
  // The owner's rows for pull `step` (values as received): refreshes kept copies, keeps
  // rows asked for twice within s steps.
  void fetched(const int64_t* rows, size_t count, uint64_t step, const float* values);

  // Push `step`: a row this node sends with `sum` (its gradients, dim values). True: held
  // here (added to its held sum; the row is left out of the push). False: it leaves now,
  // with any held sum added into `sum` (*added says whether one was).
  bool hold(int64_t row, uint64_t step, float* sum, bool* added);
  // Push `step`, before its rows: the held sums that must leave with it although the push
  // has no gradient for their row (in_push says which rows it has): copies that will not
  // serve pull step+1, and evicted rows.
  void take_due(uint64_t step, const std::function<bool(int64_t)>& in_push,
                std::vector<HeldRow>* out);
  // Every held sum (a flush).
  void take_all(std::vector<HeldRow>* out);
  // A push step started taking held sums out (take_due, hold): a flush until it is decided
  // would send its marker ahead of that push's requests, without the sums they carry.
  void push_started();
  bool pushing() const;
  // Push `step` is decided: its rows held or sent.
  void pushed(uint64_t step);
  uint64_t pushes_decided() const;

  // Flushes: the push steps every held sum before them has been sent for (flush marker),
  // and the most a read or checkpoint asked for (waits for pushes_decided()).
  uint64_t flushed_through() const;
  void set_flushed_through(uint64_t steps);
  uint64_t flush_wanted() const;
  void want_flush(uint64_t steps);

  HotRowCounters counters() const;
  // What it holds: copies, held sums and its maps (their nodes estimated), in bytes.
  uint64_t bytes() const;

 private:
  struct Entry {
    std::vector<float> values;
    uint64_t fetched = 0;     // the pull step that fetched the copy
    std::vector<float> held;  // empty: nothing held
    std::list<int64_t>::iterator lru;
  };
  bool serves_locked(const Entry& e, uint64_t pull_step) const {
    return pull_step >= e.fetched && pull_step - e.fetched <= staleness_;
  }
  void take_held(int64_t row, std::vector<float>& held, std::vector<HeldRow>* out);
  void evict_one();
  // A kept row's held sum leaves with the next push step instead (evicted_).
  void set_aside(int64_t row, std::vector<float>& held);
  void forget_old_asks(uint64_t step);

  size_t dim_;
  uint32_t capacity_;
  uint32_t staleness_;
  size_t row_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, Entry> entries_;
  std::list<int64_t> lru_;  // front: most recently pulled
  // Rows whose last ask is recent: the pull step of it (a second ask within s steps keeps
  // the row). Old ones are forgotten every s + 1 steps.
  std::unordered_map<int64_t, uint64_t> asked_;
  uint64_t asks_pruned_at_ = 0;
  std::unordered_map<int64_t, std::vector<float>> evicted_;  // held sums of evicted rows
  uint64_t holding_ = 0;                                     // entries with a held sum
  // Rows whose entry may hold a sum (those that no longer do are dropped as found), so a
  // push looks at them, not at every kept row.
  std::vector<int64_t> holding_rows_;
  uint64_t pushes_decided_ = 0;
  bool pushing_ = false;
  uint64_t flushed_through_ = 0;
  uint64_t flush_wanted_ = 0;
  HotRowCounters counters_;
};

}  // namespace px
