// What the process can use of CUDA and NCCL, asked at run time. Plain C++.
#pragma once

#include <string>

namespace px::gpu {

// Whether this build compiled the CUDA kernels (the toolkit was found at configure time).
bool built_with_cuda();

// CUDA devices this process can use; 0 with the reason in why when there are none: the
// CUDA runtime's error ("cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver
// version is insufficient for CUDA runtime version" on a machine without a GPU driver), no
// device, or a build without CUDA.
int cuda_device_count(std::string* why);

// The NCCL library's version as it reports it ("2.28.9"), or "" with why in a build
// without NCCL.
std::string nccl_version(std::string* why);

}  // namespace px::gpu
