#include "sharding/optimizer.h"

#include <cmath>

namespace px {

size_t optimizer_state_slots(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kSgd:
      return 0;
    case Optimizer::kAdagrad:
      return 1;
    case Optimizer::kAdam:
      return 2;
  }
  return 0;
}

float optimizer_state_initial(const SparseOptions& options, size_t slot) {
  if (options.optimizer == Optimizer::kAdagrad && slot == 0)
    return static_cast<float>(options.initial_accumulator);
  return 0.0f;
}

void optimizer_apply_row(const SparseOptions& options, double learning_rate, float* w, float* state,
                         const float* g, size_t dim, uint64_t step) {
  const float lr = static_cast<float>(learning_rate);
  switch (options.optimizer) {
    case Optimizer::kSgd:
      for (size_t c = 0; c < dim; ++c) w[c] -= lr * g[c];
      return;
    case Optimizer::kAdagrad: {
      const float eps = static_cast<float>(options.epsilon);
      float* acc = state;
      for (size_t c = 0; c < dim; ++c) {
        acc[c] += g[c] * g[c];
        w[c] -= lr * g[c] / (std::sqrt(acc[c]) + eps);
      }
      return;
    }
    case Optimizer::kAdam: {
      const double t = static_cast<double>(step);
      const float lr_t =
          static_cast<float>(learning_rate * std::sqrt(1.0 - std::pow(options.beta2, t)) /
                             (1.0 - std::pow(options.beta1, t)));
      // 1 - beta in double: in float, 1 - 0.999f is off by 1.3e-5 relative.
      const float b1 = static_cast<float>(options.beta1);
      const float b2 = static_cast<float>(options.beta2);
      const float one_minus_b1 = static_cast<float>(1.0 - options.beta1);
      const float one_minus_b2 = static_cast<float>(1.0 - options.beta2);
      const float eps = static_cast<float>(options.epsilon);
      float* m = state;
      float* v = state + dim;
      for (size_t c = 0; c < dim; ++c) {
        m[c] = b1 * m[c] + one_minus_b1 * g[c];
        v[c] = b2 * v[c] + one_minus_b2 * g[c] * g[c];
        w[c] -= lr_t * m[c] / (std::sqrt(v[c]) + eps);
      }
      return;
    }
  }
}

}  // namespace px
