// A stand-in for a worker's IPC-mapped device memory in unit tests of the daemon's GPU
// bookkeeping (daemon/gpu): host memory of the same size. The code under test only
// resolves and checks such mappings; what reads them is the test's own backend.
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/gpu/gpu_backend.h"

namespace pxtest {

class HostDeviceMapping final : public px::gpu::DeviceMapping {
 public:
  HostDeviceMapping(uint64_t bytes, int* closed, int device = 0)
      : memory_(bytes), closed_(closed), device_(device) {}
  ~HostDeviceMapping() override {
    if (closed_) ++*closed_;
  }
  void* pointer() const override { return const_cast<char*>(memory_.data()); }
  uint64_t bytes() const override { return memory_.size(); }
  int device() const override { return device_; }

 private:
  std::vector<char> memory_;
  int* closed_;
  int device_;
};

}  // namespace pxtest
