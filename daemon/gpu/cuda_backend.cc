// libparallax_gpu.so: the GPU backend over the CUDA runtime and NCCL (gpu_backend.h).
// Loaded by parallaxd at start; its one exported symbol is px_gpu_backend_create.
#include <cuda_runtime_api.h>

#include <string>

#include "daemon/gpu/gpu_backend.h"
#include "transport/kernels/cuda/cuda_error.h"
#include "transport/kernels/cuda/device_probe.h"

namespace px::gpu {
namespace {

// "13.0" from CUDA's 13000.
std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

class CudaBackend final : public GpuBackend {
 public:
  CudaBackend() { inventory_ = take_inventory(); }
  const GpuInventory& inventory() const override { return inventory_; }

 private:
  static GpuInventory take_inventory() {
    GpuInventory inv;
    int version = 0;
    if (cudaRuntimeGetVersion(&version) == cudaSuccess)
      inv.cuda_runtime = cuda_version_text(version);
    if (cudaDriverGetVersion(&version) == cudaSuccess && version > 0)
      inv.cuda_driver = cuda_version_text(version);
    std::string why;
    inv.nccl = nccl_version(&why);
    int count = cuda_device_count(&inv.why_none);
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp prop{};
      cudaError_t err = cudaGetDeviceProperties(&prop, d);
      char bus[32] = {0};
      if (err == cudaSuccess) err = cudaDeviceGetPCIBusId(bus, sizeof bus, d);
      if (err != cudaSuccess) {
        // A device the runtime counts but cannot describe is not one to hand buffers to.
        cuda_failed(&inv.why_none, ("device " + std::to_string(d)).c_str(), err);
        inv.devices.clear();
        break;
      }
      GpuDevice dev;
      dev.ordinal = d;
      dev.name = prop.name;
      dev.pci_bus_id = bus;
      dev.memory_bytes = prop.totalGlobalMem;
      dev.compute_major = prop.major;
      dev.compute_minor = prop.minor;
      inv.devices.push_back(dev);
    }
    if (!inv.devices.empty()) inv.why_none.clear();
    return inv;
  }

  GpuInventory inventory_;
};

}  // namespace
}  // namespace px::gpu

extern "C" __attribute__((visibility("default"))) px::gpu::GpuBackend* px_gpu_backend_create(
    uint32_t interface, std::string* why) {
  if (interface != px::gpu::kGpuBackendInterface) {
    *why = "interface " + std::to_string(interface) + " asked, this plugin has " +
           std::to_string(px::gpu::kGpuBackendInterface) + " (a plugin from another build)";
    return nullptr;
  }
  return new px::gpu::CudaBackend();
}
