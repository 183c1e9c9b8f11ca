// The automatic partition count of a ps/hybrid table, chosen from timed steps as Parallax
// does. A table is stored in automatic_partitions() partitions; what the count changes
// in a step is how many requests carry a node's rows (request_groups.h): more requests let
// each partition's replies leave while other partitions' pushes are still arriving (b/P),
// each one costs messages and queue hops (a(P - 1)). After kWarmupSteps push steps, each
// candidate K (requests per node) runs kStepsPerTrial push steps; the step times (push
// start to the next push start, median per trial) are fitted to t(P) = b/P + a(P - 1) + c
// with P = K x nodes, and the candidate with the least fitted time is kept from then on (the
// least measured one when noise gives the fit a b or a <= 0).
//
// Each node decides for its own requests: owners accept any grouping, so nodes need not
// agree (they time the same lock-stepped steps and normally do).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace px {

struct StepTimeFit {
  double b = 0, a = 0, c = 0;
  bool usable = false;  // least squares had a unique solution
  double at(double partitions) const { return b / partitions + a * (partitions - 1) + c; }
};
// Least-squares fit of t(P) = b/P + a(P - 1) + c; needs three distinct P.
StepTimeFit fit_step_time(const std::vector<double>& partitions,
                          const std::vector<double>& seconds);

class PartitionSearch {
 public:
  static constexpr uint32_t kInitialPerNode = 4;
  static constexpr uint64_t kWarmupSteps = 2;
  static constexpr uint64_t kStepsPerTrial = 5;

  // candidates: requests per node to try, ascending; nodes: to report P = K x nodes.
  PartitionSearch(std::vector<uint32_t> candidates, int nodes);

  // Requests per node for the pull or push of step `step`.
  uint32_t per_node_for(uint64_t step) const;
  // Push step `step` started at `seconds` (any monotonic clock). True when this call made the
  // choice (report() then says what was measured, fitted and chosen).
  bool push_started(uint64_t step, double seconds);
  bool decided() const { return decided_; }
  uint32_t chosen() const { return chosen_; }
  // Push steps the search takes; steps after it use the choice.
  uint64_t search_steps() const { return kWarmupSteps + candidates_.size() * kStepsPerTrial; }
  // Push steps to start before the choice is made (0 once made).
  uint64_t steps_left() const;
  const std::string& report() const { return report_; }

 private:
  void decide();

  std::vector<uint32_t> candidates_;
  int nodes_;
  uint32_t initial_;
  std::map<uint64_t, double> starts_;  // push step -> start
  bool decided_ = false;
  uint32_t chosen_ = 0;
  std::string report_;
};

}  // namespace px
