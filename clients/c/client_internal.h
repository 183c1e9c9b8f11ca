// libparallax's private state behind the opaque handles of parallax_c.h.
//
// Handles are not pointers to these objects but never-reused ids (handles.cc): a handle
// used after its object was freed, or after its client was disconnected, is simply not
// found, whatever the order in which a garbage-collected binding frees them. A call holds
// shared_ptrs to what it found, so a px_disconnect on another thread cannot free the
// state under it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
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

namespace px {

struct Client;

struct Var {
  Client* client = nullptr;
  uint64_t handle = 0;
  uint32_t id = 0;
  std::string name;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;
  uint64_t bytes = 0;
  uint64_t next_step = 0;                 // allreduce steps; guarded by client->mutex
  std::map<Opcode, uint64_t> next_steps;  // the other dense operations' steps
  bool sparse = false;
  uint64_t dim = 0;             // sparse: values per row (count holds the rows)
  uint64_t next_pull_step = 0;  // sparse, guarded by client->mutex
  uint64_t next_push_step = 0;
  // px_sparse_options.prefetch: each pull step's rows (sorted, unique) until the push of the
  // same step, which may push only those (the owners serve the next pull's other rows early).
  bool prefetch = false;
  std::map<uint64_t, std::vector<int64_t>> pulled_rows;
  // Device allreduce steps numbered but not yet submitted (their stream has not reached
  // them), and the stream they are queued on: until they are, the variable takes no host
  // step and no other stream (steps must reach the daemon in order).
  uint64_t deferred_device_steps = 0;
  void* device_stream = nullptr;
  // Device memory outside px_alloc_ex: the px_alloc_ex allocation its steps are copied
  // through (one device-to-device copy each way, on the step's stream), made at the first
  // such step and freed with the client's device memory; the device it is on and the one
  // stream such steps may use.
  void* device_staging = nullptr;
  int device_staging_device = -1;
  void* device_staging_stream = nullptr;
  // (1.12) A table of a group (px_register_sparse_group): the group's variable takes its
  // steps, and its own indices are that variable's rows [row_offset, row_offset + count).
  // Shares the group's id; steps and rates are the group's.
  Var* group = nullptr;
  uint64_t row_offset = 0;
  std::string table;  // the table's name, for messages
};

// Every field is guarded by client->mutex.
struct Request {
  Client* client = nullptr;
  uint64_t handle = 0;
  uint64_t id = 0;                 // the ring's request id
  const Var* var = nullptr;        // nullptr: a barrier
  const char* what = "allreduce";  // the operation, for messages
  uint64_t step = 0;
  bool has_step = true;
  std::string describe() const;  // "allreduce of 'w' step 3", for error messages
  bool done = false;
  bool freed = false;      // px_request_free was called (it lives on until completion)
  bool cancelled = false;  // px_request_cancel was called: no copy-out, status CANCELLED
  // The daemon writes the caller's own (arena) memory: a cancel must wait for it to finish.
  bool daemon_writes_caller = false;
  // On device memory: submitted by a host function on the caller's CUDA stream
  // (device_operations.cc), not by the call.
  bool device = false;
  // Device memory outside px_alloc_ex whose copy back could not be queued: the request
  // fails with this once the step completes.
  std::string copy_back_error;
  // (1.12) A group step with a table's index out of its range: added to the daemon's
  // PX_ERR_INDEX message, which can only name the group's row.
  std::string index_note;
  // Device memory outside px_alloc_ex: the copy back is queued on the stream after the
  // step; the request is done (px_wait returns) only once a host function after that copy
  // ran. daemon_done: the daemon's step completed (status and message are set).
  bool copy_back_pending = false;
  bool daemon_done = false;
  bool delivered = false;  // px_wait/px_test returned its result
  bool copying = false;    // a thread copies its staged result out, without the lock
  // The daemon keeps a message too long for a completion entry; fetched once, on delivery.
  bool message_on_daemon = false;
  px_status status = PX_OK;
  std::string message;
  // A staging buffer in the arena when the caller's memory is ordinary memory.
  bool has_staging = false;
  uint64_t staging_offset = 0;
  void* copy_out_to = nullptr;   // caller's out buffer to fill from staging on success
  uint64_t copy_out_offset = 0;  // where in the arena the result is staged
  uint64_t bytes = 0;            // bytes to copy out
};

// A px_alloc_ex device allocation the daemon has mapped (device_memory.cc).
struct DeviceRegion {
  uint32_t id = 0;  // the daemon's name for it
  int device = -1;
  uint64_t bytes = 0;
};

struct Client {
  uint64_t handle = 0;
  // Lock order: control_mutex or launch_mutex, then mutex; mutex is never held across a
  // blocking call.
  std::mutex mutex;          // requests, variables, rings
  std::mutex control_mutex;  // one control round trip on the socket at a time
  // Device operations: numbering a step and queueing its host function on the stream, one
  // at a time. Never held with mutex across the CUDA call (a full launch queue blocks it
  // until earlier host functions, which take mutex, have run).
  std::mutex launch_mutex;
  std::condition_variable changed;  // completions drained, a request freed, disconnect
  bool poller_active = false;       // a waiter sleeps in poll() on the doorbell
  bool control_active = false;      // a control call owns the socket's incoming bytes
  bool closed = false;              // px_disconnect was called

  int socket_fd = -1;
  std::string socket_path;
  int64_t control_timeout_ms = 30000;
  FrameDecoder decoder;  // guarded by control_mutex
  SharedArena arena;
  Doorbell submit_bell;
  Doorbell completion_bell;
  SpscRing<SubmitEntry> submit_ring;
  SpscRing<CompletionEntry> completion_ring;
  ArenaAllocator allocator;
  px_world_info world{};
  std::string job;
  // (1.8) The daemon's GPUs by PCI bus id (from px_connect's reply), or why it has none.
  std::vector<std::string> daemon_gpus;
  std::string daemon_gpu_why;
  // px_alloc_ex device memory by its pointer; guarded by mutex.
  std::map<uintptr_t, DeviceRegion> device_regions;
  uint32_t next_device_region = 1;
  // Device operations called but not yet submitted (their stream has not reached them):
  // they count against the ring's capacity like those in flight.
  size_t deferred_submits = 0;

  std::vector<std::unique_ptr<Var>> vars;
  std::unordered_map<uint64_t, Request*> in_flight;                 // by request id
  std::unordered_map<Request*, std::shared_ptr<Request>> requests;  // every live request
  uint64_t next_request_id = 1;
  uint64_t barrier_step = 0;
  // Set once the daemon connection is gone: every later wait fails with it.
  px_status lost_status = PX_OK;
  std::string lost_message;

  // px_client_fd: an epoll set of the completion doorbell, the socket and user_bell, which
  // is rung whenever a thread other than the loop's own px_progress completes requests.
  int epoll_fd = -1;
  Doorbell user_bell;

  std::mutex error_mutex;  // last_error only (set from any thread, with or without mutex)
  std::string last_error;

  ~Client();
  std::string worker_label() const;  // "worker local rank 1 of job 'j' on node 0"
};

// --- handles (handles.cc) ------------------------------------------------------------
struct ClientRef {
  std::shared_ptr<Client> client;
};
struct VarRef {
  std::shared_ptr<Client> client;
  Var* var = nullptr;
};
struct RequestRef {
  std::shared_ptr<Client> client;
  std::shared_ptr<Request> request;
};
px_client* add_client_handle(std::shared_ptr<Client> client);
px_var* add_var_handle(const std::shared_ptr<Client>& client, Var* var);
px_request* add_request_handle(const std::shared_ptr<Client>& client,
                               std::shared_ptr<Request> request);
bool find_client(px_client* handle, ClientRef* out);
bool find_var(px_var* handle, VarRef* out);
bool find_request(px_request* handle, RequestRef* out);
void remove_request_handle(uint64_t handle);
// Removes the client's handle and those of its variables and requests.
void remove_client_handles(Client& client);

// --- errors (errors.cc) --------------------------------------------------------------
// Records the calling thread's last error (and the client's, when given); returns status.
px_status fail(px_status status, const std::string& message);
px_status fail(Client* client, px_status status, const std::string& message);
px_status succeed();
// "px_wait: request handle 0x2a is not live (freed, or its client disconnected)"
px_status stale_handle(const char* fn, const char* kind, const void* handle);

// --- control round trips (client.cc) -------------------------------------------------
// One synchronous control round trip. Takes control_mutex itself; the caller must not
// hold client->mutex.
px_status control_call(Client* client, const std::string& frame, control::Body expected,
                       std::string* payload, const control::Message** reply,
                       int64_t timeout_ms = 0);

// --- device memory (device_memory.cc) ------------------------------------------------
// px_free of device memory: true if ptr is a px_alloc_ex device allocation (then freed,
// with *status set), false otherwise. Caller holds neither lock.
bool free_device_memory(Client* client, void* ptr, px_status* status);
// px_disconnect: every device allocation still held, released and freed.
void free_all_device_memory(Client* client);
// px_alloc_ex's device path: bytes on device (-1: the current one), registered with the
// daemon. Caller holds neither lock.
px_status alloc_device_memory(Client* client, uint64_t bytes, int device, void** out_ptr);

// --- operations on device memory (device_operations.cc) ------------------------------
struct VarRef;
// CUDA may run a process's host functions one at a time, whatever their streams, and each
// of a device operation's waits for its step, which needs every worker's: so one client per
// process queues device operations. True if c may (it is the one, or none is); px_disconnect
// lets go.
bool claim_device_operations(const Client* c);
void release_device_operations(const Client* c);
// px_allreduce_ex with PX_MEMORY_CUDA: in and out device memory (outside px_alloc_ex: staged),
// ordered on stream (a cudaStream_t; null: the legacy default stream). device: options' (-1: any).
px_status submit_device_allreduce(const VarRef& ref, const std::string& who, const void* in,
                                  void* out, int device, void* stream, uint8_t priority,
                                  px_request** out_request);
// px_broadcast_ex with PX_MEMORY_CUDA: as the allreduce (root: options->root).
px_status submit_device_broadcast(const VarRef& ref, const std::string& who, const void* in,
                                  void* out, int root, int device, void* stream, uint8_t priority,
                                  px_request** out_request);
// px_allgather_ex with PX_MEMORY_CUDA: in (the variable's size) and out (world_size times
// it) inside px_alloc_ex allocations, apart.
px_status submit_device_allgather(const VarRef& ref, const std::string& who, const void* in,
                                  void* out, int device, void* stream, uint8_t priority,
                                  px_request** out_request);
// px_pull_rows_ex / px_push_rows_ex / px_load_rows_ex / px_read_rows_ex with PX_MEMORY_CUDA:
// n indices and n rows (a pull's or read's out, a push's gradients, a load's values) inside
// px_alloc_ex allocations, ordered on stream as above.
px_status submit_device_rows(const VarRef& ref, const std::string& who, Opcode opcode,
                             const int64_t* indices, uint64_t n, void* rows, int device,
                             void* stream, uint8_t priority, px_request** out_request);

// --- requests (requests.cc) ----------------------------------------------------------
// Drains the completion ring into the in-flight requests. Caller holds client->mutex.
void drain_completions(Client* client);

// True if [p, p + bytes) lies in the arena's heap; sets *offset.
bool arena_offset(const Client* client, const void* p, uint64_t bytes, uint64_t* offset);

// PX_OK if the host buffer may be staged or shared (not CUDA device memory; detected only
// when the process has loaded the CUDA runtime).
px_status check_host_pointer(Client* c, const std::string& who, const void* p);

}  // namespace px
