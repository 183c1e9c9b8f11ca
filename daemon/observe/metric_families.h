// The Prometheus families parallaxd exposes, made from the daemon's state and its event
// counters (README: Observability lists them). A pure function: the loop builds them when
// the endpoint is scraped, the unit test checks them.
#pragma once

#include <prometheus/metric_family.h>

#include <cstddef>
#include <vector>

#include "daemon/observe/daemon_state.h"
#include "daemon/observe/step_metrics.h"

namespace px {

// max_variables: the per-variable series are kept for the first max_variables variables
// (jobs by name, then variables by id); the others are counted in
// parallax_variables_unlabeled, so one job with many variables cannot flood the endpoint.
std::vector<prometheus::MetricFamily> build_metric_families(const DaemonState& state,
                                                            const StepMetrics& metrics,
                                                            size_t max_variables);

}  // namespace px
