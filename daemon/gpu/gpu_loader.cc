#include "daemon/gpu/gpu_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

namespace px::gpu {
namespace {

constexpr const char* kPluginName = "libparallax_gpu.so";

// Where parallaxd's own binary is: a build tree keeps the plugin beside it.
std::string executable_dir() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "";
  std::string exe(path, static_cast<size_t>(n));
  size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "" : exe.substr(0, slash);
}

std::vector<std::string> default_paths() {
  std::vector<std::string> paths;
  std::string dir = executable_dir();
  if (!dir.empty()) paths.push_back(dir + "/" + kPluginName);
#ifdef PX_GPU_BACKEND_FROM_SBIN
  // Installed: sbin/parallaxd and lib/.../parallax/libparallax_gpu.so under one prefix.
  if (!dir.empty()) paths.push_back(dir + "/" + PX_GPU_BACKEND_FROM_SBIN);
#endif
  return paths;
}

bool readable(const std::string& path) {
  return access(path.c_str(), R_OK) == 0;
}

// dlopens path and creates the backend; false with why.
bool open_plugin(const std::string& path, std::unique_ptr<GpuBackend>* out, std::string* why) {
  // Never dlclosed: the CUDA runtime registers exit handlers that live in its code.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = dlerror();
    *why = "cannot load the GPU backend " + path + ": " + (error ? error : "dlopen failed");
    return false;
  }
  auto create = reinterpret_cast<GpuBackendCreateFn>(dlsym(handle, kGpuBackendEntry));
  if (!create) {
    *why = "the GPU backend " + path + " has no " + kGpuBackendEntry + " (not a parallax plugin)";
    return false;
  }
  std::string error;
  GpuBackend* backend = create(kGpuBackendInterface, &error);
  if (!backend) {
    *why = "the GPU backend " + path + ": " + error;
    return false;
  }
  out->reset(backend);
  return true;
}

std::string device_list(const GpuInventory& inv) {
  std::string text;
  for (const GpuDevice& d : inv.devices) {
    if (!text.empty()) text += ", ";
    text += std::to_string(d.ordinal) + ": " + d.name + " (" + d.pci_bus_id + ", " +
            std::to_string(d.memory_bytes >> 20) + " MiB, sm_" + std::to_string(d.compute_major) +
            std::to_string(d.compute_minor) + ")";
  }
  return text;
}

}  // namespace

bool parse_gpu_mode(const std::string& text, GpuMode* mode) {
  if (text == "auto")
    *mode = GpuMode::kAuto;
  else if (text == "off")
    *mode = GpuMode::kOff;
  else if (text == "required")
    *mode = GpuMode::kRequired;
  else
    return false;
  return true;
}

const char* gpu_mode_name(GpuMode mode) {
  switch (mode) {
    case GpuMode::kAuto:
      return "auto";
    case GpuMode::kOff:
      return "off";
    case GpuMode::kRequired:
      return "required";
  }
  return "?";
}

int LoadedGpu::device_count() const {
  return backend_ ? static_cast<int>(backend_->inventory().devices.size()) : 0;
}

std::string LoadedGpu::summary() const {
  if (device_count() == 0) return "none: " + why_none_;
  const GpuInventory& inv = backend_->inventory();
  std::string text = std::to_string(inv.devices.size()) +
                     (inv.devices.size() == 1 ? " device: " : " devices: ") + device_list(inv) +
                     "; CUDA runtime " + inv.cuda_runtime + ", driver " + inv.cuda_driver;
  text += inv.nccl.empty() ? "; built without NCCL" : "; NCCL " + inv.nccl;
  return text;
}

bool load_gpu_backend(GpuMode mode, const std::string& explicit_path, LoadedGpu* out,
                      std::string* error) {
  out->mode_ = mode;
  if (mode == GpuMode::kOff) {
    out->why_none_ = "gpu.mode is off";
    return true;
  }
  std::string path = explicit_path;
  if (path.empty()) {
    std::vector<std::string> candidates = default_paths();
    for (const std::string& p : candidates) {
      if (readable(p)) {
        path = p;
        break;
      }
    }
    if (path.empty()) {
      std::string looked;
      for (const std::string& p : candidates) looked += (looked.empty() ? "" : ", ") + p;
      out->why_none_ =
#ifdef PX_BUILT_WITH_CUDA
          "no GPU backend: " + std::string(kPluginName) + " is not at " + looked;
#else
          "no GPU backend: parallaxd was built without CUDA (not at " + looked + " either)";
#endif
    }
  }
  if (!path.empty()) {
    std::string why;
    if (!open_plugin(path, &out->backend_, &why)) {
      if (!explicit_path.empty()) {
        *error = "gpu.backend: " + why;
        return false;
      }
      out->why_none_ = why;
    } else {
      out->plugin_path_ = path;
      const GpuInventory& inv = out->backend_->inventory();
      if (inv.devices.empty())
        out->why_none_ = inv.why_none.empty() ? "no CUDA device" : inv.why_none;
    }
  }
  if (mode == GpuMode::kRequired && out->device_count() == 0) {
    *error = "gpu.mode is required but this node has no usable GPU: " + out->why_none_;
    return false;
  }
  return true;
}

}  // namespace px::gpu
