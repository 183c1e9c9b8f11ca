#include "serial_queue.h"

namespace px {

void SerialQueue::push(bool heavy, std::function<void()> work, std::function<void()> then) {
  tasks_.push_back({heavy, std::move(work), std::move(then)});
  if (!running_) run_next();
}

void SerialQueue::run_next() {
  // running_ stays set while a task runs inline too, so a task's `then` that pushes more
  // work only queues it.
  running_ = true;
  while (!tasks_.empty()) {
    auto task = std::make_shared<Task>(std::move(tasks_.front()));
    tasks_.pop_front();
    if (!task->heavy) {
      task->work();
      if (task->then) task->then();
      continue;
    }
    auto self = shared_from_this();
    pool_.submit([self, task] {
      task->work();
      self->post_([self, task] {
        if (task->then) task->then();
        self->run_next();
      });
    });
    return;
  }
  running_ = false;
}

}  // namespace px
