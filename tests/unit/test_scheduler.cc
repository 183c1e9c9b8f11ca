// Scheduler (daemon/dense/scheduler.h) without sessions or fabric: fake workers (Completer)
// submit entries; the checks of admission.h answer refused entries at once, steps are
// matched across the local workers, reduced (inline or on the pool) and completed. The
// matcher (step_matcher.h) is also tested alone: it completes no step, so what it hands back
// and what it leaves pending can be checked directly.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/completer.h"
#include "daemon/common/job.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/thread_pool.h"
#include "daemon/dense/scheduler.h"
#include "daemon/dense/step_matcher.h"
#include "tests/unit/manual_loop.h"
#include "tests/unit/scheduler_entries.h"
#include "transport/ipc/control_channel.h"

using namespace px;
using pxtest::Completion;
using pxtest::entry;

namespace {

class FakeWorker : public Completer {
 public:
  explicit FakeWorker(int rank) : rank_(rank) {
    std::string error;
    REQUIRE(SharedArena::create(4 << 20, 16, &arena_, &error));
  }
  void complete(uint64_t request_id, px_status status, const std::string& message) override {
    done.push_back({request_id, status, message});
  }
  std::string label() const override { return "fake rank " + std::to_string(rank_); }
  const SharedArena& arena() const override { return arena_; }

  // A buffer of bytes at heap offset `at`.
  BufferRef buffer(uint64_t at, uint64_t bytes) const {
    return BufferRef{arena_.header().heap_offset + at, bytes,
                     static_cast<uint32_t>(MemoryKind::kHostArena), 0};
  }
  float* floats(const BufferRef& ref) const {
    return reinterpret_cast<float*>(arena_.base() + ref.offset);
  }

  std::vector<Completion> done;

 private:
  int rank_;
  SharedArena arena_;
};

struct Fixture {
  explicit Fixture(int workers, uint64_t count)
      : pool(2),
        scheduler(pool, [this](std::function<void()> fn) { loop.post(std::move(fn)); }),
        job(std::make_shared<Job>("j", workers)) {
    job->mark_ready();
    Fingerprint f;
    f.dtype = DType::kF32;
    f.count = count;
    f.op = ReduceOp::kSum;
    Variable& v = job->add("v", f, "test");
    v.registered.assign(static_cast<size_t>(workers), true);
    var_id = v.id;
    for (int r = 0; r < workers; ++r) {
      auto w = std::make_shared<FakeWorker>(r);
      job->members()[static_cast<size_t>(r)] = w;
      this->workers.push_back(std::move(w));
    }
  }
  void submit(int rank, const SubmitEntry& e) {
    scheduler.submit(job, rank, workers[static_cast<size_t>(rank)], e);
  }
  bool all_done(size_t each) const {
    for (auto& w : workers)
      if (w->done.size() < each) return false;
    return true;
  }

  LoopThreadScope loop_thread;  // the test thread is the loop: loop-only checks hold
  ManualLoop loop;
  ThreadPool pool;
  Scheduler scheduler;
  std::shared_ptr<Job> job;
  uint32_t var_id = 0;
  std::vector<std::shared_ptr<FakeWorker>> workers;
};

// Every worker adds rank + 1 to each element; returns the request ids' step run to the end.
void allreduce_step(Fixture& fx, uint64_t count, uint64_t step) {
  uint64_t bytes = count * sizeof(float);
  for (size_t r = 0; r < fx.workers.size(); ++r) {
    FakeWorker& w = *fx.workers[r];
    BufferRef in = w.buffer(0, bytes), out = w.buffer(bytes, bytes);
    for (uint64_t i = 0; i < count; ++i) w.floats(in)[i] = static_cast<float>(r + 1 + i % 7);
    fx.submit(static_cast<int>(r), entry(100 + step, fx.var_id, Opcode::kAllreduce, step, in, out));
  }
}

}  // namespace

TEST_CASE("scheduler: a small allreduce completes inline once every local worker submitted") {
  Fixture fx(3, 16);
  allreduce_step(fx, 16, 0);
  REQUIRE(fx.all_done(1));
  for (auto& w : fx.workers) {
    CHECK(w->done[0].status == PX_OK);
    CHECK(w->done[0].request_id == 100);
    const float* out = w->floats(w->buffer(64, 64));
    for (int i = 0; i < 16; ++i) CHECK(out[i] == doctest::Approx(6 + 3 * (i % 7)));
  }
}

TEST_CASE("scheduler: a large allreduce is reduced on the pool and completes on the loop") {
  uint64_t count = 256 * 1024;  // 1 MiB per worker: sliced over the pool
  Fixture fx(2, count);
  allreduce_step(fx, count, 0);
  CHECK(!fx.all_done(1));  // nothing completes before the loop runs the pool's result
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  for (auto& w : fx.workers) {
    CHECK(w->done[0].status == PX_OK);
    const float* out = w->floats(w->buffer(count * 4, count * 4));
    for (uint64_t i = 0; i < count; i += 4099) CHECK(out[i] == 3 + 2 * (i % 7));
  }
}

TEST_CASE("scheduler: refused entries are answered at once, each with its cause") {
  Fixture fx(2, 16);
  FakeWorker& w = *fx.workers[0];
  BufferRef in = w.buffer(0, 64), out = w.buffer(64, 64);
  fx.submit(0, entry(1, 99, Opcode::kAllreduce, 0, in, out));
  REQUIRE(w.done.size() == 1);
  CHECK(w.done[0].status == PX_ERR_NOT_FOUND);
  CHECK(w.done[0].message.find("fake rank 0") != std::string::npos);

  fx.submit(0, entry(2, fx.var_id, Opcode::kPullRows, 0, in, out));
  REQUIRE(w.done.size() == 2);
  CHECK(w.done[1].status == PX_ERR_PROTOCOL);

  fx.submit(0, entry(3, fx.var_id, Opcode::kAllreduce, 5, in, out));
  REQUIRE(w.done.size() == 3);
  CHECK(w.done[2].status == PX_ERR_PROTOCOL);
  CHECK(w.done[2].message.find("step 0 was next") != std::string::npos);

  fx.job->mark_broken("worker 1 died");
  fx.submit(0, entry(4, fx.var_id, Opcode::kAllreduce, 0, in, out));
  REQUIRE(w.done.size() == 4);
  CHECK(w.done[3].status == PX_ERR_PEER_LOST);
  CHECK(fx.workers[1]->done.empty());
}

TEST_CASE("scheduler: one worker's bad buffer fails the step for every local worker") {
  Fixture fx(2, 16);
  FakeWorker& w0 = *fx.workers[0];
  FakeWorker& w1 = *fx.workers[1];
  fx.submit(0, entry(1, fx.var_id, Opcode::kAllreduce, 0, w0.buffer(0, 64), w0.buffer(64, 64)));
  CHECK(w0.done.empty());  // waits for rank 1
  fx.submit(1, entry(2, fx.var_id, Opcode::kAllreduce, 0, w1.buffer(0, 60), w1.buffer(64, 60)));
  REQUIRE(fx.all_done(1));
  CHECK(w0.done[0].status == PX_ERR_INVALID);
  CHECK(w1.done[0].status == PX_ERR_INVALID);
  CHECK(w0.done[0].message.find("fake rank 1 gave an invalid buffer") != std::string::npos);
  CHECK(fx.job->find(fx.var_id)->pending.empty());
  // The next step goes on normally.
  allreduce_step(fx, 16, 1);
  REQUIRE(fx.all_done(2));
  CHECK(w0.done[1].status == PX_OK);
}

TEST_CASE("scheduler: a withdrawn request fails its step for the others") {
  Fixture fx(2, 16);
  FakeWorker& w0 = *fx.workers[0];
  fx.submit(0, entry(7, fx.var_id, Opcode::kAllreduce, 0, w0.buffer(0, 64), w0.buffer(64, 64)));
  std::string message;
  CHECK(!fx.scheduler.withdraw(*fx.job, 0, w0, 8, "nope", &message));
  CHECK(fx.scheduler.withdraw(*fx.job, 0, w0, 7, "changed my mind", &message));
  REQUIRE(w0.done.size() == 1);
  CHECK(w0.done[0].status == PX_ERR_CANCELLED);
  CHECK(message.find("fake rank 0 withdrew from its allreduce") != std::string::npos);
  FakeWorker& w1 = *fx.workers[1];
  fx.submit(1, entry(9, fx.var_id, Opcode::kAllreduce, 0, w1.buffer(0, 64), w1.buffer(64, 64)));
  REQUIRE(w1.done.size() == 1);
  CHECK(w1.done[0].status == PX_ERR_CANCELLED);
}

TEST_CASE("scheduler: a stalled step names the workers that never came") {
  Fixture fx(2, 16);
  FakeWorker& w0 = *fx.workers[0];
  fx.submit(0, entry(1, fx.var_id, Opcode::kAllreduce, 0, w0.buffer(0, 64), w0.buffer(64, 64)));
  auto failed = fx.scheduler.fail_stalled(*fx.job, monotonic_ns() + 2'000'000'000, 1'000'000'000);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].message.find("fake rank 1 did not submit") != std::string::npos);
  CHECK(failed[0].step == 0);
  CHECK(!failed[0].variable.empty());
  REQUIRE(w0.done.size() == 1);
  CHECK(w0.done[0].status == PX_ERR_TIMEOUT);
}

TEST_CASE("scheduler: an opcode is valid only for its kind of variable") {
  Fixture fx(1, 16);
  FakeWorker& w = *fx.workers[0];
  BufferRef in = w.buffer(0, 64), out = w.buffer(64, 64);
  for (uint16_t opcode : {0, 2, 3, 6, 12, 0xffff}) {
    SubmitEntry e = entry(opcode, fx.var_id, Opcode::kAllreduce, 0, in, out);
    e.opcode = opcode;
    fx.submit(0, e);
    REQUIRE(!w.done.empty());
    CHECK(w.done.back().status == PX_ERR_PROTOCOL);
  }
  fx.submit(0, entry(50, 0, Opcode::kAllreduce, 0, in, out));  // the barrier takes barriers only
  CHECK(w.done.back().status == PX_ERR_PROTOCOL);
  fx.submit(0, entry(51, 0, Opcode::kBarrier, 0, in, out));
  CHECK(w.done.back().request_id == 51);
  CHECK(w.done.back().status == PX_OK);
}

TEST_CASE("step matcher: a step is handed back when the last local worker came, not before") {
  Fixture fx(3, 16);
  Variable& var = *fx.job->find(fx.var_id);
  std::optional<PendingStep> step;
  for (int r = 0; r < 3; ++r) {
    FakeWorker& w = *fx.workers[static_cast<size_t>(r)];
    CHECK(!step);
    step = match_step(*fx.job, var, r, fx.workers[static_cast<size_t>(r)],
                      entry(10 + static_cast<uint64_t>(r), fx.var_id, Opcode::kAllreduce, 0,
                            w.buffer(0, 64), w.buffer(64, 64)),
                      "");
    if (r < 2) CHECK(var.pending.size() == 1);
  }
  REQUIRE(step);
  CHECK(var.pending.empty());  // taken out: the executor owns it now
  CHECK(step->arrived == 3);
  REQUIRE(step->by_rank.size() == 3);
  for (size_t r = 0; r < 3; ++r) {
    REQUIRE(step->by_rank[r]);
    CHECK(step->by_rank[r]->request_id == 10 + r);
    CHECK(step->by_rank[r]->worker == fx.workers[r]);
    CHECK(step->by_rank[r]->out.offset == fx.workers[r]->buffer(64, 64).offset);
  }
  for (auto& w : fx.workers) CHECK(w->done.empty());  // the matcher completes no good step
}

TEST_CASE("step matcher: opcodes and step numbers match apart") {
  Fixture fx(2, 16);
  Variable& var = *fx.job->find(fx.var_id);
  FakeWorker& w0 = *fx.workers[0];
  BufferRef in = w0.buffer(0, 64), out = w0.buffer(64, 64);
  CHECK(!match_step(*fx.job, var, 0, fx.workers[0],
                    entry(1, fx.var_id, Opcode::kAllreduce, 0, in, out), ""));
  CHECK(!match_step(*fx.job, var, 0, fx.workers[0],
                    entry(2, fx.var_id, Opcode::kAllreduce, 1, in, out), ""));
  CHECK(!match_step(*fx.job, var, 0, fx.workers[0],
                    entry(3, fx.var_id, Opcode::kBroadcast, 0, in, out), ""));
  CHECK(var.pending.size() == 3);
  FakeWorker& w1 = *fx.workers[1];
  auto step = match_step(
      *fx.job, var, 1, fx.workers[1],
      entry(4, fx.var_id, Opcode::kBroadcast, 0, w1.buffer(0, 64), w1.buffer(64, 64)), "");
  REQUIRE(step);
  CHECK(step->by_rank[0]->request_id == 3);
  CHECK(var.pending.size() == 2);
}

TEST_CASE("step matcher: a failed step answers its late arrivals, then is forgotten") {
  Fixture fx(3, 16);
  Variable& var = *fx.job->find(fx.var_id);
  auto submit = [&](int r, uint64_t id, const std::string& invalid) {
    FakeWorker& w = *fx.workers[static_cast<size_t>(r)];
    return match_step(
        *fx.job, var, r, fx.workers[static_cast<size_t>(r)],
        entry(id, fx.var_id, Opcode::kAllreduce, 0, w.buffer(0, 64), w.buffer(64, 64)), invalid);
  };
  CHECK(!submit(0, 1, ""));
  CHECK(!submit(1, 2, "bad buffer"));
  REQUIRE(fx.workers[0]->done.size() == 1);
  CHECK(fx.workers[0]->done[0].status == PX_ERR_INVALID);
  CHECK(fx.workers[0]->done[0].message == "bad buffer");
  REQUIRE(fx.workers[1]->done.size() == 1);
  CHECK(var.pending.size() == 1);  // kept: rank 2 has yet to come
  CHECK(!submit(2, 3, ""));        // gets the failure, not a new step
  REQUIRE(fx.workers[2]->done.size() == 1);
  CHECK(fx.workers[2]->done[0].status == PX_ERR_INVALID);
  CHECK(var.pending.empty());
}

TEST_CASE("step matcher: failing a variable completes its waiting contributions, named") {
  Fixture fx(2, 16);
  Variable& var = *fx.job->find(fx.var_id);
  FakeWorker& w0 = *fx.workers[0];
  CHECK(!match_step(*fx.job, var, 0, fx.workers[0],
                    entry(5, fx.var_id, Opcode::kAllreduce, 0, w0.buffer(0, 64), w0.buffer(64, 64)),
                    ""));
  fail_pending_steps(var, PX_ERR_MISMATCH, "fingerprints differ");
  REQUIRE(w0.done.size() == 1);
  CHECK(w0.done[0].request_id == 5);
  CHECK(w0.done[0].status == PX_ERR_MISMATCH);
  CHECK(w0.done[0].message == "fingerprints differ (variable 'v', step 0)");
  CHECK(var.pending.empty());
  CHECK(!withdraw_from_step(*fx.job, 0, w0, 5, "late", nullptr));  // nothing waits any more
}
