#include "daemon/sparse/hot_row_cache.h"

#include <algorithm>
#include <cstring>

namespace px {

HotRowCache::HotRowCache(size_t dim, uint32_t capacity, uint32_t staleness, size_t row_bytes)
    : dim_(dim), capacity_(capacity), staleness_(staleness), row_bytes_(row_bytes) {}

bool HotRowCache::serves(uint64_t pull_step) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pushes_decided_ >= pull_step;
}

void HotRowCache::lookup(const int64_t* rows, size_t count, uint64_t step, float* out,
                         std::vector<size_t>* misses) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < count; ++i) {
    auto it = entries_.find(rows[i]);
    if (it != entries_.end() && serves_locked(it->second, step)) {
      std::memcpy(out + i * dim_, it->second.values.data(), dim_ * sizeof(float));
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      ++counters_.hits;
      counters_.bytes_saved += row_bytes_;
      continue;
    }
    misses->push_back(i);
    ++counters_.misses;
  }
}

void HotRowCache::fetched(const int64_t* rows, size_t count, uint64_t step, const float* values) {
  std::lock_guard<std::mutex> lock(mu_);
  forget_old_asks(step);
  for (size_t i = 0; i < count; ++i) {
    int64_t row = rows[i];
    const float* v = values + i * dim_;
    auto it = entries_.find(row);
    if (it == entries_.end()) {
      // Kept when asked for before, at most s pull steps ago.
      auto asked = asked_.find(row);
      bool again =
          asked != asked_.end() && asked->second < step && step - asked->second <= staleness_;
      if (asked != asked_.end())
        asked->second = step;
      else
        asked_.emplace(row, step);
      if (!again || capacity_ == 0) continue;
      if (entries_.size() >= capacity_) evict_one();
      lru_.push_front(row);
      it = entries_.emplace(row, Entry{}).first;
      it->second.lru = lru_.begin();
    } else {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      // A refreshed copy's held sum left in the push before (its copy did not serve this
      // pull); one still here goes with the next push rather than wait another s steps.
      if (!it->second.held.empty()) set_aside(row, it->second.held);
    }
    it->second.values.assign(v, v + dim_);
    it->second.fetched = step;
  }
}

void HotRowCache::forget_old_asks(uint64_t step) {
  if (step < asks_pruned_at_ + staleness_ + 1) return;
  asks_pruned_at_ = step;
  for (auto it = asked_.begin(); it != asked_.end();)
    it = it->second + staleness_ < step ? asked_.erase(it) : std::next(it);
}

void HotRowCache::evict_one() {
  int64_t row = lru_.back();
  lru_.pop_back();
  auto it = entries_.find(row);
  if (!it->second.held.empty()) set_aside(row, it->second.held);
  entries_.erase(it);
}

void HotRowCache::set_aside(int64_t row, std::vector<float>& held) {
  std::vector<float>& sum = evicted_[row];
  if (sum.empty()) {
    sum = std::move(held);
  } else {
    for (size_t c = 0; c < dim_; ++c) sum[c] += held[c];
  }
  held.clear();
  --holding_;
}

bool HotRowCache::hold(int64_t row, uint64_t step, float* sum, bool* added) {
  std::lock_guard<std::mutex> lock(mu_);
  *added = false;
  auto evicted = evicted_.empty() ? evicted_.end() : evicted_.find(row);
  bool was_evicted = evicted != evicted_.end();
  if (was_evicted) {  // it leaves now, whatever the copy
    *added = true;
    for (size_t c = 0; c < dim_; ++c) sum[c] += evicted->second[c];
    evicted_.erase(evicted);
    ++counters_.rows_flushed;
    counters_.bytes_saved -= std::min(counters_.bytes_saved, uint64_t{row_bytes_});
  }
  auto it = entries_.find(row);
  if (it == entries_.end()) return false;
  Entry& e = it->second;
  if (!was_evicted && serves_locked(e, step + 1)) {
    if (e.held.empty()) {
      e.held.assign(sum, sum + dim_);
      ++holding_;
      holding_rows_.push_back(row);
    } else {
      for (size_t c = 0; c < dim_; ++c) e.held[c] += sum[c];
    }
    counters_.bytes_saved += row_bytes_;
    return true;
  }
  if (!e.held.empty()) {
    *added = true;
    for (size_t c = 0; c < dim_; ++c) sum[c] += e.held[c];
    e.held.clear();
    --holding_;
    ++counters_.rows_flushed;
    counters_.bytes_saved -= std::min(counters_.bytes_saved, uint64_t{row_bytes_});
  }
  return false;
}

void HotRowCache::take_held(int64_t row, std::vector<float>& held, std::vector<HeldRow>* out) {
  HeldRow r;
  r.row = row;
  r.sum = std::move(held);
  held.clear();
  out->push_back(std::move(r));
  ++counters_.rows_flushed;
  // The row costs a send after all (it was counted as saved when held).
  counters_.bytes_saved -= std::min(counters_.bytes_saved, uint64_t{row_bytes_});
}

void HotRowCache::take_due(uint64_t step, const std::function<bool(int64_t)>& in_push,
                           std::vector<HeldRow>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = evicted_.begin(); it != evicted_.end();) {
    if (in_push(it->first)) {  // hold() adds it to the row's gradient
      ++it;
      continue;
    }
    take_held(it->first, it->second, out);
    it = evicted_.erase(it);
  }
  size_t kept = 0;
  for (int64_t row : holding_rows_) {
    auto it = entries_.find(row);
    if (it == entries_.end() || it->second.held.empty()) continue;  // left or evicted since
    Entry& e = it->second;
    if (serves_locked(e, step + 1) || in_push(row)) {
      holding_rows_[kept++] = row;
      continue;
    }
    take_held(row, e.held, out);
    --holding_;
  }
  holding_rows_.resize(kept);
}

void HotRowCache::take_all(std::vector<HeldRow>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [row, sum] : evicted_) take_held(row, sum, out);
  evicted_.clear();
  for (int64_t row : holding_rows_) {
    auto it = entries_.find(row);
    if (it != entries_.end() && !it->second.held.empty()) take_held(row, it->second.held, out);
  }
  holding_rows_.clear();
  holding_ = 0;
}

void HotRowCache::push_started() {
  std::lock_guard<std::mutex> lock(mu_);
  pushing_ = true;
}

bool HotRowCache::pushing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pushing_;
}

void HotRowCache::pushed(uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  pushes_decided_ = std::max(pushes_decided_, step + 1);
  pushing_ = false;
}

uint64_t HotRowCache::pushes_decided() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pushes_decided_;
}

uint64_t HotRowCache::flushed_through() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flushed_through_;
}

void HotRowCache::set_flushed_through(uint64_t steps) {
  std::lock_guard<std::mutex> lock(mu_);
  flushed_through_ = std::max(flushed_through_, steps);
}

uint64_t HotRowCache::flush_wanted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flush_wanted_;
}

void HotRowCache::want_flush(uint64_t steps) {
  std::lock_guard<std::mutex> lock(mu_);
  flush_wanted_ = std::max(flush_wanted_, steps);
}

uint64_t HotRowCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  // A hash node and a list node per kept row, a hash node per remembered ask.
  constexpr uint64_t kRowOverhead = 96, kAskOverhead = 32;
  uint64_t values = (entries_.size() + holding_ + evicted_.size()) * dim_ * sizeof(float);
  return values + entries_.size() * kRowOverhead + evicted_.size() * kRowOverhead +
         asked_.size() * kAskOverhead + holding_rows_.capacity() * sizeof(int64_t);
}

HotRowCounters HotRowCache::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  HotRowCounters c = counters_;
  c.rows = entries_.size();
  return c;
}

}  // namespace px
