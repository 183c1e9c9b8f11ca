// Fakes for unit tests of the daemon's device steps without a GPU (test_device_allreduce.cc,
// test_device_rows.cc): a worker whose "device memory" is a host-backed region, and a GPU
// backend that does on the host what the plugin does on the device (the host reduction,
// memcpy for the copies, sharding's coalesce() for the CUB coalescing, which it equals bit
// for bit: transport/kernels/cuda/device_coalesce.h).
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/common/completer.h"
#include "daemon/gpu/gpu_backend.h"
#include "sharding/coalesce.h"
#include "tests/unit/host_device_mapping.h"
#include "tests/unit/scheduler_entries.h"
#include "transport/kernels/reduce.h"

namespace pxtest {

using namespace px;

constexpr uint32_t kRegion = 1;

class DeviceWorker : public Completer {
 public:
  DeviceWorker(int rank, uint64_t region_bytes, int device) : rank_(rank) {
    std::string error;
    REQUIRE(SharedArena::create(1 << 20, 16, &arena_, &error));
    regions_.begin(kRegion);
    mapping_ = std::make_shared<pxtest::HostDeviceMapping>(region_bytes, nullptr, device);
    regions_.finish(kRegion, mapping_);
  }
  void complete(uint64_t request_id, px_status status, const std::string& message) override {
    done.push_back({request_id, status, message});
  }
  std::string label() const override { return "device rank " + std::to_string(rank_); }
  const SharedArena& arena() const override { return arena_; }
  const gpu::DeviceRegions* device_regions() const override { return &regions_; }

  BufferRef device(uint64_t offset, uint64_t bytes) const {
    return BufferRef{offset, bytes, static_cast<uint32_t>(MemoryKind::kCudaDevice), kRegion};
  }
  BufferRef host(uint64_t at, uint64_t bytes) const {
    return BufferRef{arena_.header().heap_offset + at, bytes,
                     static_cast<uint32_t>(MemoryKind::kHostArena), 0};
  }
  float* floats(uint64_t offset) const {
    return reinterpret_cast<float*>(static_cast<char*>(mapping_->pointer()) + offset);
  }
  float* host_floats(uint64_t at) const {
    return reinterpret_cast<float*>(arena_.base() + arena_.header().heap_offset + at);
  }

  std::vector<Completion> done;

 private:
  int rank_;
  SharedArena arena_;
  gpu::DeviceRegions regions_;
  std::shared_ptr<pxtest::HostDeviceMapping> mapping_;
};

class VectorStaging final : public gpu::HostStaging {
 public:
  explicit VectorStaging(size_t bytes) : memory_(bytes) {}
  void* data() const override { return const_cast<char*>(memory_.data()); }
  size_t bytes() const override { return memory_.size(); }

 private:
  std::vector<char> memory_;
};

// The GPU backend on the host: what the plugin does with device_reduce and its copies.
class HostBackend final : public gpu::GpuBackend {
 public:
  const gpu::GpuInventory& inventory() const override { return inventory_; }
  bool open_ipc_memory(const std::string&, const void*, size_t, uint64_t,
                       std::unique_ptr<gpu::DeviceMapping>*, std::string* why) override {
    *why = "not in this test";
    return false;
  }
  bool allreduce_local(const gpu::DeviceAllreduce& a, std::string* why) override {
    seen = a;
    if (!fail_with.empty()) {
      *why = fail_with;
      return false;
    }
    reduce_buffers(a.dtype, a.op, a.outputs[0], a.inputs.data(), a.inputs.size(), a.count,
                   a.mean_divisor);
    for (size_t w = 1; w < a.outputs.size(); ++w)
      std::memcpy(a.outputs[w], a.outputs[0], a.count * dtype_size(a.dtype));
    return true;
  }
  bool alloc_host(int, size_t bytes, std::unique_ptr<gpu::HostStaging>* out,
                  std::string*) override {
    ++allocations;
    *out = std::make_unique<VectorStaging>(bytes);
    return true;
  }
  bool reduce_local_to_host(const gpu::DeviceAllreduce& a, void* host, std::string* why) override {
    if (!allreduce_local(a, why)) return false;
    std::memcpy(host, a.outputs[0], a.count * dtype_size(a.dtype));
    return true;
  }
  bool copy_from_host(const gpu::DeviceAllreduce& a, const void* host, std::string*) override {
    for (void* out : a.outputs) std::memcpy(out, host, a.count * dtype_size(a.dtype));
    return true;
  }
  bool copy(int, void* to, const void* from, size_t bytes, std::string* why) override {
    if (!fail_with.empty()) {
      *why = fail_with;
      return false;
    }
    ++copies;
    std::memcpy(to, from, bytes);
    return true;
  }
  bool copy_to_host(int, void* host, const void* src, size_t bytes, std::string*) override {
    std::memcpy(host, src, bytes);
    return true;
  }
  bool copy_to_device(int, void* dst, const void* host, size_t bytes, std::string* why) override {
    if (!fail_with.empty()) {
      *why = fail_with;
      return false;
    }
    std::memcpy(dst, host, bytes);
    return true;
  }
  bool coalesce_push(int, const int64_t* indices, const float* grads, size_t n, size_t dim,
                     uint64_t row_limit, gpu::CoalescedPush* out, std::string*) override {
    ++coalesced;
    out->first_bad = find_bad_index(indices, n, row_limit);
    if (out->first_bad >= 0) {
      out->bad_index = indices[out->first_bad];
      return true;
    }
    CoalescedRows rows;
    coalesce({RowBatch{indices, n, grads}}, dim, false, &rows);
    out->indices = std::move(rows.rows);
    out->rows = std::move(rows.values);
    return true;
  }
  gpu::DeviceAllreduce seen;
  std::string fail_with;
  std::atomic<int> allocations{0};
  std::atomic<int> coalesced{0};
  std::atomic<int> copies{0};

 private:
  gpu::GpuInventory inventory_;
};

// Whether every worker has heard at least `each` completions.
inline bool all_done(const std::vector<std::shared_ptr<DeviceWorker>>& workers, size_t each) {
  for (const auto& w : workers)
    if (w->done.size() < each) return false;
  return true;
}

}  // namespace pxtest
