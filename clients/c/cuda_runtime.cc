#include "clients/c/cuda_runtime.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace px {
namespace {

// Frameworks load CUDA lazily, so "not loaded" is re-checked, but only when the set of
// loaded objects changed: dl_iterate_phdr's dlpi_adds counts loads, and reading it stops at
// the first object (no syscall). A dlopen(RTLD_NOLOAD) by soname per call would search the
// library path with open() calls: ~20 us each, measured.
struct Lookup {
  std::mutex mutex;
  unsigned long long adds_seen = ~0ull;
  CudaApi api{};
  std::atomic<const CudaApi*> found{nullptr};
};

Lookup& lookup() {
  static Lookup* l = new Lookup;  // never destroyed: used until exit
  return *l;
}

unsigned long long loaded_object_adds() {
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        return 1;  // the counter is the same in every entry: stop at the first
      },
      &adds);
  return adds;
}

template <class Fn>
bool bind(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

const CudaApi* cuda_api() {
  Lookup& l = lookup();
  if (const CudaApi* api = l.found.load(std::memory_order_acquire)) return api;  // stays
  unsigned long long adds = loaded_object_adds();
  std::lock_guard<std::mutex> lock(l.mutex);
  if (adds == l.adds_seen) return l.found.load(std::memory_order_relaxed);
  l.adds_seen = adds;
  std::string path;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const char* name = info->dlpi_name;
        const char* base = name ? std::strrchr(name, '/') : nullptr;
        base = base ? base + 1 : name;
        // libcudart.so.13, or a copy a Python wheel renamed (libcudart-1a2b3c4d.so.12).
        if (!base || std::strncmp(base, "libcudart", 9) != 0 || !std::strstr(base, ".so")) return 0;
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &path);
  if (path.empty()) return nullptr;
  // The full path of an object already loaded: dlopen matches it without searching. The
  // handle stays open: the runtime is never unloaded under us.
  void* lib = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return nullptr;
  CudaApi& a = l.api;
  bool all = bind(lib, "cudaPointerGetAttributes", &a.pointer_get_attributes) &&
             bind(lib, "cudaGetLastError", &a.get_last_error) &&
             bind(lib, "cudaGetDevice", &a.get_device) &&
             bind(lib, "cudaSetDevice", &a.set_device) && bind(lib, "cudaMalloc", &a.malloc) &&
             bind(lib, "cudaFree", &a.free) &&
             bind(lib, "cudaIpcGetMemHandle", &a.ipc_get_mem_handle) &&
             bind(lib, "cudaDeviceGetPCIBusId", &a.device_get_pci_bus_id) &&
             bind(lib, "cudaGetErrorName", &a.get_error_name) &&
             bind(lib, "cudaGetErrorString", &a.get_error_string) &&
             bind(lib, "cudaLaunchHostFunc", &a.launch_host_func) &&
             bind(lib, "cudaStreamIsCapturing", &a.stream_is_capturing) &&
             bind(lib, "cudaMemcpyAsync", &a.memcpy_async) &&
             bind(lib, "cudaRuntimeGetVersion", &a.runtime_get_version);
  if (!all) return nullptr;
  bind(lib, "cudaStreamGetDevice", &a.stream_get_device);  // optional
  // Optional too: cudaGetDriverEntryPointByVersion(symbol, &fn, version, flags, &result).
  int (*entry_point)(const char*, void**, unsigned, unsigned long long, int*) = nullptr;
  if (bind(lib, "cudaGetDriverEntryPointByVersion", &entry_point)) {
    void* fn = nullptr;
    int found = 0;  // cudaDriverEntryPointSuccess
    if (entry_point("cuMemGetAddressRange", &fn, 12000, 0, &found) == 0 && found == 0 && fn)
      a.mem_get_address_range =
          reinterpret_cast<int (*)(unsigned long long*, size_t*, unsigned long long)>(fn);
    else
      a.get_last_error();
  }
  l.found.store(&a, std::memory_order_release);
  return &a;
}

const CudaApi* cuda_api_loading() {
  if (const CudaApi* api = cuda_api()) return api;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* soname : {"libcudart.so.13", "libcudart.so.12"})
      if (dlopen(soname, RTLD_LAZY | RTLD_LOCAL)) return;  // kept open, as the process's own
  });
  return cuda_api();  // among the loaded objects now
}

std::string cuda_error_text(const CudaApi& api, const char* what, int error) {
  api.get_last_error();
  const char* name = api.get_error_name(error);
  const char* text = api.get_error_string(error);
  return std::string(what) + ": " + (name ? name : "cudaError") + ": " + (text ? text : "");
}

int cuda_pointer_device(const void* p) {
  const CudaApi* api = cuda_api();
  int version = 0;
  if (!api || api->runtime_get_version(&version) != 0 || version < 11000) return -1;
  // struct cudaPointerAttributes starts with `enum cudaMemoryType type; int device;` (CUDA
  // >= 11); the buffer is larger than any version of the struct.
  alignas(16) unsigned char buffer[256] = {};
  if (api->pointer_get_attributes(buffer, p) != 0) {
    api->get_last_error();  // an unknown host pointer, or no device: clear the error
    return -1;
  }
  int type, device;
  std::memcpy(&type, buffer, sizeof type);
  std::memcpy(&device, buffer + sizeof type, sizeof device);
  return type == 2 ? device : -1;  // cudaMemoryTypeDevice; managed (3) and host memory are not
}

bool is_cuda_device_pointer(const void* p) {
  return cuda_pointer_device(p) >= 0;
}

bool cuda_range_in_one_allocation(const void* p, size_t bytes) {
  const CudaApi* api = cuda_api();
  if (!api || !api->mem_get_address_range) return true;
  unsigned long long base = 0;
  size_t size = 0;
  auto at = reinterpret_cast<unsigned long long>(p);
  // A driver error (e.g. no context current on this thread) leaves the question open: p is
  // device memory already (cudaPointerGetAttributes said so), and the copy will say more.
  if (api->mem_get_address_range(&base, &size, at) != 0) return true;
  return at >= base && bytes <= size - (at - base);
}

}  // namespace px
