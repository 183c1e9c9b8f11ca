// Whether a device test can run: true with a CUDA device; without one the test says so in a
// MESSAGE and passes (ctest shows it as skipped), unless PX_REQUIRE_GPU=1 (tools/quickstart
// test --gpu), where that fails it.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "transport/kernels/cuda/device_probe.h"

namespace pxt::gpu {

inline bool have_device() {
  std::string why;
  if (px::gpu::cuda_device_count(&why) > 0) return true;
  const char* required = std::getenv("PX_REQUIRE_GPU");
  if (required && std::string(required) == "1") {
    FAIL_CHECK("no CUDA device and PX_REQUIRE_GPU=1: " << why);
  } else {
    MESSAGE("gpu test skipped: no CUDA device (" << why << ")");
  }
  return false;
}

}  // namespace pxt::gpu
