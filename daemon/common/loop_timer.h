// A one-shot timer on a libuv loop: runs `fire` once after ms milliseconds unless
// cancelled first. Destroying the object does not cancel it (no uv call may happen then,
// e.g. after the loop closed at exit); the uv handle frees itself once closed. Loop thread
// only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace px {

class LoopTimer {
 public:
  static std::shared_ptr<LoopTimer> start(uv_loop_t* loop, uint64_t ms, std::function<void()> fire);
  ~LoopTimer();
  // Does nothing once fired or cancelled.
  void cancel();

  struct Handle;

 private:
  LoopTimer() = default;
  Handle* handle_ = nullptr;  // null once fired or cancelled
};

}  // namespace px
