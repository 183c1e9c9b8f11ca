// "Loop thread only", checked: the thread that runs the event loop records itself
// (LoopThreadScope), and PX_ASSERT_LOOP_THREAD() at the entry of a loop-only function
// aborts, naming the function, when another thread calls it. It costs a relaxed load and a
// thread-id compare, so it stays on in release builds, which are what the test suite runs.
// Where no loop thread is recorded (unit tests that drive a class from their own threads)
// it checks nothing.
#pragma once

#include <atomic>
#include <thread>

namespace px {

namespace detail {
inline std::atomic<std::thread::id> loop_thread_id{};
[[noreturn]] void loop_thread_violation(const char* function, const char* file, int line);
}  // namespace detail

// Records the calling thread as the loop thread while it lives (one at a time).
class LoopThreadScope {
 public:
  LoopThreadScope() { detail::loop_thread_id.store(std::this_thread::get_id()); }
  ~LoopThreadScope() { detail::loop_thread_id.store(std::thread::id()); }
  LoopThreadScope(const LoopThreadScope&) = delete;
  LoopThreadScope& operator=(const LoopThreadScope&) = delete;
};

// True on the loop thread, and anywhere while no loop thread is recorded.
inline bool on_loop_thread() {
  std::thread::id loop = detail::loop_thread_id.load(std::memory_order_relaxed);
  return loop == std::thread::id() || loop == std::this_thread::get_id();
}

}  // namespace px

#define PX_ASSERT_LOOP_THREAD()                                          \
  do {                                                                   \
    if (!::px::on_loop_thread())                                         \
      ::px::detail::loop_thread_violation(__func__, __FILE__, __LINE__); \
  } while (0)
