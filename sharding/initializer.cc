#include "sharding/initializer.h"

#include <cmath>
#include <numbers>

namespace px {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in (0, 1) from (seed, element, stream).
double unit(uint64_t seed, uint64_t element, uint64_t stream) {
  uint64_t bits = splitmix64(splitmix64(seed ^ (stream * 0xd1b54a32d192ed03ull)) ^ element);
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace

void initial_row(const SparseOptions& options, uint64_t row, size_t dim, float* out) {
  initial_row_columns(options, row, dim, 0, dim, out);
}

void initial_row_columns(const SparseOptions& options, uint64_t row, size_t dim, size_t begin,
                         size_t width, float* out) {
  for (size_t c = 0; c < width; ++c) {
    uint64_t element = row * dim + begin + c;
    switch (options.initializer) {
      case Initializer::kZeros:
        out[c] = 0.0f;
        break;
      case Initializer::kUniform:
        out[c] = static_cast<float>(options.init_low + (options.init_high - options.init_low) *
                                                           unit(options.init_seed, element, 0));
        break;
      case Initializer::kNormal: {
        double u1 = unit(options.init_seed, element, 1);
        double u2 = unit(options.init_seed, element, 2);
        double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        out[c] = static_cast<float>(options.init_std * z);
        break;
      }
    }
  }
}

}  // namespace px
