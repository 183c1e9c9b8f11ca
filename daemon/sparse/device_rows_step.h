// Sparse pull and push steps (and loads and reads) whose workers gave device memory (px_alloc_ex
// regions the daemon mapped), in front of the sparse router: each such worker's buffers cross PCIe
// on the pool before the router sees the step, as StagedRows in host memory. A push is coalesced on
// the GPU first (the CUB kernel: unique indices and their summed rows), so only unique rows cross;
// a pull's indices are copied to host, and its rows, once the router filled them, back into the
// worker's device memory before the worker hears. Workers on host memory in the same step go
// through untouched.
#pragma once

#include <cstdint>
#include <memory>

#include "daemon/common/job.h"
#include "daemon/common/offload.h"
#include "daemon/common/operation.h"
#include "daemon/gpu/gpu_backend.h"
#include "daemon/sparse/sparse_router.h"

namespace px {

// True if a contribution of the step is device memory.
bool has_device_rows(const PendingStep& pending);

// Stages the step's device contributions, then hands it to router.run_step. gpu may be
// null (those workers then get PX_ERR_NOT_IMPLEMENTED; the step goes on for the others).
// Loop thread only.
void run_device_rows_step(const Offload& offload, gpu::GpuBackend* gpu, SparseRouter& router,
                          std::shared_ptr<Job> job, Variable& var, Opcode opcode, uint64_t step,
                          PendingStep pending);

// A load or read (single operations) on device memory: staged the same way (a load's
// indices and values copied to host, a read's rows copied back), then router.run_single.
void run_device_rows_single(const Offload& offload, gpu::GpuBackend* gpu, SparseRouter& router,
                            std::shared_ptr<Job> job, std::shared_ptr<Completer> worker,
                            Variable& var, const SubmitEntry& entry);

}  // namespace px
