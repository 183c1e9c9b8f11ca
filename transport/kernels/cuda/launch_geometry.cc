#include "transport/kernels/cuda/launch_geometry.h"

#include <algorithm>

namespace px::gpu {

LaunchGeometry elementwise_geometry(size_t n, unsigned max_blocks) {
  if (n == 0) return {};
  max_blocks = std::max(max_blocks, 1u);
  // Written so that n near SIZE_MAX cannot wrap: whole blocks, then the partial one.
  size_t blocks = n / kBlockThreads + (n % kBlockThreads != 0 ? 1 : 0);
  return {static_cast<unsigned>(std::min<size_t>(blocks, max_blocks)), kBlockThreads};
}

LaunchGeometry segment_geometry(size_t segments, size_t dim, unsigned max_blocks) {
  if (segments == 0 || dim == 0) return {};
  max_blocks = std::max(max_blocks, 1u);
  size_t threads = std::min<size_t>(dim, kBlockThreads);
  threads = (threads + 31) / 32 * 32;
  return {static_cast<unsigned>(std::min<size_t>(segments, max_blocks)),
          static_cast<unsigned>(threads)};
}

}  // namespace px::gpu
