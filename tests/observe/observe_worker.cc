// The worker of the observability tests (test_observe.py): a client of the C ABI that runs
// operations the test knows the exact count and size of, so the daemon's counters can be
// checked to the unit, and that can hold still or stall on cue (files in a directory).
//
//   observe_worker dense STEPS COUNT            STEPS allreduces of 'grad' (f32[COUNT] sum)
//   observe_worker sparse STEPS ROWS DIM K      STEPS pull+push of rows 0..K-1 of 'emb'
//   observe_worker hold DIR                     one of each, then ready.RANK in DIR; waits
//                                               for DIR/stop
//   observe_worker stall DIR RANK               allreduce step 0 of 'stalled'; global rank
//                                               RANK submits it only once DIR/stop exists
//   observe_worker pull-stall DIR RANK          pull step 0 of 'emb', then push 0 and pull
//                                               1; global rank RANK submits pull 1 first
//                                               and push 0 only once DIR/stop exists
// Every scenario ends with a barrier, so no worker leaves while another still needs it.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "parallax_c.h"
#include "tests/integration/worker_util.h"

using namespace pxt;

namespace {

constexpr int kWaitMs = 60000;

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

void touch(const std::string& path) {
  FILE* f = fopen(path.c_str(), "w");
  if (!f) die("cannot create " + path);
  fclose(f);
}

void wait_for_file(const std::string& path) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
  while (!exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) die("no " + path + " within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

px_var* dense(px_client* c, const char* name, uint64_t count) {
  px_var* v = nullptr;
  check(px_register_dense(c, name, PX_F32, count, PX_SUM, &v), "px_register_dense");
  return v;
}

px_var* sparse(px_client* c, uint64_t rows, uint64_t dim) {
  px_sparse_options o;
  px_sparse_options_init(&o);
  px_var* v = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, rows, dim, &o, &v), "px_register_sparse");
  return v;
}

void allreduces(px_var* v, uint64_t count, int steps) {
  std::vector<float> in(count, 1.0f), out(count);
  for (int s = 0; s < steps; ++s) allreduce_ok(v, in.data(), out.data(), "allreduce", kWaitMs);
}

void pulls_and_pushes(px_var* v, uint64_t dim, uint64_t k, int steps) {
  std::vector<int64_t> idx(k);
  for (uint64_t i = 0; i < k; ++i) idx[i] = static_cast<int64_t>(i);
  std::vector<float> rows(k * dim), grads(k * dim, 0.5f);
  for (int s = 0; s < steps; ++s) {
    pull_rows_ok(v, idx.data(), k, rows.data(), "pull");
    push_rows_ok(v, idx.data(), k, grads.data(), "push");
  }
}

uint64_t number(const char* text) {
  return strtoull(text, nullptr, 10);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) die("usage: observe_worker dense|sparse|hold|stall|pull-stall ...");
  std::string scenario = argv[1];
  px_client* c = connect_default();
  px_world_info w = world_of(c);
  if (scenario == "dense" && argc == 4) {
    uint64_t count = number(argv[3]);
    allreduces(dense(c, "grad", count), count, static_cast<int>(number(argv[2])));
  } else if (scenario == "sparse" && argc == 6) {
    uint64_t dim = number(argv[4]);
    pulls_and_pushes(sparse(c, number(argv[3]), dim), dim, number(argv[5]),
                     static_cast<int>(number(argv[2])));
  } else if (scenario == "hold" && argc == 3) {
    std::string dir = argv[2];
    allreduces(dense(c, "grad", 16), 16, 1);
    pulls_and_pushes(sparse(c, 100, 4), 4, 10, 1);
    touch(dir + "/ready." + std::to_string(w.rank));
    wait_for_file(dir + "/stop");
  } else if (scenario == "stall" && argc == 4) {
    std::string dir = argv[2];
    int stalling = static_cast<int>(number(argv[3]));
    px_var* v = dense(c, "stalled", 4);
    touch(dir + "/ready." + std::to_string(w.rank));
    if (w.rank == stalling) wait_for_file(dir + "/stop");
    allreduces(v, 4, 1);
  } else if (scenario == "pull-stall" && argc == 4) {
    // A worker that pulls again before pushing: every worker's pull 1 waits for its push 0.
    std::string dir = argv[2];
    int stalling = static_cast<int>(number(argv[3]));
    px_var* v = sparse(c, 100, 4);
    std::vector<int64_t> idx = {1, 2};
    std::vector<float> rows(8), grads(8, 0.5f);
    pull_rows_ok(v, idx.data(), idx.size(), rows.data(), "pull 0");
    if (w.rank == stalling) {
      px_request* next = nullptr;
      check(px_pull_rows(v, idx.data(), idx.size(), rows.data(), &next), "pull 1");
      touch(dir + "/ready." + std::to_string(w.rank));
      wait_for_file(dir + "/stop");
      push_rows_ok(v, idx.data(), idx.size(), grads.data(), "push 0");
      check_wait(next, "pull 1", kWaitMs);
    } else {  // push 0 completes once the stalling rank's comes: pull 1 goes out before
      px_request *push = nullptr, *next = nullptr;
      check(px_push_rows(v, idx.data(), idx.size(), grads.data(), &push), "push 0");
      check(px_pull_rows(v, idx.data(), idx.size(), rows.data(), &next), "pull 1");
      touch(dir + "/ready." + std::to_string(w.rank));
      check_wait(push, "push 0", kWaitMs);
      check_wait(next, "pull 1", kWaitMs);
    }
    push_rows_ok(v, idx.data(), idx.size(), grads.data(), "push 1");
  } else {
    die("unknown scenario or wrong arguments: " + scenario);
  }
  check(px_barrier(c, kWaitMs), "px_barrier");
  printf("OK %s rank %d\n", scenario.c_str(), w.rank);
  check(px_disconnect(c), "px_disconnect");
  return 0;
}
