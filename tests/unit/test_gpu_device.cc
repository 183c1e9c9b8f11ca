// The GPU kernels on a device, against the host path bit for bit. Built with CUDA only; on
// a machine without a device each test says so in a MESSAGE and passes (ctest shows it as
// skipped), unless PX_REQUIRE_GPU=1 (tools/quickstart test --gpu), where that fails it.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sharding/coalesce.h"
#include "tests/unit/gpu_device_check.h"
#include "tests/unit/gpu_test_data.h"
#include "transport/kernels/cuda/device_coalesce.h"
#include "transport/kernels/cuda/device_probe.h"
#include "transport/kernels/cuda/device_reduce.h"

using px::DType;
using px::ReduceOp;
using namespace px::gpu;
using pxt::gpu::Bytes;
using pxt::gpu::have_device;

namespace {

#define CUDA_OK(call)                                                                             \
  do {                                                                                            \
    cudaError_t err_ = (call);                                                                    \
    REQUIRE_MESSAGE(err_ == cudaSuccess, (std::string(#call) + ": " + cudaGetErrorString(err_))); \
  } while (0)

// Device memory owned by the test.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { CUDA_OK(cudaMalloc(&ptr, bytes == 0 ? 1 : bytes)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

struct TestStream {
  cudaStream_t s = nullptr;
  TestStream() { CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(s); }
};

// device_reduce over each source in its own allocation (as IPC-mapped worker buffers are),
// uploads, the reduction and the download all enqueued on one stream, synchronised once.
Bytes device_reduce_of(DType dtype, ReduceOp op, const std::vector<Bytes>& srcs, size_t count,
                       unsigned divisor, bool in_place) {
  TestStream stream;
  size_t bytes = count * px::dtype_size(dtype);
  std::vector<std::unique_ptr<DeviceBuffer>> dev;
  std::vector<const void*> ptrs;
  for (const Bytes& s : srcs) {
    dev.push_back(std::make_unique<DeviceBuffer>(bytes));
    CUDA_OK(cudaMemcpyAsync(dev.back()->ptr, s.data(), bytes, cudaMemcpyHostToDevice, stream.s));
    ptrs.push_back(dev.back()->ptr);
  }
  DeviceBuffer out(bytes);
  DeviceReduceArgs a;
  a.dtype = dtype;
  a.op = op;
  a.srcs = ptrs.data();
  a.nsrc = ptrs.size();
  a.count = count;
  a.dst = in_place ? dev[0]->ptr : out.ptr;
  a.mean_divisor = divisor;
  a.stream = stream.s;
  size_t scratch_bytes = 0;
  std::string why;
  REQUIRE(reduce_scratch_bytes(a, &scratch_bytes, &why));
  DeviceBuffer scratch(scratch_bytes);
  a.scratch = scratch.ptr;
  a.scratch_bytes = scratch_bytes;
  INFO(why);
  REQUIRE(device_reduce(a, &why));
  Bytes result(bytes);
  CUDA_OK(cudaMemcpyAsync(result.data(), a.dst, bytes, cudaMemcpyDeviceToHost, stream.s));
  CUDA_OK(cudaStreamSynchronize(stream.s));
  return result;
}

struct Coalesced {
  std::vector<int64_t> rows;
  std::vector<float> values;
  int64_t first_bad = -2;
};

Coalesced device_coalesce_of(const std::vector<int64_t>& indices, const std::vector<float>& grads,
                             size_t dim, uint64_t row_limit) {
  TestStream stream;
  size_t n = indices.size();
  DeviceBuffer idx(n * 8), g(n * dim * 4), out_idx(n * 8), out_g(n * dim * 4), counts(16);
  CUDA_OK(cudaMemcpyAsync(idx.ptr, indices.data(), n * 8, cudaMemcpyHostToDevice, stream.s));
  CUDA_OK(cudaMemcpyAsync(g.ptr, grads.data(), n * dim * 4, cudaMemcpyHostToDevice, stream.s));
  size_t scratch_bytes = 0;
  std::string why;
  INFO(why);
  REQUIRE(device_coalesce_scratch_bytes(n, row_limit, &scratch_bytes, &why));
  DeviceBuffer scratch(scratch_bytes);
  DeviceCoalesceArgs a;
  a.indices = idx.as<int64_t>();
  a.grads = g.as<float>();
  a.n = n;
  a.dim = dim;
  a.row_limit = row_limit;
  a.out_indices = out_idx.as<int64_t>();
  a.out_grads = out_g.as<float>();
  a.out_unique = counts.as<int64_t>();
  a.out_first_bad = counts.as<int64_t>() + 1;
  a.scratch = scratch.ptr;
  a.scratch_bytes = scratch_bytes;
  a.stream = stream.s;
  REQUIRE(device_coalesce(a, &why));
  int64_t head[2] = {-1, -1};
  CUDA_OK(cudaMemcpyAsync(head, counts.ptr, 16, cudaMemcpyDeviceToHost, stream.s));
  CUDA_OK(cudaStreamSynchronize(stream.s));
  Coalesced c;
  c.first_bad = head[1];
  REQUIRE(head[0] >= 0);
  REQUIRE(static_cast<size_t>(head[0]) <= n);
  c.rows.resize(static_cast<size_t>(head[0]));
  c.values.resize(c.rows.size() * dim);
  CUDA_OK(cudaMemcpy(c.rows.data(), out_idx.ptr, c.rows.size() * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(c.values.data(), out_g.ptr, c.values.size() * 4, cudaMemcpyDeviceToHost));
  return c;
}

}  // namespace

TEST_CASE("device: reduce matches reduce_buffers bit for bit for every dtype x op") {
  if (!have_device()) return;
  std::mt19937_64 rng(23);
  for (uint32_t d = 0; d < px::kDTypeCount; ++d) {
    for (uint32_t o = 0; o < px::kReduceOpCount; ++o) {
      for (size_t nsrc : {1, 2, 3, 8, 33}) {
        for (size_t count : {size_t{1}, size_t{1000}, size_t{(1 << 20) + 3}}) {
          if (nsrc > 8 && count > 1000) continue;  // many sources: the passes, at small sizes
          for (bool in_place : {false, true}) {
            DType dtype = static_cast<DType>(d);
            ReduceOp op = static_cast<ReduceOp>(o);
            CAPTURE(px::dtype_name(dtype));
            CAPTURE(px::reduce_op_name(op));
            CAPTURE(nsrc);
            CAPTURE(count);
            CAPTURE(in_place);
            std::vector<Bytes> srcs = pxt::gpu::make_sources(dtype, nsrc, count, rng);
            unsigned divisor = static_cast<unsigned>(nsrc) * 2;
            Bytes want = pxt::gpu::host_reduce(dtype, op, srcs, count, divisor, in_place);
            Bytes got = device_reduce_of(dtype, op, srcs, count, divisor, in_place);
            CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("device: reduce over 4096 sources matches reduce_buffers bit for bit") {
  if (!have_device()) return;
  std::mt19937_64 rng(4096);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      CAPTURE(px::dtype_name(dtype));
      CAPTURE(px::reduce_op_name(op));
      std::vector<Bytes> srcs = pxt::gpu::make_sources(dtype, kMaxReduceSources, 1000, rng);
      Bytes want = pxt::gpu::host_reduce(dtype, op, srcs, 1000, 4096, false);
      CHECK(device_reduce_of(dtype, op, srcs, 1000, 4096, false) == want);
    }
  }
}

TEST_CASE("device: coalescing matches the host coalescer on a Zipf push of 8192 x 128") {
  if (!have_device()) return;
  for (uint64_t row_limit : {uint64_t{0}, uint64_t{100000}}) {
    CAPTURE(row_limit);
    pxt::gpu::Push p = pxt::gpu::zipf_push(8192, 128, 100000, 1.1, 9);
    p.grads[11 * 128 + 3] = std::numeric_limits<float>::quiet_NaN();
    px::CoalescedRows want;
    px::coalesce({{p.indices.data(), p.indices.size(), p.grads.data()}}, p.dim, false, &want);
    Coalesced got = device_coalesce_of(p.indices, p.grads, p.dim, row_limit);
    CHECK(got.first_bad == -1);
    CHECK(got.rows == want.rows);
    REQUIRE(got.values.size() == want.values.size());
    CHECK(std::memcmp(got.values.data(), want.values.data(), want.values.size() * 4) == 0);
    MESSAGE(p.indices.size() << " entries -> " << want.rows.size() << " unique rows");
  }
}

TEST_CASE("device: coalescing with a bad index is empty and names it, and an empty push is empty") {
  if (!have_device()) return;
  std::vector<int64_t> idx = {3, 1, 3, 10, -1, 2};
  std::vector<float> grads(idx.size() * 4, 1.0f);
  Coalesced bad = device_coalesce_of(idx, grads, 4, 10);
  CHECK(bad.rows.empty());
  CHECK(bad.first_bad == 3);
  Coalesced ok = device_coalesce_of(idx, grads, 4, 0);  // no limit: -1 sorts first
  CHECK(ok.first_bad == -1);
  CHECK(ok.rows == std::vector<int64_t>{-1, 1, 2, 3, 10});
  Coalesced none = device_coalesce_of({}, {}, 4, 10);
  CHECK(none.rows.empty());
  CHECK(none.first_bad == -1);
}
