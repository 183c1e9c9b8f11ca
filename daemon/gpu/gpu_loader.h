// Loading the GPU backend plugin at start (gpu.mode, gpu.backend in the configuration).
//   auto      load it if it is there; without it, or without a device, GPU operations
//             are refused (PX_ERR_NOT_IMPLEMENTED, naming why) and everything else works
//   off       do not load it
//   required  refuse to start without a usable device (a GPU node's service unit)
// An explicit gpu.backend that cannot be loaded stops the start in every mode but off: the
// operator named it.
#pragma once

#include <memory>
#include <string>

#include "daemon/gpu/gpu_backend.h"

namespace px::gpu {

enum class GpuMode { kAuto, kOff, kRequired };

// "auto", "off", "required"; false for anything else.
bool parse_gpu_mode(const std::string& text, GpuMode* mode);
const char* gpu_mode_name(GpuMode mode);

class LoadedGpu {
 public:
  // The backend, or null when GPU operations are refused (why_none() says why).
  GpuBackend* backend() const { return backend_.get(); }
  // Devices the backend found (0 without one).
  int device_count() const;
  // Why this daemon has no usable GPU ("" when it has one).
  const std::string& why_none() const { return why_none_; }
  const std::string& plugin_path() const { return plugin_path_; }
  GpuMode mode() const { return mode_; }
  // One line for the log and pxctl status: the devices with their bus ids, the CUDA and
  // NCCL versions; or "none: why".
  std::string summary() const;

 private:
  friend bool load_gpu_backend(GpuMode, const std::string&, LoadedGpu*, std::string*);
  GpuMode mode_ = GpuMode::kAuto;
  std::unique_ptr<GpuBackend> backend_;
  std::string plugin_path_;
  std::string why_none_;
};

// Loads the plugin (explicit_path, else libparallax_gpu.so next to parallaxd, else where
// it is installed) into *out. False with error when the start must stop: required without
// a device, or an explicit path that does not load.
bool load_gpu_backend(GpuMode mode, const std::string& explicit_path, LoadedGpu* out,
                      std::string* error);

}  // namespace px::gpu
