// One connected worker: its control socket, its shared arena and rings, its doorbells.
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>

#include "daemon/common/completer.h"
#include "daemon/common/job.h"
#include "daemon/common/log.h"
#include "daemon/gpu/device_regions.h"
#include "sharding/sparse_spec.h"
#include "transport/ipc/control_channel.h"
#include "transport/ipc/shm_arena.h"

namespace px {

class Server;

class Session : public Completer, public std::enable_shared_from_this<Session> {
 public:
  Session(Server& server, int fd, uint64_t id, pid_t pid, uid_t uid);
  ~Session() override;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start();
  // Refuses the connection with a reply the client can read, then closes it.
  void refuse(px_status status, const std::string& message);
  // Closes the connection (idempotent); the job is told the worker left, with reason.
  void close(const std::string& reason);
  bool closed() const { return state_ == State::kClosed; }
  // It said goodbye (px_disconnect) before its connection closed.
  bool left_cleanly() const { return left_cleanly_; }

  // Called by the server once every worker of the job has connected.
  void activate();
  // The job broke before it started (a node lost while its world was being agreed): a
  // worker still waiting for it is refused with status now, not at its connect deadline.
  void fail_waiting(px_status status, const std::string& message);
  // Queues a completion for the client and rings its doorbell if it sleeps.
  void complete(uint64_t request_id, px_status status, const std::string& message) override;
  // The status this worker is told: a PX_ERR_PEER_LOST of a job that nodes joining ended is
  // PX_ERR_MEMBERSHIP (whichever path failed the step), and a client older than ABI 1.15
  // (which does not know that status) is told PX_ERR_PEER_LOST.
  px_status to_client(px_status status) const;

  uint64_t id() const { return id_; }
  pid_t pid() const { return pid_; }
  uid_t uid() const { return uid_; }
  // pxctl's replies (admin.cc).
  void send_admin_frame(const std::string& frame) { send_frame(frame); }
  Job* job() const { return job_.get(); }
  const std::shared_ptr<Job>& job_ref() const { return job_; }
  int local_rank() const { return local_rank_; }
  // Operations taken from its ring and not completed yet (the drain waits for them).
  uint64_t outstanding() const { return outstanding_; }
  const SharedArena& arena() const override { return arena_; }
  // "worker local rank 1 (pid 1234) of job 'train'"
  std::string label() const override;
  const gpu::DeviceRegions* device_regions() const override { return &device_regions_; }
  // This worker (job, local rank, pid) and the variable a log line is about, if any.
  LogFields log_fields(const std::string& variable = "") const;

 private:
  // kAdmin: pxctl's connection (admin.h), which never joins a job.
  enum class State { kHandshake, kWaitingForJob, kActive, kAdmin, kClosed };

  static void on_socket_event(uv_poll_t* handle, int status, int events);
  static void on_doorbell(uv_poll_t* handle, int status, int events);
  static void on_handle_closed(uv_handle_t* handle);

  void read_socket();
  void flush_output();
  void send_frame(const std::string& frame);
  void handle_frame(const std::string& payload);
  void handle_hello(const control::Hello& hello);
  void handle_register(const control::RegisterDense& request);
  void handle_register_sparse(const control::RegisterSparse& request);
  // Registers (name, fingerprint) for this worker, or reports why not; creates the variable
  // on first registration (make_sparse then sets up its table).
  void register_variable(const std::string& name, const Fingerprint& fingerprint,
                         const SparseOptions* sparse_options);
  void reply_register(px_status status, const std::string& message, uint32_t var_id);
  // Why a new variable would cross the job's limits (config job_limits), or "".
  std::string job_limit_refusal(const std::string& name, const Fingerprint& fingerprint) const;
  // Why the request just taken off the ring crosses this worker's or its job's limit on
  // requests in flight (it is already counted), or "".
  std::string request_limit_refusal() const;
  void handle_stats(const control::StatsRequest& request);
  void handle_set_sparse_lr(const control::SetSparseLr& request);
  void handle_checkpoint(const control::Checkpoint& request);
  void handle_error_text(const control::ErrorText& request);
  void handle_cancel(const control::Cancel& request);
  void handle_abort(const control::Abort& request);
  // Device memory (session_device_memory.cc).
  void handle_register_device_memory(const control::RegisterDeviceMemory& request);
  void handle_release_device_memory(const control::ReleaseDeviceMemory& request);
  void reply_device_memory(px_status status, const std::string& message);
  void drain_submissions();
  void update_socket_poll();

  Server& server_;
  int fd_;
  uint64_t id_;
  pid_t pid_;
  uid_t uid_;
  State state_ = State::kHandshake;
  bool close_after_flush_ = false;
  bool left_cleanly_ = false;
  int open_handles_ = 0;
  uint64_t outstanding_ = 0;
  uv_poll_t socket_poll_{};
  uv_poll_t doorbell_poll_{};
  bool doorbell_polling_ = false;
  FrameDecoder decoder_;
  std::string output_;

  std::shared_ptr<Job> job_;
  uint32_t client_minor_ = 0;  // the client's ABI minor version (Hello)
  int local_rank_ = -1;
  std::string job_name_;
  SharedArena arena_;
  Doorbell submit_bell_;      // client rings, daemon waits
  Doorbell completion_bell_;  // daemon rings, client waits
  SpscRing<SubmitEntry> submit_ring_;
  SpscRing<CompletionEntry> completion_ring_;
  gpu::DeviceRegions device_regions_;  // the worker's device memory (px_alloc_ex)
  // Messages too long for a completion entry, kept until the client fetches them (the
  // oldest are dropped past a ring's worth).
  std::unordered_map<uint64_t, std::string> long_messages_;
  std::deque<uint64_t> long_message_order_;
};

}  // namespace px
