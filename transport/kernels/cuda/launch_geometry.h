// Grid and block sizes of the CUDA kernels, computed on the host (plain C++, unit-tested
// without a GPU). Kernels loop grid-stride, so a grid smaller than the work is still complete.
#pragma once

#include <cstddef>

namespace px::gpu {

// Threads per block of the element-wise kernels.
constexpr unsigned kBlockThreads = 256;
// Blocks of a grid-stride launch at most: an H100 (132 SMs, 8 resident 256-thread blocks
// each) holds ~1,056 at once, so 4,096 is a few full waves and no launch is tiny per thread.
constexpr unsigned kMaxGridBlocks = 4096;

struct LaunchGeometry {
  unsigned blocks = 0;   // 0: nothing to launch
  unsigned threads = 0;  // per block
};

// n independent elements: one thread each, kBlockThreads a block, at most max_blocks blocks
// (max_blocks 0 is taken as 1); n == 0 gives an empty launch.
LaunchGeometry elementwise_geometry(size_t n, unsigned max_blocks = kMaxGridBlocks);

// segments rows of dim columns: a block per segment (grid-stride over segments, at most
// max_blocks), its threads over the columns: dim rounded up to a warp, 32..kBlockThreads.
LaunchGeometry segment_geometry(size_t segments, size_t dim, unsigned max_blocks = kMaxGridBlocks);

}  // namespace px::gpu
