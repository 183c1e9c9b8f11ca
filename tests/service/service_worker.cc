// A worker for the service tests (a client of the C ABI only). The socket, job, rank and
// size come from the PARALLAX_* environment, as for px_test_worker.
//   train READY_DIR  trains (sparse 'emb' pull -> dense 'w' allreduce -> sparse push) until an
//                    operation fails; after its first whole step it creates READY_DIR/RANK.
//                    The failure must be the daemon's drain (PX_ERR_PEER_LOST naming the
//                    node and "draining"/"drained"); prints pushes=N (push steps that
//                    succeeded) and the message.
//   verify N W       reads every row of 'emb' (restored by a restarted daemon) and checks
//                    it bit for bit against the table after N push steps of W workers.
//   stall READY_DIR  rank 0 allreduces 'w', rank 1 allreduces 'v': neither step can
//                    complete; both must fail with the drain's deadline message.
//   refused          px_connect must fail with PX_ERR_CONNECT because the daemon drains.
// The table's arithmetic is exact in f32 (zeros, SGD with lr 1/2, gradients k/64), so the
// reference needs no tolerance: a restored row is right or wrong.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/integration/worker_util.h"

using namespace pxt;

namespace {

constexpr uint64_t kRows = 64;
constexpr uint64_t kDim = 4;
constexpr uint64_t kLookups = 16;
constexpr uint64_t kDense = 256;
constexpr int kMaxSeconds = 90;

std::vector<int64_t> lookups(int rank, uint64_t step) {
  std::vector<int64_t> idx(kLookups);
  for (uint64_t j = 0; j < kLookups; ++j)
    idx[j] = static_cast<int64_t>((step * 7 + static_cast<uint64_t>(rank) * 13 + j * 5) % kRows);
  return idx;
}

float gradient(int rank, uint64_t step, uint64_t j, uint64_t c) {
  return static_cast<float>(
             static_cast<int>((static_cast<uint64_t>(rank) + 3 * step + 5 * j + c) % 7) - 3) /
         64.0f;
}

px_sparse_options table_options() {
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.optimizer = PX_OPT_SGD;
  o.learning_rate = 0.5;
  o.initializer = PX_INIT_ZEROS;
  return o;
}

px_var* register_table(px_client* c) {
  px_sparse_options o = table_options();
  px_var* var = nullptr;
  check(px_register_sparse(c, "emb", PX_F32, kRows, kDim, &o, &var), "px_register_sparse emb");
  return var;
}

// The table after `pushes` push steps of `world` workers (ranks 0..world-1).
std::vector<double> reference(uint64_t pushes, int world) {
  std::vector<double> w(kRows * kDim, 0.0);
  for (uint64_t k = 0; k < pushes; ++k) {
    std::vector<double> sum(kRows * kDim, 0.0);
    for (int rank = 0; rank < world; ++rank) {
      std::vector<int64_t> idx = lookups(rank, k);
      for (uint64_t j = 0; j < kLookups; ++j)
        for (uint64_t c = 0; c < kDim; ++c)
          sum[static_cast<size_t>(idx[j]) * kDim + c] += gradient(rank, k, j, c);
    }
    for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5 * sum[i];
  }
  return w;
}

void touch(const std::string& path) {
  FILE* f = fopen(path.c_str(), "w");
  if (f) fclose(f);
}

// The drain's failure, naming the draining node (PX_TEST_DRAINING_NODE, default 0):
// anything else fails the worker.
void expect_drain(px_status s, const std::string& message, const std::string& what) {
  const char* node = getenv("PX_TEST_DRAINING_NODE");
  std::string names = "parallaxd on node " + std::string(node ? node : "0");
  if (s != PX_ERR_PEER_LOST || (!contains(message, "draining") && !contains(message, "drained")) ||
      !contains(message, names))
    die(what + ": expected the drain's PX_ERR_PEER_LOST naming '" + names + "', got " +
        px_status_name(s) + ": " + message);
}

int train(px_client* c, const std::string& ready_dir) {
  px_var* emb = register_table(c);
  px_var* w = nullptr;
  check(px_register_dense(c, "w", PX_F32, kDense, PX_SUM, &w), "px_register_dense w");
  int world = world_size(c);
  std::vector<float> in(kDense), out(kDense), rows(kLookups * kDim), grads(kLookups * kDim);
  auto start = std::chrono::steady_clock::now();
  uint64_t pushes = 0;
  for (uint64_t k = 0;; ++k) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(kMaxSeconds))
      die("no drain within " + std::to_string(kMaxSeconds) + " s");
    std::vector<int64_t> idx = lookups(g_rank, k);
    // Each operation: submit, wait; the first failure ends training.
    px_request* r = nullptr;
    std::string what;
    px_status s = px_pull_rows(emb, idx.data(), idx.size(), rows.data(), &r);
    what = "pull step " + std::to_string(k);
    if (s == PX_OK) s = wait_free(r, 60000), r = nullptr;
    if (s == PX_OK) {
      for (uint64_t i = 0; i < kDense; ++i) in[i] = static_cast<float>(g_rank + k + i % 3);
      what = "allreduce step " + std::to_string(k);
      s = px_allreduce(w, in.data(), out.data(), &r);
      if (s == PX_OK) s = wait_free(r, 60000), r = nullptr;
      if (s == PX_OK) {
        for (uint64_t i = 0; i < kDense; ++i) {
          double want = world * (static_cast<double>(k + i % 3)) + world * (world - 1) / 2.0;
          if (out[i] != static_cast<float>(want))
            die("allreduce step " + std::to_string(k) + " element " + std::to_string(i) + " is " +
                std::to_string(out[i]));
        }
      }
    }
    if (s == PX_OK) {
      for (uint64_t j = 0; j < kLookups; ++j)
        for (uint64_t col = 0; col < kDim; ++col)
          grads[j * kDim + col] = gradient(g_rank, k, j, col);
      what = "push step " + std::to_string(k);
      s = px_push_rows(emb, idx.data(), idx.size(), grads.data(), &r);
      if (s == PX_OK) s = wait_free(r, 60000), r = nullptr;
      if (s == PX_OK) ++pushes;
    }
    if (s != PX_OK) {
      std::string message = last_message();
      expect_drain(s, message, what);
      printf("ok rank %d stopped at %s pushes=%llu message: %s\n", g_rank, what.c_str(),
             static_cast<unsigned long long>(pushes), message.c_str());
      return 0;
    }
    if (k == 0) touch(ready_dir + "/" + std::to_string(g_rank));
  }
}

int verify(px_client* c, uint64_t pushes, int world) {
  px_var* emb = register_table(c);
  std::vector<int64_t> idx(kRows);
  for (uint64_t r = 0; r < kRows; ++r) idx[r] = static_cast<int64_t>(r);
  std::vector<float> table(kRows * kDim);
  read_rows_ok(emb, idx.data(), idx.size(), table.data(), "read every row");
  std::vector<double> want = reference(pushes, world);
  bool nonzero = false;
  for (size_t i = 0; i < table.size(); ++i) {
    nonzero |= table[i] != 0.0f;
    if (table[i] != static_cast<float>(want[i]))
      die("row " + std::to_string(i / kDim) + " column " + std::to_string(i % kDim) + " is " +
          std::to_string(table[i]) + ", after " + std::to_string(pushes) + " push steps it was " +
          std::to_string(want[i]));
  }
  if (pushes > 0 && !nonzero) die("the restored table is all zeros");
  printf("ok rank %d rows_match pushes=%llu\n", g_rank, static_cast<unsigned long long>(pushes));
  return 0;
}

int stall(px_client* c, const std::string& ready_dir) {
  px_var *w = nullptr, *v = nullptr;
  check(px_register_dense(c, "w", PX_F32, kDense, PX_SUM, &w), "px_register_dense w");
  check(px_register_dense(c, "v", PX_F32, kDense, PX_SUM, &v), "px_register_dense v");
  std::vector<float> in(kDense, 1.0f), out(kDense);
  px_request* r = nullptr;
  // Each waits for the other in a different variable's step 0.
  check(px_allreduce(g_rank == 0 ? w : v, in.data(), out.data(), &r), "px_allreduce");
  touch(ready_dir + "/" + std::to_string(g_rank));
  px_status s = wait_free(r, 60000);
  expect_drain(s, g_wait_message, "allreduce");
  expect_contains(g_wait_message, "service.drain_timeout_ms");
  printf("ok rank %d cut: %s\n", g_rank, g_wait_message.c_str());
  return 0;
}

int refused() {
  px_client* client = nullptr;
  px_connect_options o;
  px_connect_options_init(&o);
  o.timeout_ms = 5000;
  px_status s = px_connect(&o, &client);
  std::string message = px_last_error();
  if (s != PX_ERR_CONNECT || !contains(message, "draining"))
    die(std::string("px_connect to a draining daemon: expected PX_ERR_CONNECT naming the drain, "
                    "got ") +
        px_status_name(s) + ": " + message);
  printf("ok refused: %s\n", message.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "refused" && argc == 2) return refused();
  bool known = (mode == "train" && argc == 3) || (mode == "stall" && argc == 3) ||
               (mode == "verify" && argc == 4);
  if (!known) {
    fprintf(stderr, "usage: px_service_worker train DIR | stall DIR | verify N W | refused\n");
    return 2;
  }
  px_client* c = connect_default();
  int rc = 0;
  if (mode == "train") rc = train(c, argv[2]);
  if (mode == "stall") rc = stall(c, argv[2]);
  if (mode == "verify")
    rc = verify(c, strtoull(argv[2], nullptr, 10), static_cast<int>(strtol(argv[3], nullptr, 10)));
  px_disconnect(c);
  return rc;
}
