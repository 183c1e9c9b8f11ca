// Runs one variable's shard work in submission order, one task at a time: large tasks on the
// pool (the loop stays responsive), small ones inline on the loop when nothing is queued.
// Once on the pool, the chain stays there: each task's `then` is posted to the loop and the
// pool thread goes straight on with the next task, so a run of queued tasks (an apply, then
// the pulls it released) costs no loop round trip per task. A task's `then` may therefore
// run after the next task's work started. push() is called on the loop thread.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "daemon/common/offload.h"
#include "daemon/common/thread_pool.h"

namespace px {

class SerialQueue : public std::enable_shared_from_this<SerialQueue> {
 public:
  // Not Offload: tasks keep their order and a chain stays on the pool. The alias is the
  // one PostToLoop (offload.h), kept for the callers that name it through SerialQueue.
  using PostToLoop = px::PostToLoop;
  SerialQueue(ThreadPool& pool, PostToLoop post) : pool_(pool), post_(std::move(post)) {}

  // work runs off the loop when heavy; then runs on the loop afterwards.
  void push(bool heavy, std::function<void()> work, std::function<void()> then);

 private:
  struct Task {
    bool heavy;
    std::function<void()> work;
    std::function<void()> then;
  };
  void run_on_loop();
  void run_on_pool();

  ThreadPool& pool_;
  PostToLoop post_;
  std::mutex mutex_;
  std::deque<Task> tasks_;
  bool running_ = false;  // a task runs (loop or pool); new ones wait their turn
};

}  // namespace px
