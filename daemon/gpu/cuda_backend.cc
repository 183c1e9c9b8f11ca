// libparallax_gpu.so: the GPU backend over the CUDA runtime and NCCL (gpu_backend.h).
// Loaded by parallaxd at start; its one exported symbol is px_gpu_backend_create.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "daemon/gpu/cuda_nccl.h"
#include "daemon/gpu/gpu_backend.h"
#include "daemon/gpu/release_thread.h"
#include "transport/kernels/cuda/cuda_error.h"
#include "transport/kernels/cuda/device_coalesce.h"
#include "transport/kernels/cuda/device_probe.h"
#include "transport/kernels/cuda/device_reduce.h"

namespace px::gpu {
namespace {

// "13.0" from CUDA's 13000.
std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// The driver's cuMemGetAddressRange (v2), fetched through the runtime so the plugin never
// links the driver: the size of the allocation an IPC handle opened, to check the worker's
// claim before the daemon writes into it.
using MemGetAddressRangeFn = int (*)(unsigned long long* base, size_t* size,
                                     unsigned long long ptr);

MemGetAddressRangeFn mem_get_address_range() {
  static MemGetAddressRangeFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<MemGetAddressRangeFn>(p);
  }();
  return fn;
}

class IpcMapping final : public DeviceMapping {
 public:
  IpcMapping(void* pointer, uint64_t bytes, int device, std::shared_ptr<ReleaseThread> releases)
      : pointer_(pointer), bytes_(bytes), device_(device), releases_(std::move(releases)) {}
  ~IpcMapping() override {
    releases_->queue([pointer = pointer_, device = device_] {
      // The release thread's current device may be another: set the mapping's.
      if (cudaSetDevice(device) != cudaSuccess || cudaIpcCloseMemHandle(pointer) != cudaSuccess)
        cudaGetLastError();
    });
  }
  void* pointer() const override { return pointer_; }
  uint64_t bytes() const override { return bytes_; }
  int device() const override { return device_; }

 private:
  void* pointer_;
  uint64_t bytes_;
  int device_;
  std::shared_ptr<ReleaseThread> releases_;
};

class PinnedHost final : public HostStaging {
 public:
  PinnedHost(void* data, size_t bytes, std::shared_ptr<ReleaseThread> releases)
      : data_(data), bytes_(bytes), releases_(std::move(releases)) {}
  ~PinnedHost() override {
    releases_->queue([data = data_] {
      if (cudaFreeHost(data) != cudaSuccess) cudaGetLastError();
    });
  }
  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
  std::shared_ptr<ReleaseThread> releases_;
};

class CudaBackend final : public GpuBackend {
 public:
  CudaBackend() {
    inventory_ = take_inventory();
    if (!inventory_.devices.empty()) releases_ = std::make_shared<ReleaseThread>();
  }
  const GpuInventory& inventory() const override { return inventory_; }

  bool open_ipc_memory(const std::string& pci_bus_id, const void* handle, size_t handle_bytes,
                       uint64_t bytes, std::unique_ptr<DeviceMapping>* out,
                       std::string* why) override {
    // DeviceRegions::check refused other sizes already; the copy below must not rely on it.
    static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
    if (handle_bytes != kIpcHandleBytes) {
      *why = "an IPC handle of " + std::to_string(handle_bytes) + " bytes, not " +
             std::to_string(kIpcHandleBytes);
      return false;
    }
    int device = -1;
    for (const GpuDevice& d : inventory_.devices)
      if (d.pci_bus_id == pci_bus_id) device = d.ordinal;
    if (device < 0) {
      *why = "device " + pci_bus_id + " is not one of this daemon's (" + bus_ids() + ")";
      return false;
    }
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) return cuda_failed(why, "cudaSetDevice", err);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle, sizeof h);
    void* pointer = nullptr;
    err = cudaIpcOpenMemHandle(&pointer, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) return cuda_failed(why, "cudaIpcOpenMemHandle", err);
    auto mapping = std::make_unique<IpcMapping>(pointer, bytes, device, releases_);
    MemGetAddressRangeFn range = mem_get_address_range();
    unsigned long long base = 0;
    size_t size = 0;
    if (!range || range(&base, &size, reinterpret_cast<unsigned long long>(pointer)) != 0) {
      *why = "cannot ask the driver the mapped allocation's size (cuMemGetAddressRange)";
      return false;
    }
    // Exactly the worker's allocation: where the driver carved it out of a larger block
    // (under 2 MiB: libparallax rounds its allocations up to avoid that), the handle may
    // open the block, and the pointer would not be the worker's buffer.
    if (base != reinterpret_cast<unsigned long long>(pointer) || size < bytes) {
      *why = "the handle opens an allocation of " + std::to_string(size) +
             " bytes at another address or smaller than the " + std::to_string(bytes) +
             " announced";
      return false;
    }
    *out = std::move(mapping);
    return true;
  }

 private:
  static GpuInventory take_inventory() {
    GpuInventory inv;
    int version = 0;
    if (cudaRuntimeGetVersion(&version) == cudaSuccess)
      inv.cuda_runtime = cuda_version_text(version);
    if (cudaDriverGetVersion(&version) == cudaSuccess && version > 0)
      inv.cuda_driver = cuda_version_text(version);
    std::string why;
    inv.nccl = nccl_version(&why);
    int count = cuda_device_count(&inv.why_none);
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp prop{};
      cudaError_t err = cudaGetDeviceProperties(&prop, d);
      char bus[32] = {0};
      if (err == cudaSuccess) err = cudaDeviceGetPCIBusId(bus, sizeof bus, d);
      if (err != cudaSuccess) {
        // A device the runtime counts but cannot describe is not one to hand buffers to.
        cuda_failed(&inv.why_none, ("device " + std::to_string(d)).c_str(), err);
        inv.devices.clear();
        break;
      }
      GpuDevice dev;
      dev.ordinal = d;
      dev.name = prop.name;
      dev.pci_bus_id = bus;
      dev.memory_bytes = prop.totalGlobalMem;
      dev.compute_major = prop.major;
      dev.compute_minor = prop.minor;
      inv.devices.push_back(dev);
    }
    if (!inv.devices.empty()) inv.why_none.clear();
    return inv;
  }

  bool allreduce_local(const DeviceAllreduce& a, std::string* why) override {
    cudaStream_t stream = nullptr;
    if (!begin(a, "gpu allreduce", &stream, why)) return false;
    bool ok = reduce_into_first(a, stream, why) &&
              (!a.fan_out || fan_out(a, stream, "gpu allreduce: copy to a worker", why));
    return finished(stream, ok, "gpu allreduce", why);
  }

  bool finish_on_device(const DeviceAllreduce& a, std::string* why) override {
    cudaStream_t stream = nullptr;
    if (!begin(a, "gpu finish", &stream, why)) return false;
    bool ok = true;
    if (a.op == ReduceOp::kMean) {  // outputs[0] divided in place: one input, itself
      DeviceAllreduce self = a;
      self.inputs = {a.outputs[0]};
      self.outputs = {a.outputs[0]};
      self.devices.clear();
      ok = reduce_into_first(self, stream, why);
    }
    ok = ok && fan_out(a, stream, "gpu finish: copy to a worker", why);
    return finished(stream, ok, "gpu finish", why);
  }

  bool alloc_host(int device, size_t bytes, std::unique_ptr<HostStaging>* out,
                  std::string* why) override {
    void* p = nullptr;
    // On the step's device (a context on another would be made otherwise); portable: any
    // pool thread's copies, whatever its current device, run at full speed.
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) return cuda_failed(why, "pinned staging: cudaSetDevice", err);
    err = cudaHostAlloc(&p, bytes > 0 ? bytes : 1, cudaHostAllocPortable);
    if (err != cudaSuccess) return cuda_failed(why, "pinned staging (cudaHostAlloc)", err);
    *out = std::make_unique<PinnedHost>(p, bytes, releases_);
    return true;
  }

  bool reduce_local_to_host(const DeviceAllreduce& a, void* host, std::string* why) override {
    cudaStream_t stream = nullptr;
    if (!begin(a, "gpu reduce to host", &stream, why)) return false;
    bool ok = reduce_into_first(a, stream, why) &&
              copied(cudaMemcpyAsync(host, a.outputs[0], a.count * dtype_size(a.dtype),
                                     cudaMemcpyDeviceToHost, stream),
                     "gpu reduce to host: copy", why);
    return finished(stream, ok, "gpu reduce to host", why);
  }

  bool copy_from_host(const DeviceAllreduce& a, const void* host, std::string* why) override {
    cudaStream_t stream = nullptr;
    if (!begin(a, "gpu copy from host", &stream, why)) return false;
    size_t bytes = a.count * dtype_size(a.dtype);
    // Across PCIe once, then device to device to the other workers.
    bool ok = copied(cudaMemcpyAsync(a.outputs[0], host, bytes, cudaMemcpyHostToDevice, stream),
                     "gpu copy from host", why) &&
              fan_out(a, stream, "gpu copy from host: copy to a worker", why);
    return finished(stream, ok, "gpu copy from host", why);
  }

  bool copy(int device, void* to, const void* from, size_t bytes, std::string* why) override {
    cudaStream_t stream = nullptr;
    if (!stream_on(device, "gpu copy", &stream, why)) return false;
    // Between two GPUs' memory (workers on different GPUs): a peer copy, as the allreduce's.
    int to_device = device_holding(to), from_device = device_holding(from);
    bool peer = to_device >= 0 && from_device >= 0 && to_device != from_device;
    bool ok = copied(peer ? cudaMemcpyPeerAsync(to, to_device, from, from_device, bytes, stream)
                          : cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream),
                     "gpu copy", why);
    return finished(stream, ok, "gpu copy", why);
  }

  // The device whose memory p is, or -1 (host memory, pinned or not).
  static int device_holding(const void* p) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return attributes.type == cudaMemoryTypeDevice ? attributes.device : -1;
  }

  bool copy_to_host(int device, void* host, const void* src, size_t bytes,
                    std::string* why) override {
    cudaStream_t stream = nullptr;
    if (!stream_on(device, "gpu copy to host", &stream, why)) return false;
    bool ok = copied(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream),
                     "gpu copy to host", why);
    return finished(stream, ok, "gpu copy to host", why);
  }

  bool copy_to_device(int device, void* dst, const void* host, size_t bytes,
                      std::string* why) override {
    cudaStream_t stream = nullptr;
    if (!stream_on(device, "gpu copy to device", &stream, why)) return false;
    bool ok = copied(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream),
                     "gpu copy to device", why);
    return finished(stream, ok, "gpu copy to device", why);
  }

  bool coalesce_push(int device, const int64_t* indices, const float* grads, size_t n, size_t dim,
                     uint64_t row_limit, CoalescedPush* out, std::string* why) override {
    out->indices.clear();
    out->rows.clear();
    out->first_bad = -1;
    if (n == 0) return true;
    cudaStream_t stream = nullptr;
    if (!stream_on(device, "gpu coalescing", &stream, why)) return false;
    DeviceCoalesceArgs a;
    a.indices = indices;
    a.grads = grads;
    a.n = n;
    a.dim = dim;
    a.row_limit = row_limit;
    a.stream = stream;
    if (!device_coalesce_scratch_bytes(n, row_limit, &a.scratch_bytes, why)) return false;
    // One allocation: the unique indices, their rows, the two counters, CUB's scratch.
    size_t index_bytes = (n * sizeof(int64_t) + 255) / 256 * 256;
    size_t row_bytes = (n * dim * sizeof(float) + 255) / 256 * 256;
    void* block = nullptr;
    cudaError_t err =
        cudaMallocAsync(&block, index_bytes + row_bytes + 256 + a.scratch_bytes, stream);
    if (err != cudaSuccess) return cuda_failed(why, "gpu coalescing: device memory", err);
    char* at = static_cast<char*>(block);
    a.out_indices = reinterpret_cast<int64_t*>(at);
    a.out_grads = reinterpret_cast<float*>(at + index_bytes);
    a.out_unique = reinterpret_cast<int64_t*>(at + index_bytes + row_bytes);
    a.out_first_bad = a.out_unique + 1;
    a.scratch = at + index_bytes + row_bytes + 256;
    int64_t counts[2] = {0, -1};
    bool ok =
        device_coalesce(a, why) &&
        copied(cudaMemcpyAsync(counts, a.out_unique, sizeof counts, cudaMemcpyDeviceToHost, stream),
               "gpu coalescing: copy the counts", why) &&
        finished(stream, true, "gpu coalescing", why);
    if (ok && counts[1] >= 0) {
      out->first_bad = counts[1];
      ok = copied(cudaMemcpyAsync(&out->bad_index, indices + counts[1], sizeof(int64_t),
                                  cudaMemcpyDeviceToHost, stream),
                  "gpu coalescing: copy the bad index", why);
    } else if (ok) {
      auto unique = static_cast<size_t>(counts[0]);
      out->indices.resize(unique);
      out->rows.resize(unique * dim);
      ok = copied(cudaMemcpyAsync(out->indices.data(), a.out_indices, unique * sizeof(int64_t),
                                  cudaMemcpyDeviceToHost, stream),
                  "gpu coalescing: copy the indices", why) &&
           copied(cudaMemcpyAsync(out->rows.data(), a.out_grads, unique * dim * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream),
                  "gpu coalescing: copy the rows", why);
    }
    cudaFreeAsync(block, stream);
    return finished(stream, ok, "gpu coalescing", why);
  }

  void after_releases(std::function<void()> done) override {
    if (releases_)
      releases_->queue(std::move(done));  // in order: after those
    else
      done();
  }

  bool nccl_unique_id(std::string* id, std::string* why) override {
    return cuda_nccl_unique_id(id, why);
  }
  bool nccl_open(int device, int ranks, int rank, const std::string& id, int timeout_ms,
                 const std::atomic<bool>* abort, std::unique_ptr<NcclCommunicator>* out,
                 std::string* why) override {
    return cuda_nccl_open(device, ranks, rank, id, timeout_ms, abort, out, why);
  }

  // The calling pool thread's stream on device, made current.
  static bool stream_on(int device, const char* what, cudaStream_t* stream, std::string* why) {
    DeviceAllreduce a;
    a.device = device;
    a.inputs.push_back(nullptr);
    a.outputs.push_back(nullptr);
    return begin(a, what, stream, why);
  }

  // Checks a's shape and sets up the calling pool thread: a's device current, and its own
  // stream on that device (the pool's threads never share one).
  static bool begin(const DeviceAllreduce& a, const char* what, cudaStream_t* stream,
                    std::string* why) {
    if (a.inputs.empty() || a.inputs.size() != a.outputs.size()) {
      *why = std::string(what) + ": " + std::to_string(a.inputs.size()) + " inputs and " +
             std::to_string(a.outputs.size()) + " outputs";
      return false;
    }
    cudaError_t err = cudaSetDevice(a.device);
    if (err != cudaSuccess)
      return cuda_failed(why, (std::string(what) + ": cudaSetDevice").c_str(), err);
    thread_local std::vector<cudaStream_t> streams;
    if (streams.size() <= static_cast<size_t>(a.device)) streams.resize(a.device + 1, nullptr);
    cudaStream_t& s = streams[a.device];
    if (!s && (err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
      return cuda_failed(why, (std::string(what) + ": cudaStreamCreate").c_str(), err);
    *stream = s;
    return true;
  }

  // The inputs reduced into outputs[0] on stream (queued, not waited for).
  // The device of worker w's buffers.
  static int device_of(const DeviceAllreduce& a, size_t w) {
    return a.devices.empty() ? a.device : a.devices[w];
  }

  // The inputs reduced into outputs[0] on stream (queued, not waited for). Inputs on other
  // devices are copied next to it first (cudaMemcpyPeerAsync: with or without peer access),
  // a slice at a time, so the room they take stays bounded (kGatherSliceBytes each).
  static bool reduce_into_first(const DeviceAllreduce& a, cudaStream_t stream, std::string* why) {
    constexpr size_t kGatherSliceBytes = 64 << 20;
    size_t elem = dtype_size(a.dtype);
    size_t remote = 0;
    for (size_t w = 0; w < a.inputs.size(); ++w) remote += device_of(a, w) != a.device;
    size_t slice = remote > 0 ? std::max<size_t>(1, kGatherSliceBytes / elem) : a.count;
    slice = std::min(slice, std::max<size_t>(a.count, 1));
    std::vector<const void*> sources(a.inputs.size());
    DeviceReduceArgs r;
    r.dtype = a.dtype;
    r.op = a.op;
    r.srcs = sources.data();
    r.nsrc = sources.size();
    r.count = slice;
    r.mean_divisor = a.mean_divisor;
    r.stream = stream;
    size_t scratch_bytes = 0;
    if (!reduce_scratch_bytes(r, &scratch_bytes, why)) return false;
    void* scratch = nullptr;
    void* gathered = nullptr;
    cudaError_t err;
    bool ok = true;
    if (scratch_bytes > 0 &&
        (err = cudaMallocAsync(&scratch, scratch_bytes, stream)) != cudaSuccess)
      ok = cuda_failed(why, "gpu reduce: scratch", err);
    if (ok && remote > 0) {
      for (size_t w = 0; w < a.inputs.size(); ++w)
        if (device_of(a, w) != a.device) grant_pool_access(a.device, device_of(a, w));
      if ((err = cudaMallocAsync(&gathered, remote * slice * elem, stream)) != cudaSuccess)
        ok = cuda_failed(why, "gpu reduce: room for other GPUs' inputs", err);
    }
    for (size_t begin = 0; ok && begin < a.count; begin += slice) {
      size_t len = std::min(slice, a.count - begin);
      for (size_t w = 0, at = 0; ok && w < a.inputs.size(); ++w) {
        const char* from = static_cast<const char*>(a.inputs[w]) + begin * elem;
        if (device_of(a, w) == a.device) {
          sources[w] = from;
          continue;
        }
        void* here = static_cast<char*>(gathered) + at++ * slice * elem;
        ok = copied(cudaMemcpyPeerAsync(here, a.device, from, device_of(a, w), len * elem, stream),
                    "gpu reduce: copy from another GPU", why);
        sources[w] = here;
      }
      r.dst = static_cast<char*>(a.outputs[0]) + begin * elem;
      r.count = len;
      r.scratch = scratch;
      r.scratch_bytes = scratch_bytes;
      ok = ok && device_reduce(r, why);
    }
    if (scratch) cudaFreeAsync(scratch, stream);
    if (gathered) cudaFreeAsync(gathered, stream);
    return ok;
  }

  // Memory from a device's pool (cudaMallocAsync) is reachable from that device only, peer
  // access or not, until the pool grants it (cudaMemPoolSetAccess); the room for other GPUs'
  // inputs is written by peer copies the driver may run from their side. Once per pair;
  // where the GPUs have no peer access the copy goes through the host and needs no grant.
  static void grant_pool_access(int pool_device, int peer) {
    static std::mutex mutex;
    static std::set<std::pair<int, int>> granted;
    std::lock_guard<std::mutex> lock(mutex);
    if (!granted.insert({pool_device, peer}).second) return;
    int can = 0;
    cudaMemPool_t pool = nullptr;
    cudaMemAccessDesc access{};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = peer;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    if (cudaDeviceCanAccessPeer(&can, peer, pool_device) != cudaSuccess || !can ||
        cudaDeviceGetMemPool(&pool, pool_device) != cudaSuccess ||
        cudaMemPoolSetAccess(pool, &access, 1) != cudaSuccess)
      cudaGetLastError();  // no grant: a copy the driver then cannot run fails with why
  }

  // outputs[0] (on a.device) copied to every other output, on whichever GPU it is.
  static bool fan_out(const DeviceAllreduce& a, cudaStream_t stream, const char* what,
                      std::string* why) {
    size_t bytes = a.count * dtype_size(a.dtype);
    bool ok = true;
    for (size_t w = 1; ok && w < a.outputs.size(); ++w)
      ok = copied(
          device_of(a, w) == a.device
              ? cudaMemcpyAsync(a.outputs[w], a.outputs[0], bytes, cudaMemcpyDeviceToDevice, stream)
              : cudaMemcpyPeerAsync(a.outputs[w], device_of(a, w), a.outputs[0], a.device, bytes,
                                    stream),
          what, why);
    return ok;
  }

  static bool copied(cudaError_t err, const char* what, std::string* why) {
    return err == cudaSuccess || cuda_failed(why, what, err);
  }

  // Waits for stream, here on the pool thread: the completion the workers see means the
  // results are in their memory.
  static bool finished(cudaStream_t stream, bool ok, const char* what, std::string* why) {
    cudaError_t err = cudaStreamSynchronize(stream);
    if (ok && err != cudaSuccess) ok = cuda_failed(why, what, err);
    // Whatever is left (a failed step's synchronize, an unchecked cudaFreeAsync) would be
    // reported by the next launch check on this pool thread as that step's failure.
    cudaGetLastError();
    return ok;
  }

  std::string bus_ids() const {
    std::string text;
    for (const GpuDevice& d : inventory_.devices) text += (text.empty() ? "" : ", ") + d.pci_bus_id;
    return text.empty() ? "none" : text;
  }

  GpuInventory inventory_;
  // With a device: mappings are closed and pinned buffers freed there, never by their last
  // owner (the loop, or a pool thread NCCL work needs), since either may wait for the device.
  std::shared_ptr<ReleaseThread> releases_;
};

}  // namespace
}  // namespace px::gpu

extern "C" __attribute__((visibility("default"))) px::gpu::GpuBackend* px_gpu_backend_create(
    uint32_t interface, std::string* why) {
  if (interface != px::gpu::kGpuBackendInterface) {
    *why = "interface " + std::to_string(interface) + " asked, this plugin has " +
           std::to_string(px::gpu::kGpuBackendInterface) + " (a plugin from another build)";
    return nullptr;
  }
  return new px::gpu::CudaBackend();
}
