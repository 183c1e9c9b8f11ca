#include "clients/python/c10d/px_library.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace pxc10d {
namespace {

template <typename Fn>
void bind(void* handle, const std::string& path, const char* name, Fn* out) {
  void* symbol = dlsym(handle, name);
  if (!symbol)
    throw std::runtime_error("parallax backend: " + path + " has no " + name +
                             " (an older libparallax than this package?)");
  *out = reinterpret_cast<Fn>(symbol);
}

}  // namespace

const PxLibrary& PxLibrary::open(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<PxLibrary>> opened;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = opened.find(path);
  if (it != opened.end()) return *it->second;
  // The handle is never closed: the library stays loaded for the process (ctypes keeps it too).
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw std::runtime_error(std::string("parallax backend: ") + dlerror());
  auto px = std::make_unique<PxLibrary>();
  px->path = path;
  bind(handle, path, "px_abi_version", &px->abi_version);
  bind(handle, path, "px_status_name", &px->status_name);
  bind(handle, path, "px_last_error", &px->last_error);
  bind(handle, path, "px_world", &px->world);
  bind(handle, path, "px_client_fd", &px->client_fd);
  bind(handle, path, "px_progress", &px->progress);
  bind(handle, path, "px_register_dense", &px->register_dense);
  bind(handle, path, "px_alloc", &px->alloc);
  bind(handle, path, "px_free", &px->free);
  bind(handle, path, "px_op_options_init", &px->op_options_init);
  bind(handle, path, "px_allreduce_ex", &px->allreduce_ex);
  bind(handle, path, "px_broadcast_ex", &px->broadcast_ex);
  bind(handle, path, "px_allgather_ex", &px->allgather_ex);
  bind(handle, path, "px_reduce_scatter_ex", &px->reduce_scatter_ex);
  bind(handle, path, "px_alltoallv_ex", &px->alltoallv_ex);
  bind(handle, path, "px_test", &px->test);
  bind(handle, path, "px_request_free", &px->request_free);
  bind(handle, path, "px_request_error", &px->request_error);
  uint32_t abi = px->abi_version();
  if ((abi >> 16) != PX_ABI_VERSION_MAJOR || (abi & 0xffff) < PX_ABI_VERSION_MINOR)
    throw std::runtime_error("parallax backend: " + path + " has ABI " + std::to_string(abi >> 16) +
                             "." + std::to_string(abi & 0xffff) + "; the backend was built for " +
                             std::to_string(PX_ABI_VERSION_MAJOR) + "." +
                             std::to_string(PX_ABI_VERSION_MINOR) + " or a later 1.x");
  return *opened.emplace(path, std::move(px)).first->second;
}

}  // namespace pxc10d
