// A loop the test thread drives: posted functions (from any thread) wait until the test
// runs them, so unit tests of loop-thread code need no libuv.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "daemon/common/offload.h"

namespace px {

class ManualLoop {
 public:
  void post(std::function<void()> fn) {
    // Notified under the lock: once the test thread has run this function it may destroy
    // the loop, which must not happen between the push and the notify.
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(fn));
    cv_.notify_one();
  }
  PostToLoop poster() {
    return [this](std::function<void()> fn) { post(std::move(fn)); };
  }
  // Runs posted functions until done() holds; false after 10 s without it.
  bool run_until(const std::function<bool()>& done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (!cv_.wait_until(lock, deadline, [this] { return !queue_.empty(); })) return false;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

}  // namespace px
