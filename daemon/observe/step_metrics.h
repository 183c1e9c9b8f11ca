// The event counters behind the Prometheus endpoint: operations, bytes and failures by
// route and operation, step latency and wait histograms by route, worker requests failed by
// status. Plain integers, updated and read on the loop thread only (the endpoint reads them
// through a snapshot the loop builds; metrics_exposer.h), so counting costs a map lookup.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "parallax_c.h"

namespace px {

// Fixed bucket bounds in seconds, 50 us to 60 s, the same for every route (bounded series).
class LatencyHistogram {
 public:
  static const std::vector<double>& bounds();
  void observe(double seconds);
  // Per bucket (not cumulative); the last one is +Inf.
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<uint64_t> counts_ = std::vector<uint64_t>(bounds().size() + 1, 0);
  uint64_t count_ = 0;
  double sum_ = 0;
};

struct OperationCounters {
  uint64_t ok = 0;
  uint64_t failed = 0;
  uint64_t bytes = 0;
};

// Names are string literals: compared by content, kept by pointer.
struct NameLess {
  bool operator()(const char* a, const char* b) const { return std::strcmp(a, b) < 0; }
};
struct NamePairLess {
  bool operator()(const std::pair<const char*, const char*>& a,
                  const std::pair<const char*, const char*>& b) const {
    int c = std::strcmp(a.first, b.first);
    return c != 0 ? c < 0 : std::strcmp(a.second, b.second) < 0;
  }
};

// px_status values 0..16 and one slot for anything else.
constexpr size_t kStatusSlots = 18;
const char* status_label(size_t slot);  // "PX_ERR_TIMEOUT", ...; the last: "PX_STATUS_UNKNOWN"

class StepMetrics {
 public:
  // One operation of the node ended (all its local workers' requests at once).
  void operation_finished(const char* route, const char* operation, px_status status,
                          uint64_t bytes, int64_t first_ns, int64_t matched_ns, int64_t end_ns);
  // One worker request completed (with its status): errors by kind.
  void request_completed(px_status status);

  using OperationKey = std::pair<const char*, const char*>;  // route, operation
  const std::map<OperationKey, OperationCounters, NamePairLess>& operations() const {
    return operations_;
  }
  // First local submission to the end (what the slowest-waiting worker sees).
  const std::map<const char*, LatencyHistogram, NameLess>& latency() const { return latency_; }
  // First to last local submission (how far apart the local workers are).
  const std::map<const char*, LatencyHistogram, NameLess>& wait() const { return wait_; }
  const std::array<uint64_t, kStatusSlots>& requests_by_status() const { return requests_; }

 private:
  std::map<OperationKey, OperationCounters, NamePairLess> operations_;
  std::map<const char*, LatencyHistogram, NameLess> latency_;
  std::map<const char*, LatencyHistogram, NameLess> wait_;
  std::array<uint64_t, kStatusSlots> requests_{};
};

}  // namespace px
