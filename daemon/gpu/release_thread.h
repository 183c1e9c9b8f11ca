// One thread of the GPU backend's own that gives device resources back, in order: closing a
// worker's IPC mapping (cudaIpcCloseMemHandle) and freeing pinned host memory
// (cudaFreeHost) may wait for the device, which may be running an NCCL step that waits for
// other nodes. Their last owner may be the daemon's loop (a step's end, a worker gone) or a
// pool thread that NCCL work needs, so neither waits: the owner's destructor queues the
// release here, in order, so what is queued after a release runs once it is done (a
// px_free is answered only then: a cudaFree before the daemon's close is undefined).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace px::gpu {

class ReleaseThread {
 public:
  ReleaseThread() : thread_([this] { run(); }) {}
  ~ReleaseThread() {  // after what was queued
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  ReleaseThread(const ReleaseThread&) = delete;
  ReleaseThread& operator=(const ReleaseThread&) = delete;

  // Runs release on the thread, after everything queued before it: so a function queued
  // last runs once what was queued before is released (GpuBackend::after_releases).
  void queue(std::function<void()> release) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(release));
    }
    wake_.notify_one();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> next = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      next();
      next = nullptr;  // what it captured goes here too, not under the lock
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace px::gpu
