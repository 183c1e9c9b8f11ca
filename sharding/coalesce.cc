#include "sharding/coalesce.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "sharding/prefetch.h"
#include "sharding/row_plan.h"

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
  RowPlan plan(batches, dim, skip_nonfinite, 1, nullptr);
  out->skipped = plan.skipped();
  out->rows = plan.rows();
  out->values.resize(plan.unique_rows() * dim);
  plan.sum_group(0, batches, out->values.data());
}

bool merge_sorted(const std::vector<RowBatch>& batches, size_t dim,
                  const std::function<void(int64_t row, float* sum)>& visit,
                  const std::function<void(int64_t row)>& ahead) {
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
      if (ahead && next[b] + kPrefetchAhead < batches[b].n)
        ahead(batches[b].rows[next[b] + kPrefetchAhead]);
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
