// The learning rate a sparse table's optimizer uses at each push step: the registered one,
// changed from given push steps on by px_set_sparse_lr. Every local worker asks for a change
// before pushing its step; the owners here look the rate up by the step they apply, so a
// change takes effect at the same step on every node whose workers asked for it alike
// (nodes are not compared: each node's shards apply what its own workers asked). Kept by
// the table across route moves; not in checkpoints (the job sets it again, as it restores
// its scheduler). Loop thread only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace px {

class LearningRates {
 public:
  explicit LearningRates(double registered) : first_(registered) {}

  // The rate of push step `step`.
  double at(uint64_t step) const {
    auto it = changes_.upper_bound(step);
    return it == changes_.begin() ? first_ : std::prev(it)->second.rate;
  }

  // Local worker `rank` (of `local_size`) asks for `rate` from push step `from_step` on.
  // Returns "" or why it is refused (another local worker asked for another rate from
  // that step).
  std::string ask(uint64_t from_step, double rate, int rank, int local_size) {
    Change& c = changes_[from_step];
    if (c.asked.empty()) {
      c.rate = rate;
      c.asked.assign(static_cast<size_t>(local_size), false);
    } else if (c.rate != rate) {
      bool others = false;
      for (size_t r = 0; r < c.asked.size(); ++r)
        others = others || (c.asked[r] && static_cast<int>(r) != rank);
      if (others)
        return "local worker " + std::to_string(first_asker(c)) + " set learning rate " +
               number(c.rate) + " from push step " + std::to_string(from_step) + ", not " +
               number(rate);
      c.rate = rate;  // this worker changed its mind before anyone else asked
    }
    if (static_cast<size_t>(rank) < c.asked.size()) c.asked[static_cast<size_t>(rank)] = true;
    forget_before(from_step);
    return "";
  }

  // Whether local worker `rank` may push step `step`: "" or why not (a change from that
  // step that another local worker asked for and this one did not).
  std::string check_push(uint64_t step, int rank) const {
    auto it = changes_.find(step);
    if (it == changes_.end() || asked(step, rank)) return "";
    return "local worker " + std::to_string(first_asker(it->second)) + " set learning rate " +
           number(it->second.rate) + " from push step " + std::to_string(step) +
           " and local worker " + std::to_string(rank) +
           " pushed that step without setting it (px_set_sparse_lr: every worker, alike)";
  }

  // Whether local worker `rank` asked for the change from push step `step` (false: none).
  bool asked(uint64_t step, int rank) const {
    auto it = changes_.find(step);
    return it != changes_.end() && static_cast<size_t>(rank) < it->second.asked.size() &&
           it->second.asked[static_cast<size_t>(rank)];
  }

  size_t changes() const { return changes_.size(); }

 private:
  struct Change {
    double rate = 0;
    std::vector<bool> asked;  // by local rank
  };
  // Changes this far behind the newest asked for fold into the first rate: every push step
  // before them has been applied long ago (sync and bounded tables are a few steps apart).
  static constexpr uint64_t kKeptSteps = 4096;

  void forget_before(uint64_t newest) {
    if (newest < kKeptSteps) return;
    auto end = changes_.lower_bound(newest - kKeptSteps);
    if (end == changes_.begin()) return;
    first_ = std::prev(end)->second.rate;
    changes_.erase(changes_.begin(), end);
  }
  static int first_asker(const Change& c) {
    for (size_t r = 0; r < c.asked.size(); ++r)
      if (c.asked[r]) return static_cast<int>(r);
    return -1;
  }
  static std::string number(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", v);
    return text;
  }

  double first_;
  std::map<uint64_t, Change> changes_;  // by the first push step they apply to
};

}  // namespace px
