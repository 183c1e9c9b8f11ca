#include "sharding/row_plan.h"

#include <algorithm>
#include <cstring>

#include "sharding/prefetch.h"

namespace px {
namespace {

constexpr uint64_t kPositionBits = 32;

size_t batch_of(uint64_t entry) {
  return static_cast<size_t>(entry >> kPositionBits);
}
size_t position_of(uint64_t entry) {
  return static_cast<size_t>(entry & ((uint64_t{1} << kPositionBits) - 1));
}

}  // namespace

RowPlan::RowPlan(const std::vector<RowBatch>& batches, size_t dim, bool skip_nonfinite, int groups,
                 const std::function<int(int64_t row)>& group_of, RowOrder order)
    : dim_(dim) {
  size_t total = 0;
  for (const RowBatch& b : batches) total += b.n;
  std::vector<int> group_of_entry;
  std::vector<std::pair<int64_t, uint64_t>> entries;
  group_of_entry.reserve(total);
  entries.reserve(total);
  key_begin_.assign(static_cast<size_t>(groups) + 1, 0);
  indices_.reserve(batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    const RowBatch& batch = batches[b];
    indices_.emplace_back(batch.rows, batch.rows + batch.n);
    for (size_t i = 0; i < batch.n; ++i) {
      if (skip_nonfinite && find_nonfinite_row(batch.values + i * dim, 1, dim) == 0) {
        ++skipped_;
        continue;
      }
      int g = groups == 1 ? 0 : group_of(batch.rows[i]);
      entries.emplace_back(order.key(batch.rows[i]), uint64_t{b} << kPositionBits | i);
      group_of_entry.push_back(g);
      ++key_begin_[static_cast<size_t>(g) + 1];
    }
  }
  for (size_t g = 0; g < static_cast<size_t>(groups); ++g) key_begin_[g + 1] += key_begin_[g];
  keys_.resize(entries.size());
  std::vector<size_t> fill(key_begin_.begin(), key_begin_.end() - 1);
  for (size_t e = 0; e < entries.size(); ++e)
    keys_[fill[static_cast<size_t>(group_of_entry[e])]++] = entries[e];
  group_begin_.assign(static_cast<size_t>(groups) + 1, 0);
  rows_.reserve(entries.size());
  for (size_t g = 0; g < static_cast<size_t>(groups); ++g) {
    auto first = keys_.begin() + static_cast<std::ptrdiff_t>(key_begin_[g]);
    auto last = keys_.begin() + static_cast<std::ptrdiff_t>(key_begin_[g + 1]);
    std::sort(first, last);
    for (auto it = first; it != last; ++it)
      if (it == first || it->first != (it - 1)->first) rows_.push_back(order.row(it->first));
    group_begin_[g + 1] = rows_.size();
  }
}

bool RowPlan::matches(const std::vector<RowBatch>& batches) const {
  if (skipped_ > 0 || batches.size() != indices_.size()) return false;
  for (size_t b = 0; b < batches.size(); ++b) {
    if (batches[b].n != indices_[b].size()) return false;
    if (batches[b].n > 0 &&
        std::memcmp(batches[b].rows, indices_[b].data(), batches[b].n * sizeof(int64_t)) != 0)
      return false;
  }
  return true;
}

void RowPlan::sum_group(int g, const std::vector<RowBatch>& batches, float* values) const {
  size_t slot = group_begin_[static_cast<size_t>(g)];
  float* acc = nullptr;
  size_t first = key_begin_[static_cast<size_t>(g)], last = key_begin_[static_cast<size_t>(g) + 1];
  for (size_t k = first; k < last; ++k) {
    if (k + kPrefetchAhead < last) {
      uint64_t ahead = keys_[k + kPrefetchAhead].second;
      prefetch_bytes(batches[batch_of(ahead)].values + position_of(ahead) * dim_,
                     dim_ * sizeof(float));
    }
    uint64_t entry = keys_[k].second;
    const float* v = batches[batch_of(entry)].values + position_of(entry) * dim_;
    if (k == first || keys_[k].first != keys_[k - 1].first) {
      acc = values + slot * dim_;
      ++slot;
      std::memcpy(acc, v, dim_ * sizeof(float));
    } else {
      for (size_t c = 0; c < dim_; ++c) acc[c] += v[c];
    }
  }
}

void RowPlan::scatter_group(int g, const float* group_rows, float* const* outs) const {
  size_t slot = 0;
  size_t first = key_begin_[static_cast<size_t>(g)], last = key_begin_[static_cast<size_t>(g) + 1];
  for (size_t k = first; k < last; ++k) {
    if (k + kPrefetchAhead < last) {
      uint64_t ahead = keys_[k + kPrefetchAhead].second;
      prefetch_bytes_for_write(outs[batch_of(ahead)] + position_of(ahead) * dim_,
                               dim_ * sizeof(float));
    }
    if (k != first && keys_[k].first != keys_[k - 1].first) ++slot;
    uint64_t entry = keys_[k].second;
    std::memcpy(outs[batch_of(entry)] + position_of(entry) * dim_, group_rows + slot * dim_,
                dim_ * sizeof(float));
  }
}

}  // namespace px
