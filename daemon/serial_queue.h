// Runs one variable's shard work in submission order, one task at a time: large tasks on the
// pool (the loop stays responsive), small ones inline on the loop when nothing is queued
// (a pool hand-off costs two thread wake-ups). Loop thread only.
#pragma once

#include <deque>
#include <functional>
#include <memory>

#include "thread_pool.h"

namespace px {

class SerialQueue : public std::enable_shared_from_this<SerialQueue> {
 public:
  using PostToLoop = std::function<void(std::function<void()>)>;
  SerialQueue(ThreadPool& pool, PostToLoop post) : pool_(pool), post_(std::move(post)) {}

  // work runs off the loop when heavy; then runs on the loop afterwards.
  void push(bool heavy, std::function<void()> work, std::function<void()> then);

 private:
  struct Task {
    bool heavy;
    std::function<void()> work;
    std::function<void()> then;
  };
  void run_next();

  ThreadPool& pool_;
  PostToLoop post_;
  std::deque<Task> tasks_;
  bool running_ = false;
};

}  // namespace px
