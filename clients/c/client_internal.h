// libparallax's private state behind the opaque handles of parallax_c.h.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "parallax_c.h"
#include "transport/ipc/arena_allocator.h"
#include "transport/ipc/control_channel.h"
#include "transport/ipc/shm_arena.h"
#include "transport/kernels/dtype.h"

struct px_var {
  px_client* client = nullptr;
  uint32_t id = 0;
  std::string name;
  px::DType dtype = px::DType::kF32;
  px::ReduceOp op = px::ReduceOp::kSum;
  uint64_t count = 0;
  uint64_t bytes = 0;
  uint64_t next_step = 0;  // guarded by client->mutex
  bool sparse = false;
  uint64_t dim = 0;             // sparse: values per row (count holds the rows)
  uint64_t next_pull_step = 0;  // sparse, guarded by client->mutex
  uint64_t next_push_step = 0;
};

struct px_request {
  px_client* client = nullptr;
  uint64_t id = 0;
  const px_var* var = nullptr;     // nullptr: a barrier
  const char* what = "allreduce";  // the operation, for messages
  uint64_t step = 0;
  bool has_step = true;
  std::string describe() const;  // "allreduce of 'w' step 3", for error messages
  bool done = false;
  bool orphaned = false;  // freed by the caller before completion
  px_status status = PX_OK;
  std::string message;
  // A staging buffer in the arena when the caller's memory is ordinary memory.
  bool has_staging = false;
  uint64_t staging_offset = 0;
  void* copy_out_to = nullptr;   // caller's out buffer to fill from staging on success
  uint64_t copy_out_offset = 0;  // where in the arena the result is staged
  uint64_t bytes = 0;            // bytes to copy out
  bool copied_out = false;
};

struct px_client {
  std::mutex mutex;
  std::condition_variable completions_changed;
  bool poller_active = false;

  int socket_fd = -1;
  std::string socket_path;
  int64_t control_timeout_ms = 30000;
  px::FrameDecoder decoder;
  px::SharedArena arena;
  px::Doorbell submit_bell;
  px::Doorbell completion_bell;
  px::SpscRing<px::SubmitEntry> submit_ring;
  px::SpscRing<px::CompletionEntry> completion_ring;
  px::ArenaAllocator allocator;
  px_world_info world{};
  std::string job;

  std::vector<std::unique_ptr<px_var>> vars;
  std::unordered_map<uint64_t, px_request*> in_flight;
  std::unordered_map<px_request*, std::unique_ptr<px_request>> requests;  // every live request
  uint64_t next_request_id = 1;
  uint64_t barrier_step = 0;
  // Set once the daemon connection is gone: every later wait fails with it.
  px_status lost_status = PX_OK;
  std::string lost_message;

  ~px_client();
};

namespace px {

// Records the calling thread's last error and returns status.
px_status fail(px_status status, const std::string& message);
px_status succeed();

// One synchronous control round trip under client->mutex.
px_status control_call(px_client* client, const std::string& frame, control::Body expected,
                       std::string* payload, const control::Message** reply);

// Drains the completion ring into the in-flight requests. Caller holds client->mutex.
void drain_completions(px_client* client);

// True if [p, p + bytes) lies in the arena's heap; sets *offset.
bool arena_offset(const px_client* client, const void* p, uint64_t bytes, uint64_t* offset);

}  // namespace px
