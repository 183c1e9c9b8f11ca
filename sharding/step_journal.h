// What the last few push steps of one unit of a sparse table changed (a partition on the
// ps routes): each step's rows as they were before it, values and optimizer state.
//
// A synchronous table applies a push step partition by partition, each once every node's
// push of it is in. A node lost mid-step may have sent its push to some owners and not to
// others, so at an epoch's end partitions stand at different steps (a step or two apart).
// A table handed to the job's next run (handover.h) must be one cut, every partition after
// the same push steps: the partitions ahead go back through their journals to the last
// step every partition applied. Only a few steps are kept: a unit further ahead than that
// cannot go back, and the handover falls back to the periodic checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>

#include "sharding/checkpoint.h"

namespace px {

class StepJournal {
 public:
  // dim values and slots x dim optimizer state a row; depth: the steps kept.
  StepJournal(size_t dim, size_t slots, size_t depth);

  // Starts push step `step`'s record (0-based: the unit's applied steps before it); steps
  // come in order, each once. The oldest record goes once depth are kept.
  void begin(uint64_t step);
  // Before the current step changes `row`: its values and state as they are. Once per row
  // per step (a step's rows are unique).
  void save(int64_t row, const float* values, const float* state);

  // Forgets every step (the rows changed outside one: a load).
  void clear() { records_.clear(); }

  // Whether a unit that applied `applied` push steps can go back to having applied `to`:
  // the records of steps to .. applied-1 are all kept.
  bool can_roll_back(uint64_t applied, uint64_t to) const;
  // The pre-images that take a unit from `applied` push steps back to `to` (can_roll_back
  // must hold): newest step first, so a row several steps changed ends at its oldest.
  void roll_back(
      uint64_t applied, uint64_t to,
      const std::function<void(int64_t row, const float* values, const float* state)>& put) const;

  // A record is a shard's rows (checkpoint.h), the step it was taken before in `step`.
  struct Record {
    uint64_t step = 0;
    ShardFileData rows;
  };
  const std::deque<Record>& records() const { return records_; }
  // Takes records as they were encoded (a unit handed over: handover.h); oldest first,
  // consecutive steps, each with this journal's dim and slots.
  bool adopt(std::deque<Record> records);

 private:
  size_t dim_, slots_, depth_;
  std::deque<Record> records_;  // oldest first
};

}  // namespace px
