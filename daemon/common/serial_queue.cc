#include "daemon/common/serial_queue.h"

#include "daemon/common/loop_thread.h"
namespace px {

void SerialQueue::push(bool heavy, std::function<void()> work, std::function<void()> then) {
  PX_ASSERT_LOOP_THREAD();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back({heavy, std::move(work), std::move(then)});
    if (running_) return;
    running_ = true;
  }
  run_on_loop();
}

// Light tasks run here until a heavy one moves the chain to the pool. running_ stays set
// while a task runs inline too, so a task's `then` that pushes more work only queues it.
void SerialQueue::run_on_loop() {
  for (;;) {
    Task task;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (tasks_.empty()) {
        running_ = false;
        return;
      }
      if (tasks_.front().heavy) break;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task.work();
    if (task.then) task.then();
  }
  auto self = shared_from_this();
  pool_.submit([self] { self->run_on_pool(); });
}

void SerialQueue::run_on_pool() {
  for (;;) {
    auto task = std::make_shared<Task>();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (tasks_.empty()) {
        running_ = false;
        return;
      }
      *task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task->work();
    if (task->then) post_([task] { task->then(); });
  }
}

}  // namespace px
