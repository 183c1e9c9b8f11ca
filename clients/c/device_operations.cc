// libparallax: operations on device memory (px_allreduce_ex, and px_pull_rows_ex and
// px_push_rows_ex, with PX_MEMORY_CUDA), ordered on the caller's CUDA stream as NCCL's are.
//
// The call numbers the step and returns a request at once; the entry is handed to the
// daemon by a host function queued on the stream (cudaLaunchHostFunc), so the daemon reads
// the buffers only after the work queued before the call, and the same host function waits
// until the daemon completes the step, so work queued after the call sees the result. The
// usual px_wait works too. Ordering through the stream's host-function thread means steps
// queued on one stream run one after another (as NCCL's on one stream do), and that the
// stream waits on the host for each step: a CUDA event recorded by the daemon, or a
// stream wait on a flag in shared memory, would let the GPU wait without the host. Not
// built (README, Limits).
//
// Device memory outside px_alloc_ex (a framework's own allocations: PyTorch's caching
// allocator sub-allocates, so its tensors cannot be handed over by IPC one by one) goes
// through a px_alloc_ex allocation of the variable's: copied in on the stream before the
// host function, copied back after it, as ordinary host memory is staged in the arena.
#include <atomic>
#include <cstring>
#include <iterator>
#include <memory>
#include <tuple>

#include "clients/c/client_internal.h"
#include "clients/c/cuda_runtime.h"
#include "clients/c/requests_internal.h"

using px::fail;

namespace px {
namespace {

// What the host function needs: the client and request stay alive until it has run.
struct DeferredSubmit {
  std::shared_ptr<Client> client;
  std::shared_ptr<Request> request;
  Var* var = nullptr;  // lives as long as the client
  SubmitEntry entry{};
};

// Runs on the CUDA runtime's host-function thread once the stream reaches the operation:
// submits it and waits for its completion, bounded by the daemon's own deadlines (a step a
// worker never submits fails after timeouts.step_stall_ms; a lost daemon fails everything).
void submit_when_stream_reaches(void* data) {
  std::unique_ptr<DeferredSubmit> d(static_cast<DeferredSubmit*>(data));
  Client* c = d->client.get();
  Request* r = d->request.get();
  std::unique_lock<std::mutex> lock(c->mutex);
  --c->deferred_submits;
  --d->var->deferred_device_steps;
  px_status status = PX_OK;
  if (c->closed) {
    finish_request(c, r, PX_ERR_CANCELLED, r->describe() + ": px_disconnect came first");
    return;
  }
  if (c->lost_status != PX_OK) {
    finish_request(c, r, c->lost_status, c->lost_message);
    return;
  }
  // Every worker must submit every step (others wait for it), even one freed meanwhile.
  if ((status = submit(c, d->entry, r)) != PX_OK) {
    finish_request(c, r, status, r->describe() + ": " + px_last_error());
    return;
  }
  // Until the step is complete, even if the request was freed meanwhile: work queued after
  // the call may read out. Only a closed client or a lost daemon end the wait sooner.
  for (;;) {
    drain_completions(c);
    if (r->daemon_done || c->closed) return;
    if (c->lost_status != PX_OK) {
      mark_lost(c, c->lost_message);
      continue;
    }
    wait_for_completions(c, lock, -1);
  }
}

// The request's copy back is over (ran, or will not run): done if the daemon's step is.
// Caller holds c->mutex.
void end_copy_back(Client* c, Request* r) {
  r->copy_back_pending = false;
  if (!r->daemon_done || r->done) return;
  r->done = true;
  if (r->freed) destroy_request(c, r);
  // Wake whoever waits: threads on `changed`, the thread polling the doorbell, an fd loop.
  c->changed.notify_all();
  if (c->poller_active) c->completion_bell.ring();
  if (c->epoll_fd >= 0) c->user_bell.ring();
}

// Runs on the host-function thread once the stream has copied a staged result back into
// the caller's memory: only now is the request done for px_wait and px_test.
void copy_back_done(void* data) {
  std::unique_ptr<DeferredSubmit> d(static_cast<DeferredSubmit*>(data));
  Client* c = d->client.get();
  std::lock_guard<std::mutex> lock(c->mutex);
  end_copy_back(c, d->request.get());
}

// The px_alloc_ex allocation holding [p, p + bytes): its pointer and region; false if none.
bool find_region(const Client* c, const void* p, uint64_t bytes, uintptr_t* base,
                 DeviceRegion* region) {
  auto at = reinterpret_cast<uintptr_t>(p);
  auto it = c->device_regions.upper_bound(at);
  if (it == c->device_regions.begin()) return false;
  --it;
  if (at - it->first > it->second.bytes || bytes > it->second.bytes - (at - it->first))
    return false;
  *base = it->first;
  *region = it->second;
  return true;
}

// Whether p is the start of device memory outside every px_alloc_ex allocation, and on
// which device; "" if p is inside one (or is device memory) else what is wrong.
std::string outside_allocation(const Client* c, const void* p, uint64_t bytes, int* device) {
  uintptr_t base;
  DeviceRegion region;
  *device = -1;
  if (find_region(c, p, bytes, &base, &region)) return "";
  if (c->device_regions.size() > 0) {
    // Starting inside an allocation and running past its end is a mistake, not other memory.
    auto at = reinterpret_cast<uintptr_t>(p);
    auto it = c->device_regions.upper_bound(at);
    if (it != c->device_regions.begin() && at - std::prev(it)->first < std::prev(it)->second.bytes)
      return "runs past the end of its px_alloc_ex allocation";
  }
  *device = cuda_pointer_device(p);
  if (*device < 0) return "is not CUDA device memory (host or managed memory as PX_MEMORY_CUDA?)";
  if (!cuda_range_in_one_allocation(p, bytes))
    return "runs past the end of its device allocation (cuMemGetAddressRange)";
  return "";
}

// The variable's staging allocation on device (made on first use); PX_OK with *staging set.
// Caller holds neither lock.
px_status staging_for(Client* c, Var* var, const std::string& who, int device, void* stream,
                      void** staging) {
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    // A step's copy back leaves the staging allocation only when its stream gets there: a
    // step on another stream could overwrite it first (no event orders the two streams).
    if (var->device_staging && var->device_staging_stream != stream)
      return fail(c, PX_ERR_INVALID,
                  who +
                      ": device memory outside px_alloc_ex on another CUDA stream than the "
                      "variable's earlier such steps (one stream per variable: they share its "
                      "staging allocation)");
    if (var->device_staging && var->device_staging_device != device)
      return fail(c, PX_ERR_INVALID,
                  who + ": device memory outside px_alloc_ex on device " + std::to_string(device) +
                      ", where the variable's earlier such steps used device " +
                      std::to_string(var->device_staging_device) + " (one device per variable)");
    if ((*staging = var->device_staging)) return PX_OK;
  }
  void* fresh = nullptr;
  px_status status = alloc_device_memory(c, var->bytes, device, &fresh);
  if (status != PX_OK)
    return fail(
        c, status,
        who + ": the staging allocation for memory outside px_alloc_ex: " + px_last_error());
  bool raced;
  bool fits = true;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    raced = var->device_staging != nullptr;  // another thread's step of the variable won
    if (!raced) {
      var->device_staging = fresh;
      var->device_staging_device = device;
      var->device_staging_stream = stream;
    }
    // The winner's allocation serves only its device and stream (see above).
    fits = var->device_staging_device == device && var->device_staging_stream == stream;
    *staging = var->device_staging;
  }
  if (raced) free_device_memory(c, fresh, &status);
  if (!fits)
    return fail(c, PX_ERR_INVALID,
                who +
                    ": device memory outside px_alloc_ex on another device or CUDA stream than "
                    "a concurrent step of the variable (one device and stream per variable)");
  return PX_OK;
}

}  // namespace

namespace {

// One operation on device memory: allreduce (in and out of the variable's size, equal or
// disjoint) or a sparse pull or push step (in: n indices, out: n rows; a push reads out).
struct DeviceOp {
  Opcode opcode = Opcode::kAllreduce;
  const char* what = "allreduce";
  const void* in = nullptr;
  uint64_t in_bytes = 0;
  void* out = nullptr;
  uint64_t out_bytes = 0;
  uint64_t* next_step = nullptr;  // the variable's step counter for opcode; null: not a step
  bool stage_outside = false;     // memory outside px_alloc_ex goes through staging (dense)
  bool daemon_writes_out = true;
  uint32_t root = 0;  // broadcast: the root's global rank
};

px_status submit_device_op(const VarRef& ref, const std::string& who, const DeviceOp& op,
                           int device, void* stream, uint8_t priority, px_request** out_request) {
  Client* c = ref.client.get();
  Var* var = ref.var;
  if (c->daemon_gpus.empty())
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who + ": PX_MEMORY_CUDA: parallaxd on node " + std::to_string(c->world.node_index) +
                    " has no usable GPU: " + c->daemon_gpu_why);
  const CudaApi* cuda = cuda_api_loading();
  if (!cuda)
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who +
                    ": PX_MEMORY_CUDA: no CUDA runtime (this process has none loaded, and "
                    "neither libcudart.so.13 nor libcudart.so.12 loads)");
  bool empty = op.in_bytes == 0;  // a sparse step of no rows: no buffer at all
  if (!empty && (!op.in || !op.out)) return fail(c, PX_ERR_INVALID, who + ": NULL buffer");
  int stream_device = -1;
  if (cuda->stream_get_device) {
    int err = cuda->stream_get_device(stream, &stream_device);
    if (err != 0)
      return fail(c, PX_ERR_INVALID,
                  who + ": the stream: " + cuda_error_text(*cuda, "cudaStreamGetDevice", err));
  }
  int capturing = 0;
  if (cuda->stream_is_capturing(stream, &capturing) != 0 || capturing != 0) {
    cuda->get_last_error();
    // A captured host function would run at every replay of the graph, long after this call.
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who +
                    ": the stream is being captured into a CUDA graph (or cannot be asked): "
                    "device operations cannot be captured");
  }
  // Memory outside px_alloc_ex allocations is copied through the variable's staging one.
  int in_device = -1, out_device = -1;
  if (!empty) {
    std::lock_guard<std::mutex> guard(c->mutex);
    for (auto [p, bytes, outside, name] :
         {std::tuple{op.in, op.in_bytes, &in_device, "in"},
          std::tuple{static_cast<const void*>(op.out), op.out_bytes, &out_device, "out"}}) {
      std::string wrong = outside_allocation(c, p, bytes, outside);
      if (!wrong.empty())
        return fail(c, PX_ERR_INVALID,
                    who + ": " + name + " (" + std::to_string(bytes) + " bytes) " + wrong);
      if (*outside >= 0 && !op.stage_outside)
        return fail(c, PX_ERR_NOT_IMPLEMENTED,
                    who + ": " + name +
                        " is device memory outside px_alloc_ex allocations: this operation "
                        "needs it inside one (the staging copy is for allreduce and broadcast "
                        "only)");
    }
  }
  if (in_device >= 0 && out_device >= 0 && in_device != out_device)
    return fail(c, PX_ERR_INVALID,
                who + ": in is on device " + std::to_string(in_device) + ", out on " +
                    std::to_string(out_device));
  void* staging = nullptr;
  if (in_device >= 0 || out_device >= 0) {
    px_status status =
        staging_for(c, var, who, in_device >= 0 ? in_device : out_device, stream, &staging);
    if (status != PX_OK) return status;
  }
  const void* step_in = in_device >= 0 ? staging : op.in;
  void* step_out = out_device >= 0 ? staging : op.out;
  // One device operation at a time is numbered and queued (launch_mutex); mutex is taken to
  // reserve and to commit, never across cudaLaunchHostFunc.
  std::lock_guard<std::mutex> launching(c->launch_mutex);
  auto d = std::make_unique<DeferredSubmit>();
  {
    std::lock_guard<std::mutex> guard(c->mutex);
    uintptr_t in_base = 0, out_base = 0;
    DeviceRegion in_region, out_region;
    if (!empty) {
      for (auto [p, bytes, base, region, name] :
           {std::tuple{step_in, op.in_bytes, &in_base, &in_region, "in"},
            std::tuple{static_cast<const void*>(step_out), op.out_bytes, &out_base, &out_region,
                       "out"}})
        if (!find_region(c, p, bytes, base, region))
          return fail(
              c, PX_ERR_INVALID,
              who + ": " + name + ": its staging allocation was freed meanwhile (px_disconnect?)");
      if (in_region.device != out_region.device)
        return fail(c, PX_ERR_INVALID,
                    who + ": in is on device " + std::to_string(in_region.device) + ", out on " +
                        std::to_string(out_region.device));
      if (device >= 0 && device != in_region.device)
        return fail(c, PX_ERR_INVALID,
                    who + ": the buffers are on device " + std::to_string(in_region.device) +
                        ", options->device is " + std::to_string(device));
      if (stream_device >= 0 && stream_device != in_region.device)
        return fail(c, PX_ERR_INVALID,
                    who + ": the buffers are on device " + std::to_string(in_region.device) +
                        ", the stream on device " + std::to_string(stream_device));
      const auto* ip = static_cast<const char*>(op.in);
      const auto* outp = static_cast<const char*>(op.out);
      bool overlap = ip < outp + op.out_bytes && outp < ip + op.in_bytes;
      if (overlap && (ip != outp || var->sparse))
        return fail(c, PX_ERR_INVALID,
                    who + (var->sparse ? ": the indices and the rows overlap"
                                       : ": in and out overlap without being equal"));
    }
    if (var->deferred_device_steps > 0 && var->device_stream != stream)
      return fail(c, PX_ERR_INVALID,
                  who +
                      ": the variable's earlier steps are still queued on another CUDA "
                      "stream; one stream per variable until they are submitted");
    px_status status;
    if ((status = usable(c)) != PX_OK || (status = check_in_flight(c, who)) != PX_OK) return status;
    // Under c->mutex, once usable (not closed): px_disconnect lets go under it.
    if (!claim_device_operations(c))
      return fail(c, PX_ERR_INVALID,
                  who +
                      ": another px_client of this process queues device operations: CUDA may "
                      "run a process's host functions one at a time, and each waits for its "
                      "step, so two workers in one process would wait on each other; one "
                      "worker per process on device memory (px_disconnect the other first)");

    std::shared_ptr<Request> request;
    if ((status = new_request(c, who, 0, &request)) != PX_OK) return status;
    Request* r = request.get();
    r->bytes = op.out_bytes;
    r->daemon_writes_caller = op.daemon_writes_out && !empty;
    r->copy_back_pending = out_device >= 0;  // see copy_back_done
    r->device = true;
    r->var = var;
    r->what = op.what;
    r->has_step = op.next_step != nullptr;
    r->step = op.next_step ? (*op.next_step)++ : 0;
    d->client = ref.client;
    d->request = std::move(request);
    d->var = var;
    SubmitEntry& e = d->entry;
    e.request_id = r->id;
    e.step = r->step;
    e.var_id = var->id;
    e.opcode = static_cast<uint16_t>(op.opcode);
    e.priority = priority;
    e.root = op.root;
    auto kind = static_cast<uint32_t>(MemoryKind::kCudaDevice);
    e.in = empty ? BufferRef{0, 0, kind, 0}
                 : BufferRef{reinterpret_cast<uintptr_t>(step_in) - in_base, op.in_bytes, kind,
                             in_region.id};
    e.out = empty ? BufferRef{0, 0, kind, 0}
                  : BufferRef{reinterpret_cast<uintptr_t>(step_out) - out_base, op.out_bytes, kind,
                              out_region.id};
    // Reserved: counted against the ring, and the variable held to this stream.
    ++c->deferred_submits;
    ++var->deferred_device_steps;
    var->device_stream = stream;
    c->requests[r] = d->request;
  }
  std::shared_ptr<Request> request = d->request;
  const char* failed = "cudaMemcpyAsync (copy in)";
  int err = 0;
  if (in_device >= 0)
    err = cuda->memcpy_async(staging, op.in, op.in_bytes, kCudaMemcpyDeviceToDevice, stream);
  if (err == 0) {
    failed = "cudaLaunchHostFunc";
    err = cuda->launch_host_func(stream, submit_when_stream_reaches, d.get());
  }
  if (err == 0) d.release();  // the host function owns it now (it may already have run)
  std::string copy_back_error;
  // Queued after the host function, which returns once the step is complete: the result
  // reaches out before any work queued after this call; then a host function marks the
  // request done, so px_wait returns only once out holds the result.
  int back = err == 0 && out_device >= 0 ? cuda->memcpy_async(op.out, staging, op.out_bytes,
                                                              kCudaMemcpyDeviceToDevice, stream)
                                         : 0;
  if (back != 0) copy_back_error = cuda_error_text(*cuda, "cudaMemcpyAsync (copy back)", back);
  bool marked = false;
  if (err == 0 && out_device >= 0 && back == 0) {
    auto done = std::make_unique<DeferredSubmit>();
    done->client = ref.client;
    done->request = request;
    int mark = cuda->launch_host_func(stream, copy_back_done, done.get());
    if (mark == 0) {
      done.release();  // copy_back_done owns it
      marked = true;
    } else {
      copy_back_error = cuda_error_text(*cuda, "cudaLaunchHostFunc (after the copy back)", mark);
    }
  }
  std::lock_guard<std::mutex> guard(c->mutex);
  if (!copy_back_error.empty()) {
    // The step is queued and runs; its result does not reach out (or when is unknown): the
    // request says so.
    Request* r = request.get();
    r->copy_back_error =
        who + ": the step ran but its result was not copied back: " + copy_back_error;
    if (r->daemon_done && r->status == PX_OK) {
      r->status = PX_ERR_INTERNAL;
      r->message = r->copy_back_error;
    }
  }
  if (err == 0 && out_device >= 0 && !marked) end_copy_back(c, request.get());
  if (err != 0) {
    // Nothing else numbered a step of the variable meanwhile: device steps wait for
    // launch_mutex, host steps are refused while this one is reserved.
    --c->deferred_submits;
    --var->deferred_device_steps;
    if (op.next_step) --*op.next_step;
    destroy_request(c, request.get());
    return fail(c, PX_ERR_INVALID, who + ": " + cuda_error_text(*cuda, failed, err));
  }
  *out_request = add_request_handle(ref.client, std::move(request));
  return PX_OK;
}

std::atomic<const Client*> device_operations_owner{nullptr};

}  // namespace

bool claim_device_operations(const Client* c) {
  const Client* owner = nullptr;
  return device_operations_owner.compare_exchange_strong(owner, c) || owner == c;
}

void release_device_operations(const Client* c) {
  device_operations_owner.compare_exchange_strong(c, nullptr);
}

px_status submit_device_allreduce(const VarRef& ref, const std::string& who, const void* in,
                                  void* out, int device, void* stream, uint8_t priority,
                                  px_request** out_request) {
  DeviceOp op;
  op.in = in;
  op.out = out;
  op.in_bytes = op.out_bytes = ref.var->bytes;
  op.next_step = &ref.var->next_step;
  op.stage_outside = true;
  return submit_device_op(ref, who, op, device, stream, priority, out_request);
}

px_status submit_device_broadcast(const VarRef& ref, const std::string& who, const void* in,
                                  void* out, int root, int device, void* stream, uint8_t priority,
                                  px_request** out_request) {
  Client* c = ref.client.get();
  if (root < 0 || root >= c->world.world_size)
    return fail(c, PX_ERR_INVALID,
                who + ": root " + std::to_string(root) + " is not a rank of the job (" +
                    std::to_string(c->world.world_size) + " workers)");
  DeviceOp op;
  op.opcode = Opcode::kBroadcast;
  op.what = "broadcast";
  op.in = root == c->world.rank ? in : out;  // only the root's input is read
  op.out = out;
  op.in_bytes = op.out_bytes = ref.var->bytes;
  op.next_step = &ref.var->next_steps[Opcode::kBroadcast];
  op.stage_outside = true;
  op.root = static_cast<uint32_t>(root);
  return submit_device_op(ref, who, op, device, stream, priority, out_request);
}

px_status submit_device_allgather(const VarRef& ref, const std::string& who, const void* in,
                                  void* out, int device, void* stream, uint8_t priority,
                                  px_request** out_request) {
  DeviceOp op;
  op.opcode = Opcode::kAllgather;
  op.what = "allgather";
  op.in = in;
  op.out = out;
  op.in_bytes = ref.var->bytes;
  op.out_bytes = ref.var->bytes * static_cast<uint64_t>(ref.client->world.world_size);
  op.next_step = &ref.var->next_steps[Opcode::kAllgather];
  return submit_device_op(ref, who, op, device, stream, priority, out_request);
}

px_status submit_device_rows(const VarRef& ref, const std::string& who, Opcode opcode,
                             const int64_t* indices, uint64_t n, void* rows, int device,
                             void* stream, uint8_t priority, px_request** out_request) {
  Var* var = ref.var;
  if (var->prefetch && (opcode == Opcode::kPullRows || opcode == Opcode::kPushRows))
    return fail(ref.client.get(), PX_ERR_NOT_IMPLEMENTED,
                who +
                    ": PX_MEMORY_CUDA on a prefetch variable: its pulled rows are kept on the "
                    "host to check the next push (README, Limits)");
  DeviceOp op;
  op.opcode = opcode;
  bool reads_rows = opcode == Opcode::kPushRows || opcode == Opcode::kLoadRows;
  op.what = opcode == Opcode::kPushRows   ? "push"
            : opcode == Opcode::kPullRows ? "pull"
            : opcode == Opcode::kLoadRows ? "load"
                                          : "read";
  op.in = indices;
  op.in_bytes = n * sizeof(int64_t);
  op.out = rows;
  op.out_bytes = n * var->dim * sizeof(float);
  // Loads and reads are not steps: no step number (they still keep to the stream's order).
  op.next_step = opcode == Opcode::kPushRows   ? &var->next_push_step
                 : opcode == Opcode::kPullRows ? &var->next_pull_step
                                               : nullptr;
  op.daemon_writes_out = !reads_rows;
  return submit_device_op(ref, who, op, device, stream, priority, out_request);
}

}  // namespace px
