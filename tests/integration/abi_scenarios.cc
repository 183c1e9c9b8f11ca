// Worker scenarios for ABI 1.3: request errors, lifetimes in any order and across threads,
// cancel, abort, the completion fd, per-operation options, stalls, timed-out barriers.
// Every scenario runs with 2 local workers unless it says otherwise.
#include <dlfcn.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "parallax_c.h"
#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

using Clock = std::chrono::steady_clock;

int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

px_var* dense(px_client* c, const char* name, uint64_t count = 4) {
  px_var* v = nullptr;
  check(px_register_dense(c, name, PX_F32, count, PX_SUM, &v), "px_register_dense");
  return v;
}

// Status names, the long message of a failed request, its independence of the thread.
int errors(px_client* c) {
  if (std::string(px_status_name(PX_ERR_TIMEOUT)) != "PX_ERR_TIMEOUT" ||
      std::string(px_status_name(PX_ERR_CANCELLED)) != "PX_ERR_CANCELLED" ||
      std::string(px_status_name(static_cast<px_status>(99))) != "PX_STATUS_UNKNOWN")
    die("px_status_name");
  std::string name(250, 'v');  // the message names it: longer than a completion entry holds
  px_sparse_options o;
  px_sparse_options_init(&o);
  px_var* table = nullptr;
  check(px_register_sparse(c, name.c_str(), PX_F32, 100, 4, &o, &table), "px_register_sparse");
  int64_t bad[2] = {3, 1000};
  std::vector<float> rows(8);
  px_request* r = nullptr;
  check(px_pull_rows(table, bad, 2, rows.data(), &r), "px_pull_rows");
  std::string message;
  px_status status = PX_OK;
  std::thread waiter([&] {  // waited on another thread; read on this one
    status = px_wait(r, 10000);
  });
  waiter.join();
  expect_status(status, PX_ERR_INDEX, "pull of a bad index");
  message = px_request_error(r);
  if (message.size() < 260) die("px_request_error was cut: " + std::to_string(message.size()));
  expect_contains(message, name);
  expect_contains(message, "1000");
  char small[16];
  uint64_t length = 0;
  check(px_client_last_error(c, small, sizeof small, &length), "px_client_last_error");
  if (length != message.size() || std::strlen(small) != sizeof small - 1)
    die("px_client_last_error: length " + std::to_string(length) + " for a message of " +
        std::to_string(message.size()));
  check(px_request_free(r), "px_request_free");
  // A successful call clears the thread's message (documented): read it right away.
  check(px_barrier(c, 10000), "px_barrier");
  if (*px_last_error()) die("px_last_error not cleared by a successful call");
  return 0;
}

// Handles stay safe in any order: a variable or request used after px_disconnect, a request
// freed twice, a wait interrupted by px_request_free and by px_disconnect on other threads.
int lifetimes(px_client* c) {
  px_world_info w = world_of(c);
  px_var* v = dense(c, "life");
  std::vector<float> x(4, 1.0f), y(4);
  // A request freed while another thread waits on it: that wait returns CANCELLED.
  px_request* r = nullptr;
  if (w.local_rank == 0) {
    check(px_allreduce(v, x.data(), y.data(), &r), "px_allreduce");
    px_status got = PX_OK;
    std::thread waiter([&] { got = px_wait(r, 20000); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    check(px_request_free(r), "px_request_free");
    waiter.join();
    expect_status(got, PX_ERR_CANCELLED, "a wait whose request was freed");
    expect_status(px_request_free(r), PX_ERR_NOT_FOUND, "freeing a request twice");
    expect_status(px_wait(r, 10), PX_ERR_NOT_FOUND, "waiting on a freed request");
  }
  check(px_barrier(c, 20000), "px_barrier");
  if (w.local_rank == 1) {  // its step 0 meets rank 0's freed (still submitted) step 0
    check(px_allreduce(v, x.data(), y.data(), &r), "px_allreduce");
    check(px_wait(r, 20000), "px_wait");
    check(px_request_free(r), "px_request_free");
  }
  check(px_barrier(c, 20000), "px_barrier");
  // A wait in progress when the client is disconnected: CANCELLED, then every handle is
  // stale. Rank 1 never submits this step.
  if (w.local_rank == 0) {
    check(px_allreduce(v, x.data(), y.data(), &r), "px_allreduce");
    px_status got = PX_OK;
    std::thread waiter([&] { got = px_wait(r, 20000); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    check(px_disconnect(c), "px_disconnect");
    waiter.join();
    expect_status(got, PX_ERR_CANCELLED, "a wait whose client was disconnected");
    px_request* stale = r;
    expect_status(px_allreduce(v, x.data(), y.data(), &r), PX_ERR_NOT_FOUND,
                  "px_allreduce on a variable of a disconnected client");
    expect_status(px_request_free(stale), PX_ERR_NOT_FOUND, "freeing after px_disconnect");
    expect_contains(px_request_error(stale), "not live");
    expect_status(px_barrier(c, 10), PX_ERR_NOT_FOUND, "a barrier after px_disconnect");
    expect_status(px_disconnect(c), PX_ERR_NOT_FOUND, "px_disconnect twice");
    return 0;
  }
  px_status s = px_barrier(c, 20000);  // rank 0 left: the job is over for rank 1
  if (s == PX_OK) die("a barrier after rank 0 disconnected succeeded");
  check(px_disconnect(c), "px_disconnect");
  return 0;
}

// A px_checkpoint blocked on one thread does not hold up px_wait on another.
int threads(px_client* c) {
  px_world_info w = world_of(c);
  px_var* d = dense(c, "threads-dense");
  px_sparse_options o;
  px_sparse_options_init(&o);
  px_var* s = nullptr;
  check(px_register_sparse(c, "threads-table", PX_F32, 64, 2, &o, &s), "px_register_sparse");
  std::vector<float> x(4, 1.0f), y(4);
  int64_t idx[1] = {w.local_rank};
  float grad[2] = {1, 1};
  px_request* r = nullptr;
  if (w.local_rank == 0) {
    check(px_push_rows(s, idx, 1, grad, &r), "px_push_rows");
    std::atomic<int64_t> checkpoint_done_ms{-1};
    auto start = Clock::now();
    std::string dir = std::string(getenv("PX_TEST_SCRATCH") ? getenv("PX_TEST_SCRATCH") : "/tmp") +
                      "/abi-threads-" + std::to_string(getpid());
    std::thread checkpointer([&] {
      check(px_checkpoint(c, dir.c_str(), 20000), "px_checkpoint");  // waits for rank 1's push
      checkpoint_done_ms = ms_since(start);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    px_request* a = nullptr;
    check(px_allreduce(d, x.data(), y.data(), &a), "px_allreduce");
    check(px_wait(a, 20000), "px_wait during a blocked px_checkpoint");
    int64_t allreduce_ms = ms_since(start);
    check(px_request_free(a), "px_request_free");
    checkpointer.join();
    check(px_wait(r, 20000), "px_wait push");
    check(px_request_free(r), "px_request_free");
    if (!(allreduce_ms < checkpoint_done_ms))
      die("px_wait finished at " + std::to_string(allreduce_ms) + " ms, after the checkpoint at " +
          std::to_string(checkpoint_done_ms.load()) + " ms");
    std::string rm = "rm -rf '" + dir + "'";
    if (system(rm.c_str()) != 0) die("rm");
  } else {
    px_request* a = nullptr;
    check(px_allreduce(d, x.data(), y.data(), &a), "px_allreduce");
    check(px_wait(a, 20000), "px_wait");
    check(px_request_free(a), "px_request_free");
    std::this_thread::sleep_for(std::chrono::milliseconds(700));  // the checkpoint waits
    check(px_push_rows(s, idx, 1, grad, &r), "px_push_rows");
    check(px_wait(r, 20000), "px_wait push");
    check(px_request_free(r), "px_request_free");
  }
  check(px_barrier(c, 20000), "px_barrier");
  return 0;
}

// A cancelled step is withdrawn; its peers' same step fails naming the worker; later steps
// work. Also a re-registration with another dtype fails alone.
int cancel(px_client* c) {
  px_world_info w = world_of(c);
  px_var* v = dense(c, "cancel");
  px_var* again = nullptr;
  expect_status(px_register_dense(c, "cancel", PX_F64, 4, PX_SUM, &again), PX_ERR_MISMATCH,
                "registering a variable again with another dtype");
  std::vector<float> x(4, 1.0f);
  float* out = nullptr;
  check(px_alloc(c, 16, reinterpret_cast<void**>(&out)), "px_alloc");
  px_request* r = nullptr;
  if (w.local_rank == 0) {
    check(px_allreduce(v, x.data(), out, &r), "px_allreduce");
    check(px_request_cancel(r), "px_request_cancel");
    expect_status(px_wait(r, 1000), PX_ERR_CANCELLED, "px_wait after px_request_cancel");
    check(px_request_free(r), "px_request_free");
  }
  check(px_barrier(c, 20000), "px_barrier");
  if (w.local_rank == 1) {
    check(px_allreduce(v, x.data(), out, &r), "px_allreduce");
    expect_status(px_wait(r, 20000), PX_ERR_CANCELLED, "the step another worker withdrew");
    expect_contains(px_request_error(r), "local rank 0");
    expect_contains(px_request_error(r), "withdrew");
    check(px_request_free(r), "px_request_free");
  }
  // Step 1 works for both, and the first registration still does.
  std::fill(out, out + 4, 1.0f);
  check(px_allreduce(v, out, out, &r), "px_allreduce step 1");
  check(px_wait(r, 20000), "px_wait step 1");
  check(px_request_free(r), "px_request_free");
  if (out[0] != 2.0f) die("step 1 after a cancel: " + std::to_string(out[0]));
  // A cancel after completion: the result was not taken, so the wait says CANCELLED.
  check(px_allreduce(v, x.data(), out, &r), "px_allreduce step 2");
  check(px_barrier(c, 20000), "px_barrier");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  check(px_request_cancel(r), "px_request_cancel of a completed step");
  expect_status(px_wait(r, 1000), PX_ERR_CANCELLED, "px_wait after a late cancel");
  check(px_request_free(r), "px_request_free");
  return 0;
}

// A barrier that timed out on one worker does not release the other.
int barrier_timeout(px_client* c) {
  px_world_info w = world_of(c);
  if (w.local_rank == 0) {
    expect_status(px_barrier(c, 300), PX_ERR_TIMEOUT, "a barrier the other worker is late for");
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    px_status s = px_barrier(c, 10000);
    expect_status(s, PX_ERR_CANCELLED, "a barrier whose partner timed out");
    expect_contains(px_last_error(), "timed out");
  }
  check(px_barrier(c, 20000), "the next barrier");
  return 0;
}

// The daemon's step_stall_ms (500 in the test) fails a step a worker never submits.
int stall(px_client* c) {
  px_world_info w = world_of(c);
  px_var* v = dense(c, "stall");
  std::vector<float> x(4, 1.0f), y(4);
  if (w.local_rank == 0) {
    px_request* r = nullptr;
    auto start = Clock::now();
    check(px_allreduce(v, x.data(), y.data(), &r), "px_allreduce");
    expect_status(px_wait(r, 20000), PX_ERR_TIMEOUT, "a step local rank 1 never submits");
    int64_t took = ms_since(start);
    if (took > 5000) die("the stall took " + std::to_string(took) + " ms to be reported");
    std::string message = px_request_error(r);
    expect_contains(message, "local rank 1");
    expect_contains(message, "'stall'");
    expect_contains(message, "step 0");
    check(px_request_free(r), "px_request_free");
  } else {
    // Alive and connected, but never submitting: what step_stall_ms is for. (No barrier at
    // the end: it would stall too while the other worker waits for its verdict.)
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  return 0;
}

// px_abort on one worker fails the other's outstanding operation with the reason.
int abort_job(px_client* c) {
  px_world_info w = world_of(c);
  px_var* v = dense(c, "abort");
  std::vector<float> x(4, 1.0f), y(4);
  if (w.rank == w.world_size - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    check(px_abort(c, "the loss went NaN"), "px_abort");
    return 0;
  }
  px_request* r = nullptr;
  auto start = Clock::now();
  check(px_allreduce(v, x.data(), y.data(), &r), "px_allreduce");
  expect_status(px_wait(r, 20000), PX_ERR_PEER_LOST, "a step of an aborted job");
  if (ms_since(start) > 5000) die("the abort took too long to arrive");
  expect_contains(px_request_error(r), "px_abort: the loss went NaN");
  check(px_request_free(r), "px_request_free");
  return 0;
}

// An event loop's wait: poll() on px_client_fd, px_progress, px_test; no px_wait.
int event_loop(px_client* c) {
  px_var* v = dense(c, "loop", 1000);
  int fd = -1;
  check(px_client_fd(c, &fd), "px_client_fd");
  for (int step = 0; step < 20; ++step) {
    std::vector<float> x(1000, 1.0f), y(1000);
    px_request* r = nullptr;
    check(px_allreduce(v, x.data(), y.data(), &r), "px_allreduce");
    int32_t done = 0;
    auto start = Clock::now();
    while (!done) {
      pollfd p{fd, POLLIN, 0};
      int n = poll(&p, 1, 5000);
      if (n <= 0) die("px_client_fd never became readable (step " + std::to_string(step) + ")");
      check(px_progress(c), "px_progress");
      check(px_test(r, &done), "px_test");
      if (ms_since(start) > 10000) die("no completion through the fd");
    }
    if (y[999] != 2.0f) die("wrong result through the fd");
    check(px_request_free(r), "px_request_free");
  }
  // Idle: after px_progress the fd is not readable.
  check(px_progress(c), "px_progress");
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 50) != 0) die("px_client_fd readable with nothing to report");
  check(px_barrier(c, 20000), "px_barrier");
  return 0;
}

// Per-operation options: bad ones refused clearly; host options behave as the plain call.
int options(px_client* c) {
  px_var* v = dense(c, "options");
  std::vector<float> x(4, 1.0f), y(4);
  px_request* r = nullptr;
  px_op_options o;
  px_op_options_init(&o);
  o.memory_kind = PX_MEMORY_CUDA;
  o.device = 0;
  // Host memory as PX_MEMORY_CUDA: no GPU on the daemon (these machines), or no CUDA runtime
  // in this process; on a GPU machine libparallax loads the runtime and refuses the memory.
  auto refused_as_device_memory = [](px_status got, const char* what) {
    std::string error = px_last_error();
    if (got == PX_ERR_NOT_IMPLEMENTED) {
      if (error.find("PX_MEMORY_CUDA: parallaxd on node 0 has no usable GPU: ") ==
          std::string::npos)
        expect_contains(error, "PX_MEMORY_CUDA: no CUDA runtime");
      return;
    }
    expect_status(got, PX_ERR_INVALID, what);
    expect_contains(error, "PX_MEMORY_CUDA");
  };
  refused_as_device_memory(px_allreduce_ex(v, x.data(), y.data(), &o, &r), "PX_MEMORY_CUDA");
  refused_as_device_memory(px_broadcast_ex(v, x.data(), y.data(), &o, &r),
                           "PX_MEMORY_CUDA broadcast");
  uint64_t counts[2] = {4, 4};
  expect_status(px_allgatherv_ex(v, x.data(), counts, y.data(), &o, &r), PX_ERR_NOT_IMPLEMENTED,
                "PX_MEMORY_CUDA allgatherv");
  expect_contains(px_last_error(), "taken by px_allreduce_ex, px_broadcast_ex, px_allgather_ex");
  // Sparse operations on device memory: refused here as the allreduce is (no GPU, or no
  // CUDA runtime in this process).
  px_sparse_options so;
  px_sparse_options_init(&so);
  px_var* table = nullptr;
  check(px_register_sparse(c, "options-table", PX_F32, 10, 2, &so, &table), "px_register_sparse");
  int64_t index = 1;
  refused_as_device_memory(px_pull_rows_ex(table, &index, 1, y.data(), &o, &r),
                           "PX_MEMORY_CUDA pull");
  refused_as_device_memory(px_load_rows_ex(table, &index, 1, y.data(), &o, &r),
                           "PX_MEMORY_CUDA load");
  px_op_options_init(&o);
  o.priority = 300;
  expect_status(px_allreduce_ex(v, x.data(), y.data(), &o, &r), PX_ERR_INVALID, "priority 300");
  o.struct_size = 0;
  expect_status(px_allreduce_ex(v, x.data(), y.data(), &o, &r), PX_ERR_INVALID, "struct_size 0");
  px_op_options_init(&o);
  o.priority = 7;
  check(px_allreduce_ex(v, x.data(), y.data(), &o, &r), "px_allreduce_ex");
  check(px_wait(r, 20000), "px_wait");
  check(px_request_free(r), "px_request_free");
  if (y[0] != 2.0f) die("px_allreduce_ex result");
  return 0;
}

// With the CUDA runtime loaded (and no GPU, as on these machines) host memory still works:
// libparallax finds the runtime, asks cudaPointerGetAttributes, gets an error (no device),
// clears it and treats the pointer as host memory. Skips where no runtime is installed.
int cuda_runtime(px_client* c) {
  const char* const candidates[] = {"libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.13",
                                    "libcudart.so.12", "libcudart.so"};
  void* lib = nullptr;
  for (const char* name : candidates)
    if (!lib) lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  px_var* v = dense(c, "cuda-runtime");
  std::vector<float> x(4, 1.0f), y(4);
  for (int step = 0; step < 3; ++step) {
    px_request* r = nullptr;
    check(px_allreduce(v, x.data(), y.data(), &r), "px_allreduce with the CUDA runtime loaded");
    check(px_wait(r, 20000), "px_wait");
    check(px_request_free(r), "px_request_free");
    if (y[0] != 2.0f) die("wrong result with the CUDA runtime loaded");
  }
  printf("CUDA runtime %s\n", lib ? "loaded" : "not installed: host path only");
  return 0;
}

// px_alloc_ex (1.8): host memory as px_alloc's (reduced in place), bad options refused, and
// device memory refused naming why where there is none: the daemon's reason when it has no
// GPU (gpu_why, when the test knows it), else that no CUDA runtime loads in this process.
int alloc_ex(px_client* c, const std::string& gpu_why) {
  px_alloc_options o;
  px_alloc_options_init(&o);
  if (o.struct_size != sizeof o || o.memory_kind != PX_MEMORY_HOST || o.device != -1)
    die("px_alloc_options_init defaults");
  void* p = nullptr;
  check(px_alloc_ex(c, 4 * sizeof(float), &o, &p), "px_alloc_ex host");
  void* q = nullptr;
  check(px_alloc_ex(c, 4 * sizeof(float), nullptr, &q), "px_alloc_ex with NULL options");
  px_var* v = dense(c, "alloc-ex");
  auto* x = static_cast<float*>(p);
  auto* y = static_cast<float*>(q);
  for (int i = 0; i < 4; ++i) x[i] = 1.5f;
  px_request* r = nullptr;
  check(px_allreduce(v, x, y, &r), "px_allreduce on px_alloc_ex memory");
  check(px_wait(r, 20000), "px_wait");
  check(px_request_free(r), "px_request_free");
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  if (y[3] != 1.5f * static_cast<float>(w.world_size)) die("px_alloc_ex memory result");
  check(px_free(c, p), "px_free of px_alloc_ex memory");
  check(px_free(c, q), "px_free of px_alloc_ex memory");
  expect_status(px_free(c, p), PX_ERR_INVALID, "px_free twice");

  o.memory_kind = 7;
  expect_status(px_alloc_ex(c, 64, &o, &p), PX_ERR_INVALID, "memory_kind 7");
  expect_contains(px_last_error(), "unknown memory_kind 7");
  px_alloc_options_init(&o);
  o.struct_size = 0;
  expect_status(px_alloc_ex(c, 64, &o, &p), PX_ERR_INVALID, "struct_size 0");
  expect_contains(px_last_error(), "px_alloc_options_init");
  expect_status(px_alloc_ex(c, 64, &o, nullptr), PX_ERR_INVALID, "out_ptr NULL");

  px_alloc_options_init(&o);
  o.memory_kind = PX_MEMORY_CUDA;
  p = reinterpret_cast<void*>(1);
  px_status status = px_alloc_ex(c, 1 << 20, &o, &p);
  if (status == PX_OK) {  // a GPU machine: libparallax loaded the CUDA runtime itself
    check(px_free(c, p), "px_free of PX_MEMORY_CUDA memory");
    printf("px_alloc_ex PX_MEMORY_CUDA: allocated on a GPU\n");
    return 0;
  }
  expect_status(status, PX_ERR_NOT_IMPLEMENTED, "PX_MEMORY_CUDA");
  if (p) die("px_alloc_ex left *out_ptr set after failing");
  std::string error = px_last_error();
  expect_contains(error, "px_alloc_ex(1048576, PX_MEMORY_CUDA, device -1)");
  if (error.find("parallaxd on node 0 has no usable GPU: ") != std::string::npos) {
    if (!gpu_why.empty()) expect_contains(error, "no usable GPU: " + gpu_why);
  } else {
    expect_contains(error, "no CUDA runtime");
  }
  printf("px_alloc_ex PX_MEMORY_CUDA: %s\n", error.c_str());
  return 0;
}

}  // namespace

// Before any connection: a socket with no daemon fails at once unless asked to wait.
int run_connect_scenario() {
  px_connect_options o;
  px_connect_options_init(&o);
  std::string path = "/tmp/pxt-no-daemon-" + std::to_string(getpid()) + ".sock";
  o.socket_path = path.c_str();
  o.timeout_ms = 20000;
  px_client* c = nullptr;
  auto start = Clock::now();
  expect_status(px_connect(&o, &c), PX_ERR_CONNECT, "px_connect without a daemon");
  if (ms_since(start) > 1000) die("px_connect waited for a daemon it was not told to wait for");
  expect_contains(px_last_error(), path);
  expect_contains(px_last_error(), "wait_for_daemon");
  o.wait_for_daemon = 1;
  o.timeout_ms = 300;
  start = Clock::now();
  expect_status(px_connect(&o, &c), PX_ERR_CONNECT, "px_connect waiting for a daemon");
  if (ms_since(start) < 250) die("px_connect did not wait for the daemon");
  o.wait_for_daemon = 0;
  o.arena_bytes = PX_ARENA_MAX_BYTES + 1;
  expect_status(px_connect(&o, &c), PX_ERR_INVALID, "an arena above PX_ARENA_MAX_BYTES");
  return 0;
}

int run_abi_scenario(px_client* c, const std::string& scenario) {
  if (scenario == "abi13-errors") return errors(c);
  if (scenario == "abi13-lifetimes") return lifetimes(c);
  if (scenario == "abi13-threads") return threads(c);
  if (scenario == "abi13-cancel") return cancel(c);
  if (scenario == "abi13-barrier-timeout") return barrier_timeout(c);
  if (scenario == "abi13-stall") return stall(c);
  if (scenario == "abi13-abort") return abort_job(c);
  if (scenario == "abi13-event-loop") return event_loop(c);
  if (scenario == "abi13-options") return options(c);
  if (scenario == "abi13-cuda-runtime") return cuda_runtime(c);
  if (scenario == "abi18-alloc-ex") return alloc_ex(c, "");
  if (scenario == "abi18-alloc-ex-gpu-off") return alloc_ex(c, "gpu.mode is off");
  die("unknown scenario " + scenario);
}

}  // namespace pxt
