// The GPU backend's release thread (daemon/gpu/release_thread.h): what closes a worker's
// IPC mappings and frees pinned host memory off the loop and the pool. Plain closures stand
// in for the CUDA calls: the order, and where the work (and what it holds) ends.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/gpu/release_thread.h"

using px::gpu::ReleaseThread;

TEST_CASE("gpu: release thread: releases run in order on its thread; what follows, once they ran") {
  ReleaseThread releases;
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  // The first release blocks (a close waiting for the device): the caller never waits.
  releases.queue([&, opened] {
    opened.wait();
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(1);
    threads.push_back(std::this_thread::get_id());
  });
  for (int i = 2; i <= 4; ++i)
    releases.queue([&, i] {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  std::promise<std::vector<int>> done;
  releases.queue([&] {
    std::lock_guard<std::mutex> lock(mutex);
    done.set_value(order);  // what was released before this was queued
  });
  auto seen = done.get_future();
  CHECK(seen.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
  gate.set_value();
  REQUIRE(seen.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(seen.get() == std::vector<int>{1, 2, 3, 4});
  std::lock_guard<std::mutex> lock(mutex);
  REQUIRE(threads.size() == 4);
  for (std::thread::id id : threads) {
    CHECK(id == threads[0]);
    CHECK(id != std::this_thread::get_id());
  }
}

TEST_CASE("gpu: release thread: what a release holds ends there; the destructor drains") {
  std::atomic<int> released{0};
  std::thread::id ended_on;
  struct Held {
    std::atomic<int>* released;
    std::thread::id* on;
    ~Held() {
      *on = std::this_thread::get_id();
      ++*released;
    }
  };
  {
    ReleaseThread releases;
    for (int i = 0; i < 100; ++i) {
      auto held = std::make_shared<Held>(&released, &ended_on);
      releases.queue([held = std::move(held)] {});  // the only reference
    }
  }  // joined after the 100
  CHECK(released == 100);
  CHECK(ended_on != std::this_thread::get_id());
}
