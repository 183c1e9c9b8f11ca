// A worker's device memory (px_alloc_ex with PX_MEMORY_CUDA): registering it (the CUDA IPC
// handle opened once, on the pool: it takes milliseconds) and releasing it before px_free
// (closed on the pool too: closing may wait for the device).
#include <vector>

#include "daemon/front/server.h"
#include "daemon/front/session.h"

namespace px {

void Session::reply_device_memory(px_status status, const std::string& message) {
  flatbuffers::FlatBufferBuilder b;
  auto text = b.CreateString(message);
  auto body = control::CreateDeviceMemoryReply(b, status, text);
  send_frame(finish_frame(b, control::Body::DeviceMemoryReply, body.Union()));
}

void Session::handle_register_device_memory(const control::RegisterDeviceMemory& request) {
  uint32_t region = request.region();
  std::string where = "parallaxd on " + server_.node_label(server_.config().node_index);
  std::string who = "device memory region " + std::to_string(region) + " of " + label();
  const gpu::LoadedGpu& gpu = server_.gpu();
  if (gpu.device_count() == 0)
    return reply_device_memory(PX_ERR_NOT_IMPLEMENTED,
                               where + " has no usable GPU for " + who + ": " + gpu.why_none());
  std::string pci = request.pci_bus_id() ? request.pci_bus_id()->str() : "";
  size_t handle_bytes = request.ipc_handle() ? request.ipc_handle()->size() : 0;
  std::string why;
  px_status status = device_regions_.check(region, pci, handle_bytes, request.bytes(), &why);
  if (status != PX_OK) return reply_device_memory(status, where + " refuses " + who + ": " + why);
  device_regions_.begin(region);
  std::vector<uint8_t> handle(request.ipc_handle()->begin(), request.ipc_handle()->end());
  uint64_t bytes = request.bytes();
  struct Opened {
    std::unique_ptr<gpu::DeviceMapping> mapping;
    std::string why;
  };
  auto opened = std::make_shared<Opened>();
  gpu::GpuBackend* backend = gpu.backend();
  server_.scheduler().offload().run(
      true,
      [backend, pci, handle, bytes, opened] {
        backend->open_ipc_memory(pci, handle.data(), handle.size(), bytes, &opened->mapping,
                                 &opened->why);
      },
      [self = shared_from_this(), region, opened, where, who] {
        bool ok = opened->mapping != nullptr;
        if (self->closed()) {  // the worker is gone: closed again on the pool
          self->device_regions_.finish(region, nullptr);
          std::vector<std::shared_ptr<gpu::DeviceMapping>> late;
          late.emplace_back(std::move(opened->mapping));
          return release_mappings(self->server_.scheduler().offload(), &late);
        }
        self->device_regions_.finish(region, std::move(opened->mapping));
        if (!ok)
          return self->reply_device_memory(PX_ERR_INVALID,
                                           where + " cannot map " + who + ": " + opened->why);
        self->reply_device_memory(PX_OK, "");
      });
}

void Session::handle_release_device_memory(const control::ReleaseDeviceMemory& request) {
  std::string who = "device memory region " + std::to_string(request.region()) + " of " + label();
  std::vector<std::shared_ptr<gpu::DeviceMapping>> released(1);
  switch (device_regions_.release(request.region(), &released[0])) {
    case gpu::DeviceRegions::Release::kReleased:
      // The worker's cudaFree may follow the reply: the mapping is closed first.
      return release_mappings(server_.scheduler().offload(), &released,
                              [self = shared_from_this()] {
                                if (!self->closed()) self->reply_device_memory(PX_OK, "");
                              });
    case gpu::DeviceRegions::Release::kInUse:
      return reply_device_memory(PX_ERR_BUSY, who +
                                                  " is in use by a step under way: wait for "
                                                  "its requests before px_free");
    case gpu::DeviceRegions::Release::kUnknown:
      break;
  }
  reply_device_memory(PX_ERR_INVALID, who + " is not registered");
}

}  // namespace px
