// The service issue's per-job limits, seen from a job's workers (test_limits.cc starts the
// daemon with the limits these scenarios expect).
//
// limits-variables (daemon: --job-variables 3 --job-sparse-table-bytes 40000, 2 workers):
//   a 1000 x 8 sparse table (32,000 bytes) fits, a second one does not; two dense variables
//   fit, a third crosses the variable limit. Each refusal is PX_ERR_NO_MEMORY naming the job,
//   the variable and the limit, and the job goes on: its registered variables still work.
// limits-requests DIR (daemon: --job-requests-in-flight 4, 2 workers): rank 0 submits four
//   steps of one variable that wait for rank 1, so the job holds four requests; its fifth is
//   refused with PX_ERR_BUSY naming the limit. Rank 0 withdraws two, and rank 1 (started by
//   the file DIR/go) completes the first two steps with it: below the limit again, the job
//   goes on.
// limits-arena (daemon: --job-arena-bytes 48 MiB, 2 workers with 32 MiB arenas): one
//   worker is refused at connect with PX_ERR_NO_MEMORY naming the limit (REFUSED ...), the
//   other waits for it in vain (WAITED).
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

constexpr uint64_t kCount = 256;

void expect_refused(px_status s, px_status want, const std::string& what,
                    const std::vector<std::string>& parts) {
  std::string message = px_last_error();
  expect_status(s, want, what.c_str());
  for (auto& part : parts) expect_contains(message, part);
  printf("REFUSED %s: %s\n", what.c_str(), message.c_str());
}

// An exact f32 sum over the job's workers: each gives rank + 1 in every element.
void sum_ok(px_var* v, int world, const std::string& what) {
  std::vector<float> in(kCount, float(g_rank + 1)), out(kCount, -1.0f);
  allreduce_ok(v, in.data(), out.data(), what);
  float want = float(world * (world + 1) / 2);
  for (float x : out)
    if (x != want) die(what + ": got " + std::to_string(x) + ", want " + std::to_string(want));
}

bool wait_for_file(const std::string& path, int timeout_ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

int run_limits_variables(px_client* c) {
  int world = world_size(c);
  px_sparse_options o;
  px_sparse_options_init(&o);
  px_var* table = nullptr;
  check(px_register_sparse(c, "table", PX_F32, 1000, 8, &o, &table), "register 'table'");
  px_var* second = nullptr;
  expect_refused(px_register_sparse(c, "second", PX_F32, 1000, 8, &o, &second), PX_ERR_NO_MEMORY,
                 "register 'second'",
                 {"job 'limits-variables'", "variable 'second'", "64000 bytes",
                  "limits.job_sparse_table_bytes = 40000"});
  // Registrations are counted in the order the daemon sees them: the barriers keep both
  // workers' refusals about the same job.
  check(px_barrier(c, 30000), "px_barrier");
  px_var* a = nullptr;
  px_var* b = nullptr;
  px_var* d = nullptr;
  check(px_register_dense(c, "a", PX_F32, kCount, PX_SUM, &a), "register 'a'");
  check(px_register_dense(c, "b", PX_F32, kCount, PX_SUM, &b), "register 'b'");
  check(px_barrier(c, 30000), "px_barrier");
  expect_refused(px_register_dense(c, "d", PX_F32, kCount, PX_SUM, &d), PX_ERR_NO_MEMORY,
                 "register 'd'",
                 {"job 'limits-variables'", "variable 'd'", "limits.job_variables = 3"});
  // What was registered still works, refused names stay unknown.
  sum_ok(a, world, "allreduce of 'a'");
  sum_ok(b, world, "allreduce of 'b'");
  std::vector<int64_t> rows = {1, 999};
  std::vector<float> got(rows.size() * 8);
  pull_rows_ok(table, rows.data(), rows.size(), got.data(), "pull of 'table'");
  std::vector<float> grads(got.size(), 0.0f);
  push_rows_ok(table, rows.data(), rows.size(), grads.data(), "push of 'table'");
  check(px_barrier(c, 30000), "px_barrier");
  printf("OK limits-variables\n");
  return 0;
}

int run_limits_requests(px_client* c, const std::string& dir) {
  int world = world_size(c);
  if (world != 2) die("limits-requests needs 2 workers");
  px_var* v = nullptr;
  check(px_register_dense(c, "held", PX_F32, kCount, PX_SUM, &v), "register 'held'");
  px_var* after = nullptr;
  check(px_register_dense(c, "after", PX_F32, kCount, PX_SUM, &after), "register 'after'");
  std::vector<std::vector<float>> in(5, std::vector<float>(kCount, float(g_rank + 1)));
  std::vector<std::vector<float>> out(5, std::vector<float>(kCount, -1.0f));
  std::string go = dir + "/go";
  if (g_rank == 0) {
    // Steps 1..4 wait for rank 1: the job holds 4 requests. The ring is in order, so the
    // fifth is refused while they are held.
    px_request* held[4] = {};
    for (int i = 0; i < 4; ++i)
      check(px_allreduce(v, in[i].data(), out[i].data(), &held[i]), "allreduce held");
    px_request* fifth = nullptr;
    check(px_allreduce(v, in[4].data(), out[4].data(), &fifth), "allreduce fifth");
    px_status s = px_wait(fifth, 30000);
    std::string message = px_request_error(fifth);
    if (s != PX_ERR_BUSY)
      die("the fifth request: expected PX_ERR_BUSY, got " + std::string(px_strerror(s)) + " (" +
          message + ")");
    for (const char* part : {"job 'limits-requests'", "5 requests in flight",
                             "limits.job_requests_in_flight = 4", "local rank 0"})
      expect_contains(message, part);
    printf("REFUSED fifth request: %s\n", message.c_str());
    px_request_free(fifth);
    // Withdraw steps 3 and 4 (rank 1 never submits them), then let rank 1 complete 1 and 2.
    for (int i = 2; i < 4; ++i) {
      check(px_request_cancel(held[i]), "px_request_cancel");
      expect_status(wait_free(held[i]), PX_ERR_CANCELLED, "a withdrawn step");
    }
    if (FILE* f = fopen(go.c_str(), "w")) fclose(f);
    for (int i = 0; i < 2; ++i) check_wait(held[i], "a held step");
  } else {
    if (!wait_for_file(go, 60000)) die("no " + go + " from rank 0 within 60 s");
    px_request* steps[2] = {};
    for (int i = 0; i < 2; ++i)
      check(px_allreduce(v, in[i].data(), out[i].data(), &steps[i]), "allreduce");
    for (int i = 0; i < 2; ++i) check_wait(steps[i], "a step rank 0 holds");
  }
  for (int i = 0; i < 2; ++i)
    for (float x : out[static_cast<size_t>(i)])
      if (x != 3.0f) die("step " + std::to_string(i + 1) + " of 'held': got " + std::to_string(x));
  sum_ok(after, world, "allreduce of 'after'");
  check(px_barrier(c, 30000), "px_barrier");
  printf("OK limits-requests\n");
  return 0;
}

int run_limits_arena() {
  px_client* client = nullptr;
  px_connect_options o;
  px_connect_options_init(&o);
  o.timeout_ms = 3000;
  o.arena_bytes = 32ull << 20;
  px_status s = px_connect(&o, &client);
  std::string message = px_last_error();
  if (s == PX_ERR_NO_MEMORY) {
    expect_contains(message, "limits.job_arena_bytes = 50331648");
    expect_contains(message, "job 'limits-arena'");
    printf("REFUSED %s\n", message.c_str());
    return 0;
  }
  if (s == PX_ERR_TIMEOUT || s == PX_ERR_CONNECT) {
    printf("WAITED %s\n", message.c_str());
    return 0;
  }
  die("px_connect: expected a refusal or a time-out, got " + std::string(px_strerror(s)) + " (" +
      message + ")");
}

}  // namespace pxt
