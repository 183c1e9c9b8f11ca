// libparallax: operations on device memory (px_allreduce_ex with PX_MEMORY_CUDA), ordered
// on the caller's CUDA stream as NCCL's are.
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
#include <cstring>
#include <memory>

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
    if (r->done || c->closed) return;
    if (c->lost_status != PX_OK) {
      mark_lost(c, c->lost_message);
      continue;
    }
    wait_for_completions(c, lock, -1);
  }
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

}  // namespace

px_status submit_device_allreduce(const VarRef& ref, const std::string& who, const void* in,
                                  void* out, int device, void* stream, uint8_t priority,
                                  px_request** out_request) {
  Client* c = ref.client.get();
  Var* var = ref.var;
  if (c->daemon_gpus.empty())
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who + ": PX_MEMORY_CUDA: parallaxd on node " + std::to_string(c->world.node_index) +
                    " has no usable GPU: " + c->daemon_gpu_why);
  const CudaApi* cuda = cuda_api();
  if (!cuda)
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who + ": PX_MEMORY_CUDA: this process has not loaded the CUDA runtime");
  if (!in || !out) return fail(c, PX_ERR_INVALID, who + ": NULL buffer");
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
  // One device operation at a time is numbered and queued (launch_mutex); mutex is taken to
  // reserve and to commit, never across cudaLaunchHostFunc.
  std::lock_guard<std::mutex> launching(c->launch_mutex);
  auto d = std::make_unique<DeferredSubmit>();
  {
    std::lock_guard<std::mutex> guard(c->mutex);
    uintptr_t in_base = 0, out_base = 0;
    DeviceRegion in_region, out_region;
    for (auto [p, base, region, name] :
         {std::tuple{in, &in_base, &in_region, "in"},
          std::tuple{static_cast<const void*>(out), &out_base, &out_region, "out"}})
      if (!find_region(c, p, var->bytes, base, region))
        return fail(c, PX_ERR_NOT_IMPLEMENTED,
                    who + ": " + name + " (" + std::to_string(var->bytes) +
                        " bytes) is not inside a px_alloc_ex device allocation: other device "
                        "memory (one copy into such an allocation) is not built yet");
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
    const auto* ip = static_cast<const char*>(in);
    const auto* op = static_cast<const char*>(out);
    if (ip != op && ip < op + var->bytes && op < ip + var->bytes)
      return fail(c, PX_ERR_INVALID, who + ": in and out overlap without being equal");
    if (var->deferred_device_steps > 0 && var->device_stream != stream)
      return fail(c, PX_ERR_INVALID,
                  who +
                      ": the variable's earlier steps are still queued on another CUDA "
                      "stream; one stream per variable until they are submitted");
    px_status status;
    if ((status = usable(c)) != PX_OK || (status = check_in_flight(c, who)) != PX_OK) return status;
    std::shared_ptr<Request> request;
    if ((status = new_request(c, who, 0, &request)) != PX_OK) return status;
    Request* r = request.get();
    r->bytes = var->bytes;
    r->daemon_writes_caller = true;
    r->device = true;
    r->var = var;
    r->what = "allreduce";
    r->step = var->next_step++;
    d->client = ref.client;
    d->request = std::move(request);
    d->var = var;
    SubmitEntry& e = d->entry;
    e.request_id = r->id;
    e.step = r->step;
    e.var_id = var->id;
    e.opcode = static_cast<uint16_t>(Opcode::kAllreduce);
    e.priority = priority;
    e.in = BufferRef{reinterpret_cast<uintptr_t>(in) - in_base, var->bytes,
                     static_cast<uint32_t>(MemoryKind::kCudaDevice), in_region.id};
    e.out = BufferRef{reinterpret_cast<uintptr_t>(out) - out_base, var->bytes,
                      static_cast<uint32_t>(MemoryKind::kCudaDevice), out_region.id};
    // Reserved: counted against the ring, and the variable held to this stream.
    ++c->deferred_submits;
    ++var->deferred_device_steps;
    var->device_stream = stream;
    c->requests[r] = d->request;
  }
  std::shared_ptr<Request> request = d->request;
  int err = cuda->launch_host_func(stream, submit_when_stream_reaches, d.get());
  std::lock_guard<std::mutex> guard(c->mutex);
  if (err != 0) {
    // Nothing else numbered a step of the variable meanwhile: device steps wait for
    // launch_mutex, host steps are refused while this one is reserved.
    --c->deferred_submits;
    --var->deferred_device_steps;
    --var->next_step;
    destroy_request(c, request.get());
    return fail(c, PX_ERR_INVALID, who + ": " + cuda_error_text(*cuda, "cudaLaunchHostFunc", err));
  }
  d.release();  // the host function owns it now (it may already have run)
  *out_request = add_request_handle(ref.client, std::move(request));
  return PX_OK;
}

}  // namespace px
