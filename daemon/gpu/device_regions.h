// One worker's device memory as the daemon holds it: the regions it registered
// (px_alloc_ex with PX_MEMORY_CUDA), each mapped once with CUDA IPC and kept until the
// worker releases it or ends. The checks on a registration and on a buffer in a region
// live here, apart from CUDA, so they are unit-tested without a GPU.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "daemon/gpu/gpu_backend.h"
#include "parallax_c.h"

namespace px::gpu {

class DeviceRegions {
 public:
  // Regions one worker may hold at once: each is an IPC mapping in the daemon.
  static constexpr size_t kMaxRegions = 1024;

  // Checks a registration before its mapping is opened; PX_OK, or a status with why.
  // Then begin(region) marks it as being opened, so a second registration of the same
  // region is refused while the first is still opening.
  px_status check(uint32_t region, const std::string& pci_bus_id, size_t handle_bytes,
                  uint64_t bytes, std::string* why) const;
  void begin(uint32_t region) { opening_.insert(region); }
  // The mapping opened (or, null, failed): the region is held, or forgotten.
  void finish(uint32_t region, std::shared_ptr<DeviceMapping> mapping);

  // Drops a region and closes its mapping: kInUse while a step under way holds it (the
  // worker must not free memory the daemon may still write), kUnknown if not registered.
  enum class Release { kReleased, kInUse, kUnknown };
  Release release(uint32_t region);

  // [offset, offset + bytes) of a region, or null with why (an unknown region, or past its
  // end).
  std::shared_ptr<DeviceMapping> find(uint32_t region, uint64_t offset, uint64_t bytes,
                                      std::string* why) const;

  size_t size() const { return regions_.size(); }
  uint64_t bytes() const;

 private:
  std::map<uint32_t, std::shared_ptr<DeviceMapping>> regions_;
  std::set<uint32_t> opening_;
};

}  // namespace px::gpu
