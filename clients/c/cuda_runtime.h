// The CUDA runtime as libparallax uses it: the copy the process has loaded (the
// framework's); loaded by libparallax itself only for a PX_MEMORY_CUDA call in a process
// without a shared copy, since libparallax must run where there is no CUDA. No CUDA header: the few
// functions are declared here with plain C types.
#pragma once

#include <cstddef>
#include <string>

namespace px {

struct CudaApi {
  int (*pointer_get_attributes)(void* attributes, const void* ptr);
  int (*get_last_error)();
  int (*get_device)(int* device);
  int (*set_device)(int device);
  int (*malloc)(void** ptr, size_t bytes);
  int (*free)(void* ptr);
  int (*ipc_get_mem_handle)(void* handle, void* ptr);  // handle: cudaIpcMemHandle_t, 64 bytes
  int (*device_get_pci_bus_id)(char* id, int length, int device);
  const char* (*get_error_name)(int error);
  const char* (*get_error_string)(int error);
  // cudaLaunchHostFunc(stream, fn, data): fn(data) runs once the stream reaches it.
  int (*launch_host_func)(void* stream, void (*fn)(void*), void* data);
  // cudaStreamGetDevice (CUDA 12.8 and later; null in older runtimes).
  int (*stream_get_device)(void* stream, int* device);
  // cudaStreamIsCapturing(stream, &status): status 0 is cudaStreamCaptureStatusNone.
  int (*stream_is_capturing)(void* stream, int* status);
  // cudaMemcpyAsync(dst, src, bytes, kind, stream); kind 3 is cudaMemcpyDeviceToDevice.
  int (*memcpy_async)(void* dst, const void* src, size_t bytes, int kind, void* stream);
  int (*runtime_get_version)(int* version);
  // The driver's cuMemGetAddressRange (v2), fetched through the runtime's
  // cudaGetDriverEntryPointByVersion (CUDA 12.5 and later); null where it cannot be.
  int (*mem_get_address_range)(unsigned long long* base, size_t* size, unsigned long long ptr);
};
constexpr int kCudaMemcpyDeviceToDevice = 3;

// The process's CUDA runtime, or null if it has not loaded one (re-checked cheaply when
// objects were loaded since: frameworks load CUDA lazily).
const CudaApi* cuda_api();
// For PX_MEMORY_CUDA calls only: the process's runtime, or else one loaded by soname
// (libcudart.so.13, then .12; tried once): an application linking the runtime statically,
// nvcc's default, has no shared copy to find. Streams and device pointers are the driver's,
// the same for every copy of the runtime in the process. Null if none loads.
const CudaApi* cuda_api_loading();

// "cudaMalloc: cudaErrorMemoryAllocation: out of memory". Also clears the runtime's last
// error: a failure libparallax handles must not surface in the framework's next check.
std::string cuda_error_text(const CudaApi& api, const char* what, int error);

// Whether p is CUDA device memory (false when the process has no CUDA runtime).
bool is_cuda_device_pointer(const void* p);
// The device holding p if it is CUDA device memory; -1 otherwise (and with a runtime older
// than CUDA 11, whose cudaPointerAttributes is laid out differently).
int cuda_pointer_device(const void* p);
// Whether [p, p + bytes) lies in one device allocation; true where the driver cannot be
// asked (no cuMemGetAddressRange, or an error: the check is skipped). Memory mapped in
// pieces (PyTorch's expandable segments) is refused across a piece's end: adjacent
// cudaMalloc allocations cannot be told from pieces of one.
bool cuda_range_in_one_allocation(const void* p, size_t bytes);

}  // namespace px
