// Element-wise reductions of several equal-length buffers: the local-aggregation kernel of
// the daemon and the combine step of the collectives.
#pragma once

#include <cstddef>

#include "transport/kernels/dtype.h"

namespace px {

// dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... in source order, so results are bitwise
// reproducible. dst may be srcs[0] (same address); otherwise it must not overlap any source.
// For kMean the total is divided by mean_divisor (integers truncate toward zero); f16 and
// bf16 accumulate in f32 and are rounded once. Integer sums and products wrap.
void reduce_buffers(DType dtype, ReduceOp op, void* dst, const void* const* srcs, size_t nsrc,
                    size_t count, unsigned mean_divisor);

}  // namespace px
