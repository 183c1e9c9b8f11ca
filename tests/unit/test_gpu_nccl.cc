// The plugin's NCCL communicators (daemon/gpu/cuda_nccl.cc). Everywhere CUDA and NCCL are
// built ("host: ..."): a unique id is made without a GPU (ncclGetUniqueId only opens NCCL's
// bootstrap listener), and opening a communicator fails clearly, within its deadline, with
// a bad id or without a device. On a device ("device: ..."): a communicator of one rank
// reduces in place, and an aborted one refuses its next call. (Two ranks need two GPUs:
// NCCL takes one rank per GPU.)
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "daemon/gpu/cuda_nccl.h"
#include "tests/unit/gpu_device_check.h"
#include "transport/kernels/cuda/device_probe.h"

using namespace px;
using namespace px::gpu;
using pxt::gpu::have_device;

TEST_CASE("host: nccl: a unique id is made without a GPU, or the build says it has no NCCL") {
  std::string id, why;
  bool ok = cuda_nccl_unique_id(&id, &why);
  std::string no_version_why;
  if (nccl_version(&no_version_why).empty()) {
    CHECK_FALSE(ok);
    CHECK(why.find("without NCCL") != std::string::npos);
    return;
  }
  INFO(why);
  REQUIRE(ok);
  CHECK(id.size() == kNcclIdBytes);
  std::string other;
  REQUIRE(cuda_nccl_unique_id(&other, &why));
  CHECK(other != id);
}

TEST_CASE("host: nccl: opening a communicator fails clearly with a bad id or without a device") {
  std::unique_ptr<NcclCommunicator> comm;
  std::string why;
  CHECK_FALSE(cuda_nccl_open(0, 2, 0, "short", 1000, nullptr, &comm, &why));
  CHECK(why.find("an NCCL unique id of 5 bytes") != std::string::npos);
  std::string none;
  if (cuda_device_count(&none) > 0) return;  // the rest is about a machine without one
  std::string id;
  if (!cuda_nccl_unique_id(&id, &why)) return;  // built without NCCL: said above
  auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(cuda_nccl_open(0, 2, 0, id, 2000, nullptr, &comm, &why));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  CHECK(why.find("cudaSetDevice") != std::string::npos);
  CHECK_FALSE(comm);
}

TEST_CASE("device: nccl: a communicator of one rank reduces in place; aborted, it refuses") {
  if (!have_device()) return;
  std::string id, why;
  REQUIRE_MESSAGE(cuda_nccl_unique_id(&id, &why), why);
  std::unique_ptr<NcclCommunicator> comm;
  REQUIRE_MESSAGE(cuda_nccl_open(0, 1, 0, id, 30000, nullptr, &comm, &why), why);
  CHECK(comm->device() == 0);
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  void* buffer = nullptr;
  REQUIRE(cudaMalloc(&buffer, host.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(buffer, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    INFO(why);
    CHECK(comm->allreduce(buffer, host.size(), DType::kF32, ReduceOp(op), 10000, &why));
  }
  std::vector<float> back(host.size());
  REQUIRE(cudaMemcpy(back.data(), buffer, back.size() * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  CHECK(back == host);  // one rank: every reduction is the identity
  CHECK_FALSE(comm->allreduce(buffer, host.size(), DType::kF32, ReduceOp::kMean, 10000, &why));
  CHECK(why.find("no NCCL type or operation") != std::string::npos);
  comm->abort();
  CHECK_FALSE(comm->allreduce(buffer, host.size(), DType::kF32, ReduceOp::kSum, 10000, &why));
  CHECK(why.find("aborted") != std::string::npos);
  comm.reset();
  cudaFree(buffer);
}
