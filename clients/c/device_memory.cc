// libparallax: device memory (px_alloc_ex with PX_MEMORY_CUDA). Each allocation is one
// cudaMalloc on the caller's device, handed to the daemon once as a CUDA IPC handle (a
// control round trip); the daemon maps it and keeps the mapping until px_free, which asks
// it to let go before cudaFree. What the daemon can take (its GPUs' PCI bus ids, or why it
// has none) came with px_connect's reply, so a node without one answers at once.
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "clients/c/client_internal.h"
#include "clients/c/cuda_runtime.h"
#include "clients/c/requests_internal.h"

using px::fail;
using px::succeed;

namespace px {
namespace {

constexpr size_t kIpcGranularity = size_t{2} << 20;  // device allocations are rounded up to it

// A device memory request the daemon did not answer in time: its late reply would be taken
// for the next control call's, and whether it mapped the memory is unknown. The connection
// is given up (every request fails with why) and the memory is left allocated.
px_status give_up_on_timeout(Client* c, px_status status, const std::string& who) {
  if (status != PX_ERR_TIMEOUT) return status;
  std::string why = who +
                    ": parallaxd did not answer a device memory request in time; the "
                    "connection is given up and the memory left allocated";
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    mark_lost(c, why);
  }
  ::shutdown(c->socket_fd, SHUT_RDWR);  // the daemon ends the session and its mappings
  return fail(c, PX_ERR_TIMEOUT, why);
}

// Tells the daemon to close its mapping of region (before the memory is freed).
px_status release_region(Client* c, const std::string& who, uint32_t region) {
  flatbuffers::FlatBufferBuilder b;
  auto body = control::CreateReleaseDeviceMemory(b, region);
  std::string payload;
  const control::Message* message = nullptr;
  px_status status =
      control_call(c, finish_frame(b, control::Body::ReleaseDeviceMemory, body.Union()),
                   control::Body::DeviceMemoryReply, &payload, &message);
  if (status != PX_OK) return give_up_on_timeout(c, status, who);
  const control::DeviceMemoryReply* reply = message->body_as_DeviceMemoryReply();
  if (reply->status() != PX_OK)
    return fail(c, static_cast<px_status>(reply->status()),
                who + ": " + (reply->message() ? reply->message()->str() : ""));
  return PX_OK;
}

}  // namespace

px_status alloc_device_memory(Client* c, uint64_t bytes, int device, void** out_ptr) {
  const std::string who = "px_alloc_ex(" + std::to_string(bytes) + ", PX_MEMORY_CUDA, device " +
                          std::to_string(device) + ")";
  if (c->daemon_gpus.empty())
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who + ": parallaxd on node " + std::to_string(c->world.node_index) +
                    " has no usable GPU: " + c->daemon_gpu_why);
  const CudaApi* cuda = cuda_api_loading();
  if (!cuda)
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who +
                    ": no CUDA runtime: this process has not loaded one (libcudart) and "
                    "neither libcudart.so.13 nor libcudart.so.12 loads");
  if (bytes == 0) return fail(c, PX_ERR_INVALID, who + ": 0 bytes");
  int previous = 0;
  int err = cuda->get_device(&previous);
  if (err != 0)
    return fail(c, PX_ERR_INVALID, who + ": " + cuda_error_text(*cuda, "cudaGetDevice", err));
  if (device < 0) device = previous;
  char bus_id[32] = {0};
  err = cuda->device_get_pci_bus_id(bus_id, sizeof bus_id, device);
  if (err != 0)
    return fail(c, PX_ERR_INVALID,
                who + ": " + cuda_error_text(*cuda, "cudaDeviceGetPCIBusId", err));
  if (std::find(c->daemon_gpus.begin(), c->daemon_gpus.end(), bus_id) == c->daemon_gpus.end()) {
    std::string theirs;
    for (const std::string& id : c->daemon_gpus) theirs += (theirs.empty() ? "" : ", ") + id;
    return fail(c, PX_ERR_INVALID,
                who + ": device " + bus_id + " is not one parallaxd on node " +
                    std::to_string(c->world.node_index) + " has (" + theirs + ")");
  }
  // cudaMalloc allocates on the current device: switch to the caller's for the call.
  if (device != previous && (err = cuda->set_device(device)) != 0)
    return fail(c, PX_ERR_INVALID, who + ": " + cuda_error_text(*cuda, "cudaSetDevice", err));
  void* ptr = nullptr;
  // Whole 2 MiB units: the driver may carve a smaller cudaMalloc out of a larger block, and
  // CUDA IPC then shares (and maps in the daemon) the whole block, other allocations
  // included; CUDA's programming guide asks for 2 MiB-aligned sizes for IPC.
  err = cuda->malloc(&ptr, (bytes + kIpcGranularity - 1) / kIpcGranularity * kIpcGranularity);
  unsigned char handle[kIpcHandleBytes] = {0};
  if (err == 0) err = cuda->ipc_get_mem_handle(handle, ptr);
  if (device != previous) cuda->set_device(previous);
  if (err != 0) {
    if (ptr) cuda->free(ptr);
    return fail(
        c, err == 2 ? PX_ERR_NO_MEMORY : PX_ERR_INVALID,
        who + ": " + cuda_error_text(*cuda, ptr ? "cudaIpcGetMemHandle" : "cudaMalloc", err));
  }
  uint32_t region;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    region = c->next_device_region++;
  }
  flatbuffers::FlatBufferBuilder b;
  auto id = b.CreateString(bus_id);
  auto ipc = b.CreateVector(handle, sizeof handle);
  auto body = control::CreateRegisterDeviceMemory(b, region, id, ipc, bytes);
  std::string payload;
  const control::Message* message = nullptr;
  px_status status =
      control_call(c, finish_frame(b, control::Body::RegisterDeviceMemory, body.Union()),
                   control::Body::DeviceMemoryReply, &payload, &message);
  if (status == PX_OK) {
    const control::DeviceMemoryReply* reply = message->body_as_DeviceMemoryReply();
    if (reply->status() != PX_OK)
      status = fail(c, static_cast<px_status>(reply->status()),
                    who + ": " + (reply->message() ? reply->message()->str() : ""));
  }
  if (status == PX_ERR_TIMEOUT) return give_up_on_timeout(c, status, who);
  if (status != PX_OK) {
    cuda->free(ptr);  // the daemon refused it, or is gone
    return status;
  }
  std::lock_guard<std::mutex> lock(c->mutex);
  c->device_regions[reinterpret_cast<uintptr_t>(ptr)] = {region, device, bytes};
  *out_ptr = ptr;
  return succeed();
}

bool free_device_memory(Client* c, void* ptr, px_status* status) {
  DeviceRegion region;
  auto key = reinterpret_cast<uintptr_t>(ptr);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    auto it = c->device_regions.find(key);
    if (it == c->device_regions.end()) return false;
    region = it->second;
  }
  const CudaApi* cuda = cuda_api();  // loaded: the region came from it
  *status = release_region(c, "px_free", region.id);
  // Freed once the daemon closed its mapping, or is gone with it. Refused (a step under way
  // uses it: PX_ERR_BUSY), unanswered (a timeout) or not asked (the client closed by another
  // thread meanwhile: its session may still run a step), the memory stays allocated:
  // freeing it under an open mapping would be worse than the leak.
  if (*status == PX_OK || *status == PX_ERR_PEER_LOST) {
    {
      std::lock_guard<std::mutex> lock(c->mutex);
      c->device_regions.erase(key);
    }
    cuda->free(ptr);
    if (*status != PX_OK) *status = succeed();
  }
  return true;
}

void free_all_device_memory(Client* c) {
  std::vector<void*> pointers;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    for (const auto& [ptr, region] : c->device_regions)
      pointers.push_back(reinterpret_cast<void*>(ptr));
  }
  px_status ignored;
  for (void* p : pointers) free_device_memory(c, p, &ignored);
}

}  // namespace px

extern "C" {

PX_API void px_alloc_options_init(px_alloc_options* options) {
  if (!options) return;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->memory_kind = PX_MEMORY_HOST;
  options->device = -1;
}

PX_API px_status px_alloc_ex(px_client* handle, uint64_t bytes, const px_alloc_options* options,
                             void** out_ptr) {
  using namespace px;
  if (!out_ptr) return fail(PX_ERR_INVALID, "px_alloc_ex: out_ptr is NULL");
  *out_ptr = nullptr;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_alloc_ex", "client", handle);
  Client* c = ref.client.get();
  px_alloc_options o;
  px_alloc_options_init(&o);
  if (options) {
    if (options->struct_size < sizeof(uint32_t) || options->struct_size > (1u << 16))
      return fail(c, PX_ERR_INVALID,
                  "px_alloc_ex: options->struct_size is not set (use px_alloc_options_init)");
    std::memcpy(&o, options, std::min<size_t>(options->struct_size, sizeof o));
  }
  if (o.memory_kind == PX_MEMORY_HOST) return px_alloc(handle, bytes, out_ptr);
  if (o.memory_kind != PX_MEMORY_CUDA)
    return fail(c, PX_ERR_INVALID,
                "px_alloc_ex: unknown memory_kind " + std::to_string(o.memory_kind));
  return alloc_device_memory(c, bytes, o.device, out_ptr);
}

}  // extern "C"
