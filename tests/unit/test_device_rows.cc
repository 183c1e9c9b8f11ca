// Sparse pull and push steps on device memory (daemon/sparse/device_rows_step.cc) through
// the scheduler and a real single-node sparse table, without a GPU: fake workers hold
// host-backed device regions and the test backend coalesces with sharding's coalesce()
// (what the CUB kernel equals bit for bit). Checked: pulled rows land in the worker's device
// memory, a device push is coalesced once on the "GPU" and applied with a host worker's push
// of the same step, a bad index is the pushing worker's PX_ERR_INDEX only, a failed copy
// back is the pulling worker's PX_ERR_INTERNAL, and loads and reads take device memory too.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/common/job.h"
#include "daemon/common/loop_thread.h"
#include "daemon/common/thread_pool.h"
#include "daemon/dense/scheduler.h"
#include "tests/unit/device_fakes.h"
#include "tests/unit/manual_loop.h"

using namespace px;
using pxtest::DeviceWorker;
using pxtest::entry;
using pxtest::HostBackend;

namespace {

constexpr uint64_t kRows = 100;
constexpr uint64_t kDim = 4;
constexpr uint64_t kRowsAt = 4096;  // where rows go in a worker's region or arena heap

// One node, two workers (device rank 0, device rank 1: each may give device or host memory)
// sharing a 100 x 4 SGD table (lr 1, zeros).
struct RowsFixture {
  RowsFixture() : pool(2), scheduler(pool, loop.poster()), job(std::make_shared<Job>("j", 2)) {
    job->mark_ready();
    SparseOptions options;
    options.learning_rate = 1.0;
    options.route = Route::kPs;
    Fingerprint f;
    f.sparse = true;
    f.count = kRows;
    f.dim = kDim;
    f.options = options.canonical();
    Variable& v = job->add("emb", f, "test");
    v.registered.assign(2, true);
    v.sparse = scheduler.sparse().create(*job, v, SparseShape{kRows, kDim}, options,
                                         [](int node) { return "node " + std::to_string(node); });
    var_id = v.id;
    for (int r = 0; r < 2; ++r) {
      auto w = std::make_shared<DeviceWorker>(r, 1 << 16, 0);
      job->members()[static_cast<size_t>(r)] = w;
      workers.push_back(std::move(w));
    }
    scheduler.set_gpu(&backend);
  }

  // Worker r's step of opcode over indices, with rows (a push's gradients; a pull's are
  // filled with 99 first), in device memory or in its arena.
  void submit(int r, Opcode opcode, uint64_t step, bool device, const std::vector<int64_t>& idx,
              const std::vector<float>& rows = {}) {
    DeviceWorker& w = *workers[static_cast<size_t>(r)];
    uint64_t index_bytes = idx.size() * sizeof(int64_t);
    uint64_t row_bytes = idx.size() * kDim * sizeof(float);
    float* index_at = device ? w.floats(0) : w.host_floats(0);
    float* rows_at = device ? w.floats(kRowsAt) : w.host_floats(kRowsAt);
    if (!idx.empty()) std::memcpy(index_at, idx.data(), index_bytes);
    for (size_t i = 0; i < idx.size() * kDim; ++i) rows_at[i] = rows.empty() ? 99.0f : rows[i];
    BufferRef in = device ? w.device(0, index_bytes) : w.host(0, index_bytes);
    BufferRef out = device ? w.device(kRowsAt, row_bytes) : w.host(kRowsAt, row_bytes);
    scheduler.submit(job, r, workers[static_cast<size_t>(r)],
                     entry(++request, var_id, opcode, step, in, out));
  }
  std::vector<float> pulled(int r, bool device, size_t n) const {
    DeviceWorker& w = *workers[static_cast<size_t>(r)];
    const float* at = device ? w.floats(kRowsAt) : w.host_floats(kRowsAt);
    return std::vector<float>(at, at + n * kDim);
  }
  bool all_done(size_t each) const { return pxtest::all_done(workers, each); }

  LoopThreadScope loop_thread;
  ManualLoop loop;
  ThreadPool pool;
  Scheduler scheduler;
  HostBackend backend;
  std::shared_ptr<Job> job;
  uint32_t var_id = 0;
  uint64_t request = 0;
  std::vector<std::shared_ptr<DeviceWorker>> workers;
};

// n rows of kDim values, row i all equal to values[i].
std::vector<float> rows_of(const std::vector<float>& values) {
  std::vector<float> rows;
  for (float v : values) rows.insert(rows.end(), kDim, v);
  return rows;
}

}  // namespace

TEST_CASE("device rows: pulls land in device memory, pushes are coalesced on the device") {
  RowsFixture fx;
  fx.submit(0, Opcode::kPullRows, 0, true, {5, 7, 5});
  fx.submit(1, Opcode::kPullRows, 0, false, {7});
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  CHECK(fx.pulled(0, true, 3) == rows_of({0, 0, 0}));  // the 99s were overwritten
  // Rank 0 pushes 5 twice from device memory: one coalesced row of 4 leaves it.
  fx.submit(0, Opcode::kPushRows, 0, true, {5, 7, 5}, rows_of({1, 2, 3}));
  fx.submit(1, Opcode::kPushRows, 0, false, {7}, rows_of({10}));
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(2); }));
  CHECK(fx.backend.coalesced == 1);
  fx.submit(0, Opcode::kPullRows, 1, true, {7, 5});
  fx.submit(1, Opcode::kPullRows, 1, false, {5, 7});
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(3); }));
  for (auto& w : fx.workers)
    for (const pxtest::Completion& c : w->done) {
      INFO(c.message);
      CHECK(c.status == PX_OK);
    }
  CHECK(fx.pulled(0, true, 2) == rows_of({-12, -4}));  // lr 1: minus the summed gradients
  CHECK(fx.pulled(1, false, 2) == rows_of({-4, -12}));
}

TEST_CASE("device rows: a bad index fails the device push of that worker only") {
  RowsFixture fx;
  fx.submit(0, Opcode::kPullRows, 0, true, {});  // an empty step on device memory
  fx.submit(1, Opcode::kPullRows, 0, false, {});
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  fx.submit(0, Opcode::kPushRows, 0, true, {5, 1000}, rows_of({1, 1}));
  fx.submit(1, Opcode::kPushRows, 0, false, {5}, rows_of({2}));
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(2); }));
  const pxtest::Completion& bad = fx.workers[0]->done[1];
  CHECK(bad.status == PX_ERR_INDEX);
  CHECK(bad.message ==
        "index 1000 at position 1 is outside [0, 100) in device rank 0's push step (variable "
        "'emb', push step 0); nothing of it was applied");
  CHECK(fx.workers[1]->done[1].status == PX_OK);
  fx.submit(0, Opcode::kPullRows, 1, true, {5});
  fx.submit(1, Opcode::kPullRows, 1, true, {5});
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(3); }));
  CHECK(fx.pulled(0, true, 1) == rows_of({-2}));  // only rank 1's push was applied
}

TEST_CASE("device rows: a failed copy back fails that pull only") {
  RowsFixture fx;
  fx.backend.fail_with = "cudaMemcpyAsync: cudaErrorIllegalAddress: an illegal memory access";
  fx.submit(0, Opcode::kPullRows, 0, true, {1});
  fx.submit(1, Opcode::kPullRows, 0, false, {1});
  REQUIRE(fx.loop.run_until([&] { return fx.all_done(1); }));
  CHECK(fx.workers[0]->done[0].status == PX_ERR_INTERNAL);
  CHECK(fx.workers[0]->done[0].message.find("gpu: the rows were not copied to device "
                                            "memory: cudaMemcpyAsync") != std::string::npos);
  CHECK(fx.workers[0]->done[0].message.find("(variable 'emb', pull step 0)") != std::string::npos);
  CHECK(fx.workers[1]->done[0].status == PX_OK);
}

TEST_CASE("device rows: loads from and reads into device memory") {
  RowsFixture fx;
  fx.submit(0, Opcode::kLoadRows, 0, true, {3, 9}, rows_of({7, 8}));
  REQUIRE(fx.loop.run_until([&] { return fx.workers[0]->done.size() == 1; }));
  fx.submit(1, Opcode::kReadRows, 0, true, {9, 3, 4});
  REQUIRE(fx.loop.run_until([&] { return fx.workers[1]->done.size() == 1; }));
  for (auto& w : fx.workers) {
    INFO(w->done[0].message);
    CHECK(w->done[0].status == PX_OK);
  }
  CHECK(fx.pulled(1, true, 3) == rows_of({8, 7, 0}));  // the 99s were overwritten
  // A bad index in a device load is that load's PX_ERR_INDEX.
  fx.submit(0, Opcode::kLoadRows, 0, true, {3, 100}, rows_of({1, 1}));
  REQUIRE(fx.loop.run_until([&] { return fx.workers[0]->done.size() == 2; }));
  CHECK(fx.workers[0]->done[1].status == PX_ERR_INDEX);
  CHECK(fx.workers[0]->done[1].message.find("index 100 at position 1") != std::string::npos);
}
