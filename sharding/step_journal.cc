#include "sharding/step_journal.h"

namespace px {

StepJournal::StepJournal(size_t dim, size_t slots, size_t depth)
    : dim_(dim), slots_(slots), depth_(depth) {}

void StepJournal::begin(uint64_t step) {
  if (depth_ == 0) return;
  // A step that does not follow the last one (a restore, a load between runs) starts over:
  // the records before it no longer lead to the unit's present rows.
  if (!records_.empty() && records_.back().step + 1 != step) records_.clear();
  // The oldest record's arrays are reused for the new one: a table's steps change rows of
  // about the same number, so after the first few steps nothing is allocated.
  Record next;
  if (records_.size() == depth_) {
    next = std::move(records_.front());
    records_.pop_front();
  }
  next.step = step;
  next.rows.dim = dim_;
  next.rows.slots = static_cast<uint32_t>(slots_);
  next.rows.rows.clear();
  next.rows.values.clear();
  next.rows.state.clear();
  records_.push_back(std::move(next));
}

void StepJournal::save(int64_t row, const float* values, const float* state) {
  if (records_.empty()) return;
  ShardFileData& r = records_.back().rows;
  r.rows.push_back(row);
  r.values.insert(r.values.end(), values, values + dim_);
  r.state.insert(r.state.end(), state, state + slots_ * dim_);
}

bool StepJournal::can_roll_back(uint64_t applied, uint64_t to) const {
  if (to > applied) return false;
  if (to == applied) return true;
  // Records are consecutive steps, the newest the last applied.
  if (records_.empty() || records_.back().step + 1 != applied) return false;
  return records_.front().step <= to;
}

void StepJournal::roll_back(
    uint64_t applied, uint64_t to,
    const std::function<void(int64_t, const float*, const float*)>& put) const {
  if (!can_roll_back(applied, to)) return;
  for (auto it = records_.rbegin(); it != records_.rend() && it->step >= to; ++it) {
    const ShardFileData& r = it->rows;
    for (size_t i = 0; i < r.rows.size(); ++i)
      put(r.rows[i], r.values.data() + i * dim_, r.state.data() + i * slots_ * dim_);
  }
}

bool StepJournal::adopt(std::deque<Record> records) {
  for (size_t i = 0; i < records.size(); ++i) {
    const ShardFileData& r = records[i].rows;
    if (r.dim != dim_ || r.slots != slots_ || r.values.size() != r.rows.size() * dim_ ||
        r.state.size() != r.rows.size() * slots_ * dim_)
      return false;
    if (i > 0 && records[i - 1].step + 1 != records[i].step) return false;
  }
  records_ = std::move(records);
  while (records_.size() > depth_) records_.pop_front();
  return true;
}

}  // namespace px
