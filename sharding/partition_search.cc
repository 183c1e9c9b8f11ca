#include "sharding/partition_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace px {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Solves the 3 x 3 system m x = y by Gaussian elimination with partial pivoting.
bool solve3(double m[3][3], double y[3], double x[3]) {
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::fabs(m[r][col]) > std::fabs(m[pivot][col])) pivot = r;
    if (std::fabs(m[pivot][col]) < 1e-12) return false;
    std::swap(m[col], m[pivot]);
    std::swap(y[col], y[pivot]);
    for (int r = col + 1; r < 3; ++r) {
      double f = m[r][col] / m[col][col];
      for (int c = col; c < 3; ++c) m[r][c] -= f * m[col][c];
      y[r] -= f * y[col];
    }
  }
  for (int r = 2; r >= 0; --r) {
    double s = y[r];
    for (int c = r + 1; c < 3; ++c) s -= m[r][c] * x[c];
    x[r] = s / m[r][r];
  }
  return true;
}

}  // namespace

StepTimeFit fit_step_time(const std::vector<double>& partitions,
                          const std::vector<double>& seconds) {
  StepTimeFit fit;
  std::vector<double> distinct(partitions);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (distinct.size() < 3 || partitions.size() != seconds.size()) return fit;
  // Normal equations of t = b * (1/P) + a * (P - 1) + c * 1.
  double m[3][3] = {}, y[3] = {}, x[3] = {};
  for (size_t i = 0; i < partitions.size(); ++i) {
    double f[3] = {1.0 / partitions[i], partitions[i] - 1, 1.0};
    for (int r = 0; r < 3; ++r) {
      y[r] += f[r] * seconds[i];
      for (int c = 0; c < 3; ++c) m[r][c] += f[r] * f[c];
    }
  }
  if (!solve3(m, y, x)) return fit;
  fit.b = x[0];
  fit.a = x[1];
  fit.c = x[2];
  fit.usable = true;
  return fit;
}

PartitionSearch::PartitionSearch(std::vector<uint32_t> candidates, int nodes)
    : candidates_(std::move(candidates)), nodes_(std::max(1, nodes)) {
  if (candidates_.empty()) candidates_.push_back(1);
  initial_ = candidates_.front();
  for (uint32_t k : candidates_)
    if (k <= kInitialPerNode) initial_ = k;
}

uint32_t PartitionSearch::per_node_for(uint64_t step) const {
  if (decided_) return chosen_;
  if (step < kWarmupSteps) return initial_;
  uint64_t trial = (step - kWarmupSteps) / kStepsPerTrial;
  return trial < candidates_.size() ? candidates_[trial] : candidates_.back();
}

uint64_t PartitionSearch::steps_left() const {
  if (decided_) return 0;
  uint64_t started = starts_.empty() ? 0 : starts_.rbegin()->first + 1;
  return started > search_steps() ? 1 : search_steps() + 1 - started;
}

bool PartitionSearch::push_started(uint64_t step, double seconds) {
  if (decided_) return false;
  starts_[step] = seconds;
  if (step < search_steps()) return false;
  decide();
  return true;
}

void PartitionSearch::decide() {
  decided_ = true;
  std::vector<double> ps, ts;
  char line[160];
  report_ = "measured";
  double best_measured = 0;
  chosen_ = initial_;
  for (size_t t = 0; t < candidates_.size(); ++t) {
    uint64_t first = kWarmupSteps + t * kStepsPerTrial;
    std::vector<double> intervals;
    // Intervals from a push of this trial to the next push of this trial only.
    for (uint64_t s = first; s + 1 < first + kStepsPerTrial; ++s) {
      auto a = starts_.find(s), b = starts_.find(s + 1);
      if (a != starts_.end() && b != starts_.end()) intervals.push_back(b->second - a->second);
    }
    double p = static_cast<double>(candidates_[t]) * nodes_;
    if (intervals.empty()) {
      std::snprintf(line, sizeof line, " P=%g: no timed steps;", p);
      report_ += line;
      continue;
    }
    double m = median(intervals);
    ps.push_back(p);
    ts.push_back(m);
    std::snprintf(line, sizeof line, " P=%g: %.4f s;", p, m);
    report_ += line;
    if (ts.size() == 1 || m < best_measured) {
      best_measured = m;
      chosen_ = candidates_[t];
    }
  }
  StepTimeFit fit = fit_step_time(ps, ts);
  if (fit.usable && (fit.a <= 0 || fit.b <= 0)) {
    // A step cannot get cheaper with more requests per se, nor dearer with fewer: noise
    // outweighed the trend, and the measurements say more than the curve.
    std::snprintf(line, sizeof line,
                  " fit t(P) = %.4g/P + %.4g(P-1) + %.4g s has a term <= 0; least measured time at",
                  fit.b, fit.a, fit.c);
  } else if (fit.usable) {
    double best = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      double t = fit.at(ps[i]);
      if (i == 0 || t < best) {
        best = t;
        chosen_ = static_cast<uint32_t>(std::lround(ps[i] / nodes_));
      }
    }
    std::snprintf(line, sizeof line,
                  " fit t(P) = %.4g/P + %.4g(P-1) + %.4g s; least fitted time at", fit.b, fit.a,
                  fit.c);
  } else {
    std::snprintf(line, sizeof line, " too few trials for a fit; least measured time at");
  }
  report_ += line;
  std::snprintf(line, sizeof line, " P=%u (%u requests per node)", chosen_ * nodes_, chosen_);
  report_ += line;
}

}  // namespace px
