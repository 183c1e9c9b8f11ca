// The sparse optimizers, applied to one row at a time (lazily: only rows that got a
// gradient this step are touched).
#pragma once

#include <cstddef>
#include <cstdint>

#include "sharding/sparse_spec.h"

namespace px {

// How many float state slots per value each optimizer keeps (Adagrad: accumulator;
// Adam: first and second moment).
size_t optimizer_state_slots(Optimizer optimizer);

// Initial value of state slot `slot`.
float optimizer_state_initial(const SparseOptions& options, size_t slot);

// Applies gradient g (dim values, already aggregated) to row w with its state (slot s of
// value c at state[s * dim + c]). step is the 1-based count of applied push steps of the
// variable (Adam's bias correction); learning_rate the push step's (px_set_sparse_lr: it
// may differ from options.learning_rate, the registered one).
void optimizer_apply_row(const SparseOptions& options, double learning_rate, float* w, float* state,
                         const float* g, size_t dim, uint64_t step);

}  // namespace px
