// Where a worker's requests complete, as the layers below the front see a worker: dense/
// and sparse/ complete requests, name the worker in messages and read its buffers through
// this, never through Session (front), so data flows one way and the scheduler can be
// driven by a test's fake worker.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/gpu/device_regions.h"
#include "parallax_c.h"
#include "transport/ipc/shm_arena.h"

namespace px {

class Completer {
 public:
  virtual ~Completer() = default;
  // Queues the completion of request_id for the worker (message only when status != PX_OK).
  // Loop thread only.
  virtual void complete(uint64_t request_id, px_status status, const std::string& message) = 0;
  // "worker local rank 1 (pid 1234) of job 'train'", for messages.
  virtual std::string label() const = 0;
  // The worker's shared arena: a SubmitEntry's buffers are offsets into it.
  virtual const SharedArena& arena() const = 0;
  // The worker's device memory (px_alloc_ex), null for a worker without any.
  virtual const gpu::DeviceRegions* device_regions() const { return nullptr; }
};

// The mapping holding a device buffer of worker's (ref.region, inside it), or null with why:
// what the device steps (dense/, sparse/) resolve each device BufferRef through.
inline std::shared_ptr<gpu::DeviceMapping> find_device_buffer(const Completer& worker,
                                                              const BufferRef& ref,
                                                              std::string* why) {
  const gpu::DeviceRegions* regions = worker.device_regions();
  if (!regions) {
    *why = "no device memory registered";
    return nullptr;
  }
  return regions->find(ref.region, ref.offset, ref.bytes, why);
}

}  // namespace px
