// The service issue's job-end scenarios.
//
// job-churn: one short job of the kind a shared cluster runs by the hundred (the service
// issue's job-end test): a sparse table filled with px_load_rows, one pull/push step
// checked, a dense allreduce, then a barrier so that no worker leaves while another still
// waits for its part. Sized by --rows so that state a daemon failed to free after the job
// would show in its resident memory.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

constexpr uint64_t kChurnDim = 16;
constexpr size_t kLoadBatch = 16384;
constexpr size_t kStepRows = 512;

float loaded(int64_t row, uint64_t col) {
  return float(row % 1000) + float(col) / 32.0f;
}

}  // namespace

int run_job_churn(px_client* c, const Flags& flags) {
  uint64_t rows = flags.u64("rows");
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.route = PX_ROUTE_PS;
  o.optimizer = PX_OPT_ADAGRAD;  // state per row, as real tables have
  o.learning_rate = 0.5;
  px_var* table = nullptr;
  check(px_register_sparse(c, "churn", PX_F32, rows, kChurnDim, &o, &table), "register 'churn'");
  int world = world_size(c);
  int rank = world_of(c).rank;
  // Each worker loads every world-th batch of rows: the whole table is written.
  std::vector<int64_t> idx;
  std::vector<float> values;
  for (uint64_t begin = uint64_t(rank) * kLoadBatch; begin < rows;
       begin += uint64_t(world) * kLoadBatch) {
    idx.clear();
    values.clear();
    for (uint64_t r = begin; r < rows && r < begin + kLoadBatch; ++r) {
      idx.push_back(int64_t(r));
      for (uint64_t col = 0; col < kChurnDim; ++col) values.push_back(loaded(int64_t(r), col));
    }
    load_rows_ok(table, idx.data(), idx.size(), values.data(), "load");
  }
  check(px_barrier(c, 30000), "px_barrier after loading");
  // One step on rows spread over every shard: the pull sees what was loaded.
  idx.clear();
  for (size_t j = 0; j < kStepRows; ++j) idx.push_back(int64_t((j * 7919 + 13) % rows));
  std::vector<float> got(kStepRows * kChurnDim);
  pull_rows_ok(table, idx.data(), idx.size(), got.data(), "pull");
  for (size_t j = 0; j < kStepRows; ++j)
    for (uint64_t col = 0; col < kChurnDim; ++col)
      if (got[j * kChurnDim + col] != loaded(idx[j], col))
        die("row " + std::to_string(idx[j]) + " pulled as " +
            std::to_string(got[j * kChurnDim + col]));
  std::vector<float> grads(kStepRows * kChurnDim, 0.25f);
  push_rows_ok(table, idx.data(), idx.size(), grads.data(), "push");
  px_var* dense = nullptr;
  check(px_register_dense(c, "churn-dense", PX_F32, 65536, PX_SUM, &dense), "register dense");
  std::vector<float> in(65536, 1.0f), out(65536);
  px_request* r = nullptr;
  check(px_allreduce(dense, in.data(), out.data(), &r), "px_allreduce");
  check_wait(r, "allreduce");
  if (out[0] != float(world) || out[65535] != float(world))
    die("allreduce gave " + std::to_string(out[0]));
  check(px_barrier(c, 30000), "px_barrier before leaving");
  printf("ok rank %d job-churn\n", rank);
  return 0;
}

// leave-early (one worker per node): after a barrier, the last node's worker waits a second
// and leaves with px_disconnect; every other worker starts an allreduce at once, with a 30 s
// deadline, which is under way across the nodes, waiting for the one that leaves. It must
// fail with PX_ERR_PEER_LOST naming that worker within seconds (the daemons' grace for
// operations under way), and the next step at once.
int run_leave_early(px_client* c) {
  px_world_info w = world_of(c);
  px_var* v = nullptr;
  check(px_register_dense(c, "after-leave", PX_F32, 1024, PX_SUM, &v), "register");
  check(px_barrier(c, 30000), "px_barrier");
  if (w.rank == w.world_size - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    printf("ok rank %d left\n", w.rank);
    return 0;  // main disconnects
  }
  std::vector<float> in(1024, 1.0f), out(1024);
  for (int step = 0; step < 2; ++step) {
    px_request* r = nullptr;
    auto start = std::chrono::steady_clock::now();
    check(px_allreduce(v, in.data(), out.data(), &r), "px_allreduce");
    px_status s = px_wait(r, 30000);
    std::string message = px_last_error();
    px_request_free(r);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s != PX_ERR_PEER_LOST)
      die(std::string("the allreduce after a peer left gave ") + px_status_name(s) + ": " +
          message);
    printf("ok rank %d step %d failed after %.2f s: %s\n", w.rank, step, seconds, message.c_str());
  }
  return 0;
}

// leave-mid-step (one worker per node): a ps table, pull and push step 0 and pull step 1
// everywhere; then the last node's worker leaves without pushing step 1, and the others
// push step 1 and pull step 2, which waits at every owner for the push that never comes
// (sync) until its 3 s wait runs out. The job then ends with requests still waiting at
// the owners: the daemons must free its tables all the same (the test checks their exit).
int run_leave_mid_step(px_client* c) {
  px_world_info w = world_of(c);
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.route = PX_ROUTE_PS;
  o.learning_rate = 0.5;
  px_var* table = nullptr;
  check(px_register_sparse(c, "left", PX_F32, 4096, 8, &o, &table), "register 'left'");
  std::vector<int64_t> idx;
  for (int64_t row = 0; row < 4096; row += 16) idx.push_back(row);
  std::vector<float> rows(idx.size() * 8), grads(idx.size() * 8, 0.25f);
  pull_rows_ok(table, idx.data(), idx.size(), rows.data(), "pull step 0");
  push_rows_ok(table, idx.data(), idx.size(), grads.data(), "push step 0");
  pull_rows_ok(table, idx.data(), idx.size(), rows.data(), "pull step 1");
  if (w.rank == w.world_size - 1) {
    printf("ok rank %d left before push step 1\n", w.rank);
    return 0;  // main disconnects
  }
  push_rows_ok(table, idx.data(), idx.size(), grads.data(), "push step 1");
  px_request* r = nullptr;
  check(px_pull_rows(table, idx.data(), idx.size(), rows.data(), &r), "px_pull_rows step 2");
  px_status s = px_wait(r, 3000);
  if (s == PX_OK) die("pull step 2 completed without the departed worker's push step 1");
  printf("ok rank %d pull step 2 did not complete: %s: %s\n", w.rank, px_status_name(s),
         px_last_error());
  return 0;
}

}  // namespace pxt
