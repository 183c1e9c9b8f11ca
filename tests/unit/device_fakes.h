// Fakes for unit tests of the daemon's device steps without a GPU (test_device_allreduce.cc,
// test_device_rows.cc): a worker whose "device memory" is a host-backed region, and a GPU
// backend that does on the host what the plugin does on the device (the host reduction,
// memcpy for the copies, sharding's coalesce() for the CUB coalescing, which it equals bit
// for bit: transport/kernels/cuda/device_coalesce.h).
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
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

// NCCL between the nodes of one test process: communicators opened with one id meet in a
// group; the k-th allreduce of every rank waits for the others' k-th, then each gets the
// sum in rank order. Ranks that issue their calls in different orders (what the cluster's
// ordering of NCCL steps prevents) are caught where the k-th calls differ in size: every
// rank's call fails saying so.
class FakeNccl {
 public:
  struct Group {
    std::mutex mutex;
    std::condition_variable changed;
    int ranks = 0;
    int joined = 0;
    bool aborted = false;
    struct Round {
      size_t count = 0;
      int arrived = 0, left = 0;
      bool mismatch = false;
      std::vector<std::vector<char>> inputs;
    };
    std::map<uint64_t, Round> rounds;  // by call number
  };
  static std::shared_ptr<Group> group(const std::string& id, int ranks) {
    static std::mutex mutex;
    static std::map<std::string, std::weak_ptr<Group>> groups;
    std::lock_guard<std::mutex> lock(mutex);
    auto g = groups[id].lock();
    if (!g) {
      g = std::make_shared<Group>();
      g->ranks = ranks;
      groups[id] = g;
    }
    return g;
  }
};

class FakeCommunicator final : public gpu::NcclCommunicator {
 public:
  FakeCommunicator(std::shared_ptr<FakeNccl::Group> group, int rank, int device)
      : group_(std::move(group)), rank_(rank), device_(device) {}
  int device() const override { return device_; }
  bool allreduce(void* buffer, size_t count, DType dtype, ReduceOp op, int timeout_ms,
                 std::string* why) override {
    FakeNccl::Group& g = *group_;
    size_t bytes = count * dtype_size(dtype);
    std::unique_lock<std::mutex> lock(g.mutex);
    uint64_t call = calls_++;
    auto& round = g.rounds[call];
    if (round.arrived == 0) {
      round.count = count;
      round.inputs.resize(static_cast<size_t>(g.ranks));
    } else if (round.count != count) {
      round.mismatch = true;
    }
    round.inputs[static_cast<size_t>(rank_)].assign(static_cast<char*>(buffer),
                                                    static_cast<char*>(buffer) + bytes);
    ++round.arrived;
    g.changed.notify_all();
    bool met = g.changed.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                  [&] { return g.aborted || round.arrived == g.ranks; });
    if (!met || g.aborted || round.mismatch) {
      g.aborted = true;
      g.changed.notify_all();
      *why = !met             ? "fake ncclAllReduce: timed out"
             : round.mismatch ? "fake ncclAllReduce: the ranks' calls differ (out of order)"
                              : "fake ncclAllReduce: aborted";
      return false;
    }
    std::vector<const void*> inputs;
    for (auto& in : round.inputs) inputs.push_back(in.data());
    reduce_buffers(dtype, op, buffer, inputs.data(), inputs.size(), count, 1);
    if (++round.left == g.ranks) g.rounds.erase(call);
    return true;
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(group_->mutex);
    group_->aborted = true;
    group_->changed.notify_all();
  }

 private:
  std::shared_ptr<FakeNccl::Group> group_;
  int rank_;
  int device_;
  uint64_t calls_ = 0;  // under the group's mutex
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
    {
      // Two nodes of a test may share this backend, their pools calling it at once.
      std::lock_guard<std::mutex> lock(seen_mutex);
      seen = a;
    }
    if (!fail_with.empty()) {
      *why = fail_with;
      return false;
    }
    reduce_buffers(a.dtype, a.op, a.outputs[0], a.inputs.data(), a.inputs.size(), a.count,
                   a.mean_divisor);
    for (size_t w = 1; a.fan_out && w < a.outputs.size(); ++w)
      std::memcpy(a.outputs[w], a.outputs[0], a.count * dtype_size(a.dtype));
    return true;
  }
  bool finish_on_device(const gpu::DeviceAllreduce& a, std::string* why) override {
    if (!fail_finish.empty()) {
      *why = fail_finish;
      return false;
    }
    if (a.op == ReduceOp::kMean) {
      const void* self[1] = {a.outputs[0]};
      reduce_buffers(a.dtype, a.op, a.outputs[0], self, 1, a.count, a.mean_divisor);
    }
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
  bool nccl_unique_id(std::string* id, std::string* why) override {
    if (!nccl) {
      *why = "parallax was built without NCCL";
      return false;
    }
    static std::atomic<int> next{0};
    *id = "fake nccl id " + std::to_string(next++);
    id->resize(gpu::kNcclIdBytes);
    return true;
  }
  bool nccl_open(int device, int ranks, int rank, const std::string& id, int timeout_ms,
                 const std::atomic<bool>* abort, std::unique_ptr<gpu::NcclCommunicator>* out,
                 std::string* why) override {
    ++nccl_opens;
    if (!fail_open.empty()) {
      *why = fail_open;
      return false;
    }
    auto group = FakeNccl::group(id, ranks);
    std::unique_lock<std::mutex> lock(group->mutex);
    ++group->joined;
    group->changed.notify_all();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (group->joined < group->ranks) {  // polled: abort is a flag, nobody notifies it
      if ((abort && abort->load()) || std::chrono::steady_clock::now() > deadline) {
        *why = "fake ncclCommInitRank: the other ranks did not join";
        return false;
      }
      group->changed.wait_for(lock, std::chrono::milliseconds(5));
    }
    *out = std::make_unique<FakeCommunicator>(group, rank, device);
    return true;
  }

  // The backend has NCCL `version` and device 0 at PCI bus id `bus`.
  void with_nccl(const std::string& version, const std::string& bus) {
    nccl = !version.empty();
    inventory_.nccl = version;
    gpu::GpuDevice d;
    d.pci_bus_id = bus;
    inventory_.devices = {d};
  }

  std::mutex seen_mutex;
  gpu::DeviceAllreduce seen;  // the last allreduce_local (read once the steps are done)
  bool nccl = false;          // nccl_unique_id works
  std::string fail_open;      // nccl_open fails with it
  std::atomic<int> nccl_opens{0};
  std::string fail_with;
  std::string fail_finish;  // finish_on_device fails with it
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
