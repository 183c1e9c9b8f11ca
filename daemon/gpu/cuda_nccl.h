// The plugin's NCCL communicators (gpu_backend.h, NcclCommunicator), apart from the CUDA
// backend that hands them out: without NCCL in the build both functions say so.
#pragma once

#include <memory>
#include <string>

#include "daemon/gpu/gpu_backend.h"

namespace px::gpu {

bool cuda_nccl_unique_id(std::string* id, std::string* why);
bool cuda_nccl_open(int device, int ranks, int rank, const std::string& id, int timeout_ms,
                    const std::atomic<bool>* abort, std::unique_ptr<NcclCommunicator>* out,
                    std::string* why);

}  // namespace px::gpu
