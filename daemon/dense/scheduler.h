// Matches (variable, step) across a job's local workers and runs each complete step:
// validation, local reduction (inline when small, on the pool when large), then on a
// cluster the ring allreduce across nodes, then the result into every worker's output
// buffer, and completions.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/common/completer.h"
#include "daemon/common/job.h"
#include "daemon/common/offload.h"
#include "daemon/sparse/sparse_router.h"
#include "transport/collectives/collective_transport.h"
#include "transport/ipc/shm_layout.h"

namespace px {

class Scheduler {
 public:
  Scheduler(ThreadPool& pool, PostToLoop post) : offload_(pool, post), sparse_(pool, post) {}

  // Cross-node stage: every complete local step also runs a ring allreduce over transport.
  void set_cluster_transport(CollectiveTransport* transport, size_t chunk_bytes) {
    fabric_ = transport;
    chunk_bytes_ = chunk_bytes;
    sparse_.set_fabric(transport, chunk_bytes);
  }
  SparseRouter& sparse() { return sparse_; }

  // An entry from worker, local rank `rank` of the ready job: checked (admission.h), then
  // matched with the other local workers' entries of its step. Loop thread only.
  void submit(const std::shared_ptr<Job>& job, int rank, const std::shared_ptr<Completer>& worker,
              const SubmitEntry& entry);

  // Completes every pending contribution of the variable with status (the message gets the
  // variable and step appended) and forgets those steps.
  void fail_variable(Variable& var, px_status status, const std::string& why);
  void fail_job(Job& job, px_status status, const std::string& why);

  // A worker's px_request_cancel (or a timed-out px_barrier): if the request waits in a step
  // for other local workers, completes it with PX_ERR_CANCELLED, fails that step for the
  // others with a message naming the worker and reason (stored in *message), and returns
  // true. False if it is not waiting (running, done, or unknown).
  bool withdraw(Job& job, int local_rank, Completer& worker, uint64_t request_id,
                const std::string& reason, std::string* message);
  // Fails, with PX_ERR_TIMEOUT naming the workers that never came, every step of the job
  // that some local workers submitted more than stall_ns ago. Returns the messages.
  std::vector<std::string> fail_stalled(Job& job, int64_t now_ns, int64_t stall_ns);

 private:
  struct Run;
  using SliceWork = void (*)(Run& run, size_t begin, size_t end);
  void launch(std::shared_ptr<Job> job, Variable& var, uint64_t step, PendingStep pending);
  // Runs work over [0, count) (inline when small, else in slices on the pool), then `then`
  // on the loop thread.
  void run_sliced(const std::shared_ptr<Run>& run, SliceWork work, std::function<void()> then);
  void cross_node(const std::shared_ptr<Run>& run);
  void after_cross_node(const std::shared_ptr<Run>& run, bool ok, const std::string& error);
  static void reduce_and_fan_out(Run& run, size_t begin, size_t end);
  static void reduce_only(Run& run, size_t begin, size_t end);
  static void scale_and_fan_out(Run& run, size_t begin, size_t end);
  static void finish(Run& run, px_status status, const std::string& message);

  Offload offload_;
  CollectiveTransport* fabric_ = nullptr;
  size_t chunk_bytes_ = 1 << 20;
  SparseRouter sparse_;
};

}  // namespace px
