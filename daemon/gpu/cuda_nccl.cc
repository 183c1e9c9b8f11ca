// NCCL communicators for the daemon's cross-node device allreduce. Non-blocking NCCL
// (ncclConfig_t.blocking = 0) throughout, so that no wait is without a deadline: the
// creation and every allreduce are polled (ncclCommGetAsyncError, cudaStreamQuery) until
// done, until their deadline, or until abort(); a communicator that failed is aborted
// (ncclCommAbort), which ends the operations of the other ranks too.
#include "daemon/gpu/cuda_nccl.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "transport/kernels/cuda/cuda_error.h"
#if defined(PX_HAVE_NCCL)
#include <nccl.h>
#endif

namespace px::gpu {

#if defined(PX_HAVE_NCCL)
namespace {

using Clock = std::chrono::steady_clock;

bool nccl_failed(std::string* why, const std::string& what, ncclResult_t r, ncclComm_t comm) {
  *why = what + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) *why += std::string(" (") + last + ")";
  return false;
}

bool nccl_type(DType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DType::kF32:
      *out = ncclFloat32;
      return true;
    case DType::kF64:
      *out = ncclFloat64;
      return true;
    case DType::kF16:
      *out = ncclFloat16;
      return true;
    case DType::kBF16:
      *out = ncclBfloat16;
      return true;
    case DType::kI32:
      *out = ncclInt32;
      return true;
    case DType::kI64:
      *out = ncclInt64;
      return true;
  }
  return false;
}

bool nccl_op(ReduceOp op, ncclRedOp_t* out) {
  switch (op) {
    case ReduceOp::kSum:
      *out = ncclSum;
      return true;
    case ReduceOp::kMin:
      *out = ncclMin;
      return true;
    case ReduceOp::kMax:
      *out = ncclMax;
      return true;
    case ReduceOp::kProd:
      *out = ncclProd;
      return true;
    case ReduceOp::kMean:
      return false;  // summed, then divided by the caller
  }
  return false;
}

// Polls comm until its pending work (creation, an enqueue) settled: ncclSuccess, an error,
// or the deadline / abort, which abort it.
bool settle(ncclComm_t comm, Clock::time_point deadline, const std::atomic<bool>& aborted,
            const char* what, std::string* why) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return nccl_failed(why, what, r, comm);
    if (state == ncclSuccess) return true;
    if (state != ncclInProgress) return nccl_failed(why, what, state, comm);
    if (aborted.load()) {
      *why = std::string(what) + ": aborted (the job ended)";
      return false;
    }
    if (Clock::now() > deadline) {
      *why = std::string(what) + ": not done before its deadline";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class Communicator final : public NcclCommunicator {
 public:
  Communicator(ncclComm_t comm, cudaStream_t stream, int device)
      : comm_(comm), stream_(stream), device_(device) {}
  ~Communicator() override {
    // ncclCommAbort, not ncclCommDestroy: destroying waits until every rank is done with the
    // communicator, which a node whose peer is slow or gone must not.
    cudaSetDevice(device_);
    if (comm_) ncclCommAbort(comm_);
    cudaStreamDestroy(stream_);
  }
  int device() const override { return device_; }

  bool allreduce(void* buffer, size_t count, DType dtype, ReduceOp op, int timeout_ms,
                 std::string* why) override {
    ncclDataType_t type;
    ncclRedOp_t red;
    if (!nccl_type(dtype, &type) || !nccl_op(op, &red)) {
      *why = "nccl allreduce: no NCCL type or operation for it";
      return false;
    }
    if (!comm_ || aborted_.load()) {
      *why = "nccl allreduce: the communicator was aborted (an earlier failure, or the job ended)";
      return false;
    }
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    cudaError_t err = cudaSetDevice(device_);
    if (err != cudaSuccess) return fail(cuda_failed(why, "nccl allreduce: cudaSetDevice", err));
    ncclResult_t r = ncclAllReduce(buffer, buffer, count, type, red, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress)
      return fail(nccl_failed(why, "ncclAllReduce", r, comm_));
    if (!settle(comm_, deadline, aborted_, "ncclAllReduce", why)) return fail(false);
    // Enqueued: wait for the stream, watching for a peer's failure and the deadline.
    for (;;) {
      err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) return true;
      if (err != cudaErrorNotReady)
        return fail(cuda_failed(why, "nccl allreduce: the stream", err));
      // The runtime keeps cudaErrorNotReady as this thread's last error: the next kernel
      // launch checked with cudaGetLastError on this pool thread would fail on it.
      cudaGetLastError();
      if (!settle(comm_, deadline, aborted_, "ncclAllReduce", why)) return fail(false);
      if (Clock::now() > deadline) {
        *why = "ncclAllReduce: not done after " + std::to_string(timeout_ms) + " ms";
        return fail(false);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void abort() override { aborted_.store(true); }

 private:
  // A failed operation leaves the communicator unusable: aborted now (on the one thread
  // that runs its operations), so the other ranks' operations fail instead of waiting.
  bool fail(bool) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    return false;
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

bool cuda_nccl_unique_id(std::string* id, std::string* why) {
  static_assert(sizeof(ncclUniqueId) == kNcclIdBytes);
  ncclUniqueId uid;
  ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) return nccl_failed(why, "ncclGetUniqueId", r, nullptr);
  id->assign(reinterpret_cast<const char*>(&uid), sizeof uid);
  return true;
}

bool cuda_nccl_open(int device, int ranks, int rank, const std::string& id, int timeout_ms,
                    const std::atomic<bool>* abort, std::unique_ptr<NcclCommunicator>* out,
                    std::string* why) {
  if (id.size() != sizeof(ncclUniqueId)) {
    *why = "an NCCL unique id of " + std::to_string(id.size()) + " bytes, not " +
           std::to_string(sizeof(ncclUniqueId));
    return false;
  }
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return cuda_failed(why, "nccl communicator: cudaSetDevice", err);
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return cuda_failed(why, "nccl communicator: cudaStreamCreate", err);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, ranks, uid, rank, &config);
  std::atomic<bool> never{false};
  bool ok = r == ncclSuccess || r == ncclInProgress
                ? settle(comm, deadline, abort ? *abort : never, "ncclCommInitRank", why)
                : nccl_failed(why, "ncclCommInitRank", r, comm);
  if (!ok) {
    *why += " (rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ", device " +
            std::to_string(device) + ")";
    if (comm) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return false;
  }
  *out = std::make_unique<Communicator>(comm, stream, device);
  return true;
}

#else  // without NCCL

namespace {
const char* kNoNccl = "parallax was built without NCCL (not found next to the CUDA toolkit)";
}

bool cuda_nccl_unique_id(std::string*, std::string* why) {
  *why = kNoNccl;
  return false;
}

bool cuda_nccl_open(int, int, int, const std::string&, int, const std::atomic<bool>*,
                    std::unique_ptr<NcclCommunicator>*, std::string* why) {
  *why = kNoNccl;
  return false;
}

#endif

}  // namespace px::gpu
