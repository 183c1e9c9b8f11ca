// px_gpu_worker: a worker that holds device memory (CUDA builds only; it links the CUDA
// runtime, as a framework's process has it loaded). Exits 77 after printing "no CUDA device
// here: why" where there is no device.
//
//   px_gpu_worker alloc   px_alloc_ex device memory the daemon maps, written by a kernel
//                         (cudaMemset), freed; bad devices refused; some left for
//                         px_disconnect to release
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallax_c.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  printf("FAIL %s: %s\n", what.c_str(), px_last_error());
  fflush(stdout);
  exit(1);
}

void check(px_status s, const std::string& what) {
  if (s != PX_OK) die(what + " returned " + px_status_name(s));
}

void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    printf("FAIL %s: %s\n", what.c_str(), cudaGetErrorString(err));
    exit(1);
  }
}

int alloc(px_client* c, int devices) {
  px_alloc_options o;
  px_alloc_options_init(&o);
  o.memory_kind = PX_MEMORY_CUDA;
  const size_t bytes = 1 << 20;
  void* p = nullptr;
  check(px_alloc_ex(c, bytes, &o, &p), "px_alloc_ex PX_MEMORY_CUDA");
  cudaPointerAttributes attributes{};
  check_cuda(cudaPointerGetAttributes(&attributes, p), "cudaPointerGetAttributes");
  if (attributes.type != cudaMemoryTypeDevice) die("px_alloc_ex did not return device memory");
  check_cuda(cudaMemset(p, 1, bytes), "cudaMemset on px_alloc_ex memory");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(px_free(c, p), "px_free of device memory");
  if (px_free(c, p) != PX_ERR_INVALID) die("px_free twice was not refused");

  o.device = devices;  // one past the last
  if (px_alloc_ex(c, bytes, &o, &p) != PX_ERR_INVALID) die("a device past the last was taken");
  if (std::string(px_last_error()).find("cudaDeviceGetPCIBusId") == std::string::npos)
    die("the bad device's error does not name cudaDeviceGetPCIBusId");

  // Left for px_disconnect, which releases them before freeing.
  o.device = 0;
  for (int i = 0; i < 3; ++i) check(px_alloc_ex(c, bytes, &o, &p), "px_alloc_ex, kept");
  check(px_barrier(c, 20000), "px_barrier");
  printf("gpu alloc OK on %d device(s)\n", devices);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: px_gpu_worker alloc\n");
    return 2;
  }
  std::string scenario = argv[1];
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    printf("no CUDA device here: %s\n",
           err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    return 77;
  }
  px_client* c = nullptr;
  check(px_connect(nullptr, &c), "px_connect");
  int rc = 2;
  if (scenario == "alloc")
    rc = alloc(c, devices);
  else
    fprintf(stderr, "px_gpu_worker: unknown scenario %s\n", scenario.c_str());
  check(px_disconnect(c), "px_disconnect");
  return rc;
}
