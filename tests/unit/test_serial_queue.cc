// SerialQueue (daemon/common/serial_queue.h): one variable's shard work in submission order,
// one task at a time; light tasks inline on the loop when nothing is queued, heavy ones (and
// everything queued behind them) on the pool; every `then` on the loop after its work.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/common/serial_queue.h"
#include "daemon/common/thread_pool.h"

using namespace px;

namespace {

// A stand-in for the daemon's libuv loop: one thread running posted functions in order.
class TestLoop {
 public:
  TestLoop() : thread_([this] { run(); }) {}
  ~TestLoop() {
    post(nullptr);  // stop after everything posted before
    thread_.join();
  }
  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  // Runs fn on the loop and waits for it.
  void run_and_wait(std::function<void()> fn) {
    std::promise<void> ran;
    post([&] {
      fn();
      ran.set_value();
    });
    ran.get_future().wait();
  }
  std::thread::id id() const { return thread_.get_id(); }
  bool on_loop() const { return std::this_thread::get_id() == id(); }
  SerialQueue::PostToLoop poster() {
    return [this](std::function<void()> fn) { post(std::move(fn)); };
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!fn) return;
      fn();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
};

// Counts down on the loop; wait() returns once every expected `then` ran.
class Latch {
 public:
  explicit Latch(int n) : left_(n) {}
  void count_down() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--left_ == 0) cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return left_ <= 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int left_;
};

// Work entry/exit bookkeeping shared by the tasks of one test.
struct Trace {
  std::mutex mutex;
  std::vector<int> work_order, then_order;
  std::vector<std::thread::id> work_thread, then_thread;
  std::atomic<int> active{0};
  std::atomic<int> max_active{0};
  void begin_work() {
    int now = ++active;
    int seen = max_active.load();
    while (now > seen && !max_active.compare_exchange_weak(seen, now)) {
    }
  }
  void end_work() { --active; }
};

}  // namespace

TEST_CASE("serial queue: a light task on an idle queue runs inline, then right after it") {
  ThreadPool pool(2);
  TestLoop loop;
  auto queue = std::make_shared<SerialQueue>(pool, loop.poster());
  std::vector<std::string> events;
  loop.run_and_wait([&] {
    queue->push(
        false, [&] { events.push_back(loop.on_loop() ? "work on loop" : "work off loop"); },
        [&] { events.push_back(loop.on_loop() ? "then on loop" : "then off loop"); });
    events.push_back("push returned");
  });
  CHECK(events == std::vector<std::string>{"work on loop", "then on loop", "push returned"});
}

TEST_CASE("serial queue: a heavy task runs on the pool, its then on the loop") {
  ThreadPool pool(2);
  TestLoop loop;
  auto queue = std::make_shared<SerialQueue>(pool, loop.poster());
  std::promise<std::thread::id> work_thread;
  std::promise<bool> then_on_loop;
  std::atomic<bool> work_ran{false};
  loop.run_and_wait([&] {
    queue->push(
        true,
        [&] {
          work_ran = true;
          work_thread.set_value(std::this_thread::get_id());
        },
        [&] { then_on_loop.set_value(loop.on_loop() && work_ran.load()); });
    // push() only queued it: the pool cannot be done while this loop callback runs,
    // because the then needs the loop.
  });
  CHECK(work_thread.get_future().get() != loop.id());
  CHECK(then_on_loop.get_future().get());
}

TEST_CASE(
    "serial queue: work runs in submission order, one task at a time, each then after its "
    "work") {
  ThreadPool pool(4);
  TestLoop loop;
  auto queue = std::make_shared<SerialQueue>(pool, loop.poster());
  Trace trace;
  constexpr int kTasks = 500;
  Latch all_done(kTasks);
  std::mt19937 random(42);
  std::vector<bool> heavy(kTasks);
  for (int i = 0; i < kTasks; ++i) heavy[static_cast<size_t>(i)] = random() % 3 == 0;
  std::vector<std::atomic<bool>> work_done(kTasks);
  std::atomic<int> then_before_work{0}, then_off_loop{0};
  // Pushed in batches from several loop callbacks, so the chain goes back and forth between
  // the loop and the pool.
  for (int batch = 0; batch < kTasks; batch += 25) {
    loop.post([&, batch] {
      for (int i = batch; i < batch + 25; ++i) {
        queue->push(
            heavy[static_cast<size_t>(i)],
            [&, i] {
              trace.begin_work();
              {
                std::lock_guard<std::mutex> lock(trace.mutex);
                trace.work_order.push_back(i);
              }
              work_done[static_cast<size_t>(i)] = true;
              trace.end_work();
            },
            [&, i] {
              if (!work_done[static_cast<size_t>(i)].load()) ++then_before_work;
              if (!loop.on_loop()) ++then_off_loop;
              all_done.count_down();
            });
      }
    });
  }
  all_done.wait();
  std::vector<int> expected(kTasks);
  for (int i = 0; i < kTasks; ++i) expected[static_cast<size_t>(i)] = i;
  CHECK(trace.work_order == expected);
  CHECK(trace.max_active.load() == 1);
  CHECK(then_before_work.load() == 0);
  CHECK(then_off_loop.load() == 0);
}

TEST_CASE("serial queue: the thens of a run of heavy tasks come in submission order") {
  ThreadPool pool(4);
  TestLoop loop;
  auto queue = std::make_shared<SerialQueue>(pool, loop.poster());
  constexpr int kTasks = 200;
  Latch all_done(kTasks);
  std::vector<int> thens;  // loop thread only
  loop.run_and_wait([&] {
    for (int i = 0; i < kTasks; ++i)
      queue->push(
          true, [] {},
          [&, i] {
            thens.push_back(i);
            all_done.count_down();
          });
  });
  all_done.wait();
  std::vector<int> expected(kTasks);
  for (int i = 0; i < kTasks; ++i) expected[static_cast<size_t>(i)] = i;
  loop.run_and_wait([&] { CHECK(thens == expected); });
}

TEST_CASE("serial queue: a light task queued behind a heavy one waits its turn") {
  ThreadPool pool(2);
  TestLoop loop;
  auto queue = std::make_shared<SerialQueue>(pool, loop.poster());
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> light_ran{false};
  std::atomic<bool> light_saw_heavy_done{false};
  std::atomic<bool> heavy_done{false};
  std::promise<bool> light_on_loop;
  Latch done(2);
  loop.run_and_wait([&] {
    queue->push(
        true,
        [&] {
          released.wait();
          heavy_done = true;
        },
        [&] { done.count_down(); });
    queue->push(
        false,
        [&] {
          light_saw_heavy_done = heavy_done.load();
          light_on_loop.set_value(loop.on_loop());
          light_ran = true;
        },
        [&] { done.count_down(); });
    // A light task on an idle queue would have run inside push(): this one must wait.
    CHECK_FALSE(light_ran.load());
  });
  CHECK_FALSE(light_ran.load());  // the heavy task is still held
  release.set_value();
  done.wait();
  CHECK(light_saw_heavy_done.load());
  CHECK_FALSE(light_on_loop.get_future().get());  // the chain stayed on the pool
}

TEST_CASE("serial queue: work pushed from a then is queued, not run inside it") {
  ThreadPool pool(2);
  TestLoop loop;
  auto queue = std::make_shared<SerialQueue>(pool, loop.poster());
  std::vector<std::string> events;  // loop thread only (every task here is light)
  loop.run_and_wait([&] {
    queue->push(
        false, [&] { events.push_back("work 1"); },
        [&] {
          events.push_back("then 1 begins");
          queue->push(
              false, [&] { events.push_back("work 2"); }, [&] { events.push_back("then 2"); });
          events.push_back("then 1 ends");
        });
  });
  CHECK(events ==
        std::vector<std::string>{"work 1", "then 1 begins", "then 1 ends", "work 2", "then 2"});
}

TEST_CASE("serial queue: a task that fails reports through its then, later tasks still run") {
  // The queue has no error channel of its own: a task's work records its status and its
  // then reports it (the checkpoint write does this). A failed task must not stop the queue.
  ThreadPool pool(2);
  TestLoop loop;
  auto queue = std::make_shared<SerialQueue>(pool, loop.poster());
  std::vector<std::string> reports;  // loop thread only
  Latch done(4);
  loop.run_and_wait([&] {
    for (int i = 0; i < 4; ++i) {
      auto status = std::make_shared<std::string>("ok");
      bool heavy = i % 2 == 1;
      queue->push(
          heavy,
          [status, i] {
            if (i == 1 || i == 2) *status = "failed " + std::to_string(i);
          },
          [&, status, i] {
            reports.push_back(std::to_string(i) + ": " + *status);
            done.count_down();
          });
    }
  });
  done.wait();
  loop.run_and_wait([&] {
    std::sort(reports.begin(), reports.end());  // thens may interleave across loop/pool runs
    CHECK(reports == std::vector<std::string>{"0: ok", "1: failed 1", "2: failed 2", "3: ok"});
  });
}

TEST_CASE("serial queue: it keeps itself alive while its chain runs on the pool") {
  ThreadPool pool(2);
  TestLoop loop;
  auto queue = std::make_shared<SerialQueue>(pool, loop.poster());
  std::weak_ptr<SerialQueue> weak = queue;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  Latch done(2);
  std::atomic<int> ran{0};
  loop.run_and_wait([&] {
    queue->push(
        true,
        [&] {
          released.wait();
          ++ran;
        },
        [&] { done.count_down(); });
    queue->push(
        false, [&] { ++ran; }, [&] { done.count_down(); });
    queue.reset();  // the owner drops it while the heavy task waits
  });
  CHECK_FALSE(weak.expired());
  release.set_value();
  done.wait();
  CHECK(ran.load() == 2);
}
