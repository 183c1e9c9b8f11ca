#include "coalesce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace px {
namespace {

// NaN and Inf are the floats whose exponent bits are all ones; or-ing the test over the
// row vectorises, unlike a branch per value.
bool row_finite(const float* v, size_t dim) {
  uint32_t special = 0;
  for (size_t c = 0; c < dim; ++c) {
    uint32_t bits;
    std::memcpy(&bits, v + c, sizeof bits);
    special |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return special == 0;
}

}  // namespace

GroupedCoalescer::GroupedCoalescer(const std::vector<RowBatch>& batches, size_t dim,
                                   bool skip_nonfinite, int groups,
                                   const std::function<int(int64_t row)>& group_of)
    : dim_(dim) {
  size_t total = 0;
  for (const RowBatch& b : batches) total += b.n;
  // Entries are numbered batch-major, so sorting (row, entry) gives the summation order.
  std::vector<int> group;
  source_.reserve(total);
  group.reserve(total);
  std::vector<int64_t> row_of;
  row_of.reserve(total);
  key_begin_.assign(static_cast<size_t>(groups) + 1, 0);
  for (const RowBatch& b : batches) {
    for (size_t i = 0; i < b.n; ++i) {
      const float* v = b.values + i * dim;
      if (skip_nonfinite && !row_finite(v, dim)) {
        ++skipped_;
        continue;
      }
      int g = groups == 1 ? 0 : group_of(b.rows[i]);
      source_.push_back(v);
      group.push_back(g);
      row_of.push_back(b.rows[i]);
      ++key_begin_[static_cast<size_t>(g) + 1];
    }
  }
  for (size_t g = 0; g < static_cast<size_t>(groups); ++g) key_begin_[g + 1] += key_begin_[g];
  keys_.resize(source_.size());
  std::vector<size_t> fill(key_begin_.begin(), key_begin_.end() - 1);
  for (size_t e = 0; e < source_.size(); ++e)
    keys_[fill[static_cast<size_t>(group[e])]++] = {row_of[e], e};
  group_begin_.assign(static_cast<size_t>(groups) + 1, 0);
  for (size_t g = 0; g < static_cast<size_t>(groups); ++g) {
    auto first = keys_.begin() + static_cast<std::ptrdiff_t>(key_begin_[g]);
    auto last = keys_.begin() + static_cast<std::ptrdiff_t>(key_begin_[g + 1]);
    std::sort(first, last);
    size_t unique = 0;
    for (auto it = first; it != last; ++it)
      if (it == first || it->first != (it - 1)->first) ++unique;
    group_begin_[g + 1] = group_begin_[g] + unique;
  }
}

void GroupedCoalescer::sum_group(int g, int64_t* rows, float* values) const {
  size_t at = group_begin_[static_cast<size_t>(g)];
  float* acc = nullptr;
  size_t first = key_begin_[static_cast<size_t>(g)], last = key_begin_[static_cast<size_t>(g) + 1];
  for (size_t k = first; k < last; ++k) {
    const float* v = source_[keys_[k].second];
    if (k == first || keys_[k].first != keys_[k - 1].first) {
      rows[at] = keys_[k].first;
      acc = values + at * dim_;
      ++at;
      std::memcpy(acc, v, dim_ * sizeof(float));
    } else {
      for (size_t c = 0; c < dim_; ++c) acc[c] += v[c];
    }
  }
}

void coalesce(const std::vector<RowBatch>& batches, size_t dim, bool skip_nonfinite,
              CoalescedRows* out) {
  GroupedCoalescer grouped(batches, dim, skip_nonfinite, 1, nullptr);
  out->skipped = grouped.skipped();
  out->rows.resize(grouped.unique_rows());
  out->values.resize(grouped.unique_rows() * dim);
  grouped.sum_group(0, out->rows.data(), out->values.data());
}

bool merge_sorted(const std::vector<RowBatch>& batches, size_t dim,
                  const std::function<void(int64_t row, float* sum)>& visit) {
  for (const RowBatch& b : batches)
    for (size_t i = 1; i < b.n; ++i)
      if (b.rows[i] <= b.rows[i - 1]) return false;
  std::vector<size_t> next(batches.size(), 0);
  std::vector<float> sum(dim);
  for (;;) {
    bool any = false;
    int64_t row = 0;
    for (size_t b = 0; b < batches.size(); ++b) {
      if (next[b] == batches[b].n) continue;
      int64_t r = batches[b].rows[next[b]];
      if (!any || r < row) row = r;
      any = true;
    }
    if (!any) return true;
    bool first = true;
    for (size_t b = 0; b < batches.size(); ++b) {
      if (next[b] == batches[b].n || batches[b].rows[next[b]] != row) continue;
      const float* v = batches[b].values + next[b] * dim;
      if (first) {
        std::memcpy(sum.data(), v, dim * sizeof(float));
        first = false;
      } else {
        for (size_t c = 0; c < dim; ++c) sum[c] += v[c];
      }
      ++next[b];
    }
    visit(row, sum.data());
  }
}

std::vector<int64_t> unique_rows(const std::vector<RowBatch>& batches) {
  std::vector<int64_t> rows;
  size_t total = 0;
  for (const RowBatch& b : batches) total += b.n;
  rows.reserve(total);
  for (const RowBatch& b : batches) rows.insert(rows.end(), b.rows, b.rows + b.n);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

int64_t find_bad_index(const int64_t* rows, size_t n, uint64_t limit) {
  for (size_t i = 0; i < n; ++i)
    if (rows[i] < 0 || static_cast<uint64_t>(rows[i]) >= limit) return static_cast<int64_t>(i);
  return -1;
}

int64_t find_nonfinite_row(const float* values, size_t n, size_t dim) {
  for (size_t i = 0; i < n; ++i)
    if (!row_finite(values + i * dim, dim)) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace px
