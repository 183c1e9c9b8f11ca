#include "daemon/gpu/device_regions.h"

namespace px::gpu {

px_status DeviceRegions::check(uint32_t region, const std::string& pci_bus_id, size_t handle_bytes,
                               uint64_t bytes, std::string* why) const {
  if (region == 0) {
    *why = "region 0 (regions are numbered from 1)";
    return PX_ERR_INVALID;
  }
  if (regions_.count(region) || opening_.count(region)) {
    *why = "region " + std::to_string(region) + " is already registered";
    return PX_ERR_INVALID;
  }
  if (regions_.size() + opening_.size() >= kMaxRegions) {
    *why = "the worker holds " + std::to_string(kMaxRegions) +
           " device memory regions already (px_free some, or allocate fewer, larger ones)";
    return PX_ERR_NO_MEMORY;
  }
  if (pci_bus_id.empty() || pci_bus_id.size() > 64) {
    *why = "a device PCI bus id of " + std::to_string(pci_bus_id.size()) + " bytes";
    return PX_ERR_INVALID;
  }
  if (handle_bytes != kIpcHandleBytes) {
    *why = "an IPC handle of " + std::to_string(handle_bytes) + " bytes, not " +
           std::to_string(kIpcHandleBytes);
    return PX_ERR_INVALID;
  }
  if (bytes == 0) {
    *why = "a region of 0 bytes";
    return PX_ERR_INVALID;
  }
  return PX_OK;
}

void DeviceRegions::finish(uint32_t region, std::shared_ptr<DeviceMapping> mapping) {
  opening_.erase(region);
  if (mapping) regions_[region] = std::move(mapping);
}

DeviceRegions::Release DeviceRegions::release(uint32_t region) {
  auto it = regions_.find(region);
  if (it == regions_.end()) return Release::kUnknown;
  // Steps hold their mappings only on the loop thread (they let go before completing), so
  // the count is exact here.
  if (it->second.use_count() > 1) return Release::kInUse;
  regions_.erase(it);
  return Release::kReleased;
}

std::shared_ptr<DeviceMapping> DeviceRegions::find(uint32_t region, uint64_t offset, uint64_t bytes,
                                                   std::string* why) const {
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    *why = "device memory region " + std::to_string(region) +
           " is not registered (not from px_alloc_ex, or freed)";
    return nullptr;
  }
  uint64_t size = it->second->bytes();
  if (offset > size || bytes > size - offset) {
    *why = "bytes [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
           std::to_string(bytes) + ") run past device memory region " + std::to_string(region) +
           " of " + std::to_string(size) + " bytes";
    return nullptr;
  }
  return it->second;
}

uint64_t DeviceRegions::bytes() const {
  uint64_t total = 0;
  for (const auto& [region, mapping] : regions_) total += mapping->bytes();
  return total;
}

}  // namespace px::gpu
