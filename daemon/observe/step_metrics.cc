#include "daemon/observe/step_metrics.h"

#include <algorithm>

namespace px {

const std::vector<double>& LatencyHistogram::bounds() {
  static const std::vector<double> kBounds = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,     0.25,   0.5,     1,      2.5,   5,      10,    30,   60};
  return kBounds;
}

void LatencyHistogram::observe(double seconds) {
  const std::vector<double>& b = bounds();
  size_t bucket = static_cast<size_t>(std::lower_bound(b.begin(), b.end(), seconds) - b.begin());
  ++counts_[bucket];
  ++count_;
  sum_ += seconds;
}

const char* status_label(size_t slot) {
  static const char* const kNames[kStatusSlots] = {"PX_OK",
                                                   "PX_ERR_INVALID",
                                                   "PX_ERR_VERSION",
                                                   "PX_ERR_CONNECT",
                                                   "PX_ERR_TIMEOUT",
                                                   "PX_ERR_PEER_LOST",
                                                   "PX_ERR_MISMATCH",
                                                   "PX_ERR_NOT_FOUND",
                                                   "PX_ERR_NO_MEMORY",
                                                   "PX_ERR_BUSY",
                                                   "PX_ERR_PROTOCOL",
                                                   "PX_ERR_INDEX",
                                                   "PX_ERR_NOT_IMPLEMENTED",
                                                   "PX_ERR_INTERNAL",
                                                   "PX_ERR_PERMISSION",
                                                   "PX_ERR_CANCELLED",
                                                   "PX_ERR_MEMBERSHIP",
                                                   "PX_STATUS_UNKNOWN"};
  return kNames[std::min(slot, kStatusSlots - 1)];
}

void StepMetrics::operation_finished(const char* route, const char* operation, px_status status,
                                     uint64_t bytes, int64_t first_ns, int64_t matched_ns,
                                     int64_t end_ns) {
  OperationCounters& c = operations_[{route, operation}];
  if (status == PX_OK) {
    ++c.ok;
    c.bytes += bytes;
  } else {
    ++c.failed;
  }
  latency_[route].observe(static_cast<double>(std::max<int64_t>(0, end_ns - first_ns)) * 1e-9);
  wait_[route].observe(static_cast<double>(std::max<int64_t>(0, matched_ns - first_ns)) * 1e-9);
}

void StepMetrics::request_completed(px_status status) {
  size_t slot = static_cast<uint32_t>(status) < kStatusSlots - 1 ? static_cast<size_t>(status)
                                                                 : kStatusSlots - 1;
  ++requests_[slot];
}

}  // namespace px
