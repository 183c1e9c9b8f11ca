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

void coalesce(const std::vector<RowBatch>& batches, size_t dim, bool skip_nonfinite,
              CoalescedRows* out) {
  // (row, source) pairs; source = batch-major position, so sorting the pairs gives the
  // deterministic summation order.
  struct Entry {
    int64_t row;
    const float* values;
  };
  size_t total = 0;
  for (const RowBatch& b : batches) total += b.n;
  std::vector<std::pair<int64_t, size_t>> keys;
  std::vector<Entry> entries;
  keys.reserve(total);
  entries.reserve(total);
  out->skipped = 0;
  for (const RowBatch& b : batches) {
    for (size_t i = 0; i < b.n; ++i) {
      const float* v = b.values + i * dim;
      if (skip_nonfinite && !row_finite(v, dim)) {
        ++out->skipped;
        continue;
      }
      keys.emplace_back(b.rows[i], entries.size());
      entries.push_back({b.rows[i], v});
    }
  }
  std::sort(keys.begin(), keys.end());
  out->rows.clear();
  out->values.clear();
  size_t unique = 0;
  for (size_t i = 0; i < keys.size(); ++i)
    if (i == 0 || keys[i].first != keys[i - 1].first) ++unique;
  out->rows.reserve(unique);
  out->values.resize(unique * dim);
  float* acc = nullptr;
  for (size_t i = 0; i < keys.size(); ++i) {
    const float* v = entries[keys[i].second].values;
    if (i == 0 || keys[i].first != keys[i - 1].first) {
      out->rows.push_back(keys[i].first);
      acc = out->values.data() + (out->rows.size() - 1) * dim;
      std::memcpy(acc, v, dim * sizeof(float));
    } else {
      for (size_t c = 0; c < dim; ++c) acc[c] += v[c];
    }
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
