// Matches (variable, step) across a job's local workers and runs each complete step:
// validation, local reduction (inline when small, on the pool when large), fan-out of the
// result into every worker's output buffer, completions.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "job.h"
#include "shm_layout.h"

namespace px {

class Session;
class ThreadPool;

class Scheduler {
 public:
  using PostToLoop = std::function<void(std::function<void()>)>;
  Scheduler(ThreadPool& pool, PostToLoop post) : pool_(pool), post_(std::move(post)) {}

  // Loop thread only. The session is active and belongs to a ready job.
  void submit(const std::shared_ptr<Session>& session, const SubmitEntry& entry);

  // Completes every pending contribution of the variable with status (the message gets the
  // variable and step appended) and forgets those steps.
  void fail_variable(Variable& var, px_status status, const std::string& why);
  void fail_job(Job& job, px_status status, const std::string& why);

 private:
  struct Run;
  void reject(const std::shared_ptr<Session>& session, Variable& var, const SubmitEntry& entry,
              px_status status, const std::string& why);
  void launch(std::shared_ptr<Job> job, Variable& var, PendingStep step);
  static void execute_slice(Run& run, size_t begin, size_t end);
  static void finish(Run& run);

  ThreadPool& pool_;
  PostToLoop post_;
};

}  // namespace px
