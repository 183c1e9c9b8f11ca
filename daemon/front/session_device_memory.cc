// A worker's device memory (px_alloc_ex with PX_MEMORY_CUDA): registering it (the CUDA IPC
// handle opened once, on the pool: it takes milliseconds) and releasing it before px_free
// (answered once the backend closed it).
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
        self->device_regions_.finish(region, std::move(opened->mapping));
        if (self->closed()) return;  // the mapping goes with the session
        if (!ok)
          return self->reply_device_memory(PX_ERR_INVALID,
                                           where + " cannot map " + who + ": " + opened->why);
        self->reply_device_memory(PX_OK, "");
      });
}

void Session::handle_release_device_memory(const control::ReleaseDeviceMemory& request) {
  std::string who = "device memory region " + std::to_string(request.region()) + " of " + label();
  switch (device_regions_.release(request.region())) {
    case gpu::DeviceRegions::Release::kReleased: {
      // The worker's cudaFree follows the reply: only once the mapping is closed (on the
      // backend's release thread: closing may wait for the device).
      gpu::GpuBackend* backend = server_.gpu().backend();
      if (!backend) return reply_device_memory(PX_OK, "");
      PostToLoop post = server_.scheduler().offload().post();
      backend->after_releases([post, self = shared_from_this()]() mutable {
        post([self = std::move(self)] {  // no reference left here: the session ends on the loop
          if (!self->closed()) self->reply_device_memory(PX_OK, "");
        });
      });
      return;
    }
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
