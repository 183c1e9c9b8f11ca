// The daemon's GPU backend: what parallaxd asks of CUDA and NCCL, behind a plain C++
// interface. The CUDA implementation (cuda_backend.cc) is a plugin, libparallax_gpu.so,
// that links the CUDA runtime and NCCL; parallaxd itself links neither and loads the
// plugin at start (gpu_loader.h), so the same parallaxd runs where CUDA is not installed
// (NCCL's rule for its network plugins, and Open MPI's for its CUDA support).
//
// The plugin is built by the same build as parallaxd (same compiler and standard library),
// so C++ types cross the boundary; kGpuBackendInterface guards against a plugin left from
// another build.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/ipc/shm_layout.h"
#include "transport/kernels/dtype.h"

namespace px::gpu {

// Bumped whenever GpuBackend or the types below change.
constexpr uint32_t kGpuBackendInterface = 9;

// The plugin's one exported symbol: px_gpu_backend_create(interface, &why) returns a new
// backend (deleted by the caller), or null with why.
constexpr const char* kGpuBackendEntry = "px_gpu_backend_create";
class GpuBackend;
using GpuBackendCreateFn = GpuBackend* (*)(uint32_t interface, std::string* why);

struct GpuDevice {
  int ordinal = 0;         // as this process numbers it (CUDA_VISIBLE_DEVICES applies)
  std::string name;        // "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;  // "0000:19:00.0": how processes agree on a device, since their
                           // ordinals differ under different CUDA_VISIBLE_DEVICES
  uint64_t memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
};

// What the node's GPUs are, as the daemon found them at start.
struct GpuInventory {
  std::vector<GpuDevice> devices;
  std::string cuda_runtime;  // "13.0"
  std::string cuda_driver;   // "13.0"; "" without a driver
  std::string nccl;          // "2.28.9"; "" in a build without NCCL
  std::string why_none;      // set when devices is empty: the CUDA runtime's reason
};

// What a worker sends for its memory (cudaIpcMemHandle_t's size), as the protocol has it.
using px::kIpcHandleBytes;

// A worker's device memory mapped into the daemon (cudaIpcOpenMemHandle); the destructor
// has the mapping closed (queued: GpuBackend::after_releases says when it is). The worker
// must not free the memory before it is closed (px_free asks the daemon first).
class DeviceMapping {
 public:
  virtual ~DeviceMapping() = default;
  virtual void* pointer() const = 0;  // valid in the daemon, on device()
  virtual uint64_t bytes() const = 0;
  virtual int device() const = 0;  // the daemon's ordinal of the device
};

// One node's allreduce over its workers' device buffers: inputs reduced into outputs[0]
// with the host path's arithmetic (transport/kernels/cuda/device_reduce.h: f16/bf16 in f32,
// bitwise the host's), then copied to the other outputs. Workers may sit on different GPUs
// of the node (devices): the reduction runs on the first worker's, the others' inputs
// copied there first (peer copies), the result copied back to each.
struct DeviceAllreduce {
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  unsigned mean_divisor = 1;  // kMean: the job's world size
  int device = 0;             // the daemon's ordinal (DeviceMapping::device): devices[0]
  std::vector<const void*> inputs;
  std::vector<void*> outputs;  // outputs[0] may be inputs[0]
  std::vector<int> devices;    // inputs[w] and outputs[w] lie on devices[w]; empty: all on device
  bool fan_out = true;         // false: allreduce_local leaves the result in outputs[0] only
};

// Host memory the GPU copies to and from at full speed (page-locked: cudaHostAlloc); freed
// by the destructor. A cross-node device step stages its node's sum in one for the host
// ring.
class HostStaging {
 public:
  virtual ~HostStaging() = default;
  virtual void* data() const = 0;
  virtual size_t bytes() const = 0;
};

// One worker's sparse push coalesced on its GPU and copied to host: only unique rows cross
// PCIe (transport/kernels/cuda/device_coalesce.h).
struct CoalescedPush {
  std::vector<int64_t> indices;  // unique, ascending
  std::vector<float> rows;       // indices.size() x dim: each index's summed gradients
  int64_t first_bad = -1;        // >= 0: the position of an index outside the table (then
  int64_t bad_index = 0;         // empty), and that index
};

// The bytes of an NCCL unique id (ncclUniqueId), as the cluster protocol carries it.
constexpr size_t kNcclIdBytes = 128;

// An NCCL communicator across the job's nodes, owned by this daemon: one rank per node, on
// the GPU that holds the node's sum. Destroying it frees it with ncclCommAbort, which waits
// for no other rank: a job's end never hangs on another node.
class NcclCommunicator {
 public:
  virtual ~NcclCommunicator() = default;
  virtual int device() const = 0;
  // buffer (count elements, device memory of device()) reduced in place with every other
  // rank's (op: kSum, kMin or kMax; a mean is summed and divided by the caller). Blocks,
  // on the pool, until done, until timeout_ms passed, or until abort(): false with why
  // then, and the communicator is aborted (every later call fails). Calls on one
  // communicator run one at a time, in the order every rank agreed on.
  virtual bool allreduce(void* buffer, size_t count, DType dtype, ReduceOp op, int timeout_ms,
                         std::string* why) = 0;
  // From any thread: an operation under way or to come fails (the job broke).
  virtual void abort() = 0;
};

class GpuBackend {
 public:
  virtual ~GpuBackend() = default;
  virtual const GpuInventory& inventory() const = 0;
  // Maps bytes of a worker's device memory from its IPC handle, on the device with that PCI
  // bus id. Blocks (milliseconds): call it on the pool, not the loop. False with why if the
  // device is not this daemon's, the handle does not open, or the allocation is smaller
  // than bytes.
  virtual bool open_ipc_memory(const std::string& pci_bus_id, const void* handle,
                               size_t handle_bytes, uint64_t bytes,
                               std::unique_ptr<DeviceMapping>* out, std::string* why) = 0;
  // Runs a DeviceAllreduce and waits for it. Blocks: call it on the pool. False with why (a
  // launch or copy failed).
  virtual bool allreduce_local(const DeviceAllreduce& args, std::string* why) = 0;

  // The pieces of a cross-node device allreduce (the host ring through pinned memory);
  // each blocks, so call them on the pool. False with why.
  // Page-locked host memory of bytes, for copies to and from device.
  virtual bool alloc_host(int device, size_t bytes, std::unique_ptr<HostStaging>* out,
                          std::string* why) = 0;
  // The node's reduction, inputs into outputs[0] (args.op is never kMean here: a mean is
  // divided after the sum across nodes), then copied to host (count elements).
  virtual bool reduce_local_to_host(const DeviceAllreduce& args, void* host, std::string* why) = 0;
  // host (count elements, the final result) copied to every output.
  virtual bool copy_from_host(const DeviceAllreduce& args, const void* host, std::string* why) = 0;

  // outputs[0] holds the job's result (summed across nodes over NCCL): a kMean divided by
  // mean_divisor there, as the host path divides it, then copied to every other output.
  virtual bool finish_on_device(const DeviceAllreduce& args, std::string* why) = 0;

  // bytes from `from` to `to`, either of them device memory of device or host memory (the
  // runtime tells which: unified addressing); for broadcasts on device memory. Blocks.
  virtual bool copy(int device, void* to, const void* from, size_t bytes, std::string* why) = 0;

  // Sparse steps on device memory (daemon/sparse/device_rows_step); each blocks, so call
  // them on the pool. False with why.
  virtual bool copy_to_host(int device, void* host, const void* src, size_t bytes,
                            std::string* why) = 0;
  virtual bool copy_to_device(int device, void* dst, const void* host, size_t bytes,
                              std::string* why) = 0;
  // n indices and n x dim gradients (device memory) coalesced on the device, the result
  // copied to out; an index outside [0, row_limit) sets out->first_bad instead.
  virtual bool coalesce_push(int device, const int64_t* indices, const float* grads, size_t n,
                             size_t dim, uint64_t row_limit, CoalescedPush* out,
                             std::string* why) = 0;

  // NCCL across nodes (daemon/dense/nccl_allreduce). A fresh unique id (kNcclIdBytes) for a
  // new communicator, made by the node that will be its rank 0 (it listens for the others
  // until they joined); false with why in a build without NCCL.
  virtual bool nccl_unique_id(std::string* id, std::string* why) = 0;
  // Joins communicator `id` as `rank` of `ranks`, on device. Blocks on the pool until
  // every rank joined, timeout_ms passed, or *abort turned true (the job ended). False with
  // why.
  virtual bool nccl_open(int device, int ranks, int rank, const std::string& id, int timeout_ms,
                         const std::atomic<bool>* abort, std::unique_ptr<NcclCommunicator>* out,
                         std::string* why) = 0;
  // done, on a thread of the backend's, once the mappings and host buffers dropped before
  // this call are given back: a DeviceMapping's or HostStaging's destructor only queues its
  // release (release_thread.h), since it may wait for the device. A backend that releases
  // in its destructors calls done at once.
  virtual void after_releases(std::function<void()> done) { done(); }
};

}  // namespace px::gpu
