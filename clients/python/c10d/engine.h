// The backend's completions: one thread per process group that sleeps in poll() on the
// client's completion fd (px_client_fd) and a wake-up eventfd, takes what the daemon posted
// (px_progress, px_test), copies results out and completes the Work. No thread per
// operation, nothing blocks on a request. Each operation has a deadline (the process
// group's timeout, or the collective's own): past it its Work fails with a message naming
// it, and its request and arena blocks are kept until the daemon is done with them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "clients/python/c10d/px_library.h"
#include "clients/python/c10d/work.h"

namespace pxc10d {

// One submitted collective, from its submission to its completion.
struct Operation {
  c10::intrusive_ptr<ParallaxWork> work;
  px_request* request = nullptr;  // null: nothing was submitted (complete at once)
  std::vector<void*> arena;       // px_alloc blocks, freed once the daemon is done
  std::function<void()> deliver;  // copies the result into the outputs (may throw)
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
  bool expired = false;  // failed at its deadline; still waiting for the daemon
};

class Engine {
 public:
  Engine(const PxLibrary& px, px_client* client);
  ~Engine();  // stops the thread; operations still pending fail

  // Takes the operation; its Work completes from the engine's thread.
  void add(Operation op);
  px_client* client() const { return client_; }

 private:
  struct State;
  std::shared_ptr<State> state_;
  px_client* client_;
};

}  // namespace pxc10d
