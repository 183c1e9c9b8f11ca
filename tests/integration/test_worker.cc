// A real worker process for the integration tests: talks to parallaxd only through the C ABI.
// Usage: px_test_worker SCENARIO [--flag VALUE | --switch]... (px_test_worker --help lists
// every scenario and its flags, kScenarios below); the socket, job, rank and size come from
// the PARALLAX_* environment. Prints "FAIL: ..." and exits 1 on any wrong result; a command
// line it does not understand prints "USAGE ..." and exits 2 before connecting.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "parallax_c.h"
#include "tests/integration/worker_data.h"
#include "tests/integration/worker_util.h"

using namespace pxt;

namespace {

// The memory modes of an allreduce's buffers (Buffers), in --memory's order.
const std::vector<std::string> kMemoryModes = {
    "arena", "ordinary", "inplace-arena", "inplace-ordinary", "arena-in", "arena-out"};

// Buffers for one allreduce in one of the memory modes the ABI allows.
struct Buffers {
  px_client* client;
  std::vector<unsigned char> in_plain, out_plain;
  void* in_arena = nullptr;
  void* out_arena = nullptr;
  void* in = nullptr;
  void* out = nullptr;
  Buffers(px_client* c, const std::string& mode, size_t bytes) : client(c) {
    bool in_is_arena = mode == "arena" || mode == "inplace-arena" || mode == "arena-in";
    bool out_is_arena = mode == "arena" || mode == "inplace-arena" || mode == "arena-out";
    bool inplace = mode.rfind("inplace", 0) == 0;
    if (in_is_arena) {
      check(px_alloc(c, bytes, &in_arena), "px_alloc");
      in = in_arena;
    } else {
      in_plain.resize(bytes);
      in = in_plain.data();
    }
    if (inplace) {
      out = in;
      return;
    }
    if (out_is_arena) {
      check(px_alloc(c, bytes, &out_arena), "px_alloc");
      out = out_arena;
    } else {
      out_plain.resize(bytes);
      out = out_plain.data();
    }
  }
  ~Buffers() {
    px_free(client, in_arena);
    px_free(client, out_arena);
  }
};

void verify(const void* got, const std::vector<unsigned char>& want, const std::string& what) {
  if (std::memcmp(got, want.data(), want.size()) != 0) {
    size_t i = 0;
    while (static_cast<const unsigned char*>(got)[i] == want[i]) ++i;
    die(what + ": result differs from the reference at byte " + std::to_string(i));
  }
}

// allreduce --dtype DTYPE --op OP --count N --memory MODE --steps N
int scenario_allreduce(px_client* c, const Flags& f) {
  px_dtype t = static_cast<px_dtype>(f.choice("dtype"));
  px_reduce_op op = static_cast<px_reduce_op>(f.choice("op"));
  uint64_t count = f.u64("count");
  std::string mode = kMemoryModes[static_cast<size_t>(f.choice("memory"))];
  int steps = f.i32("steps");
  int world = world_size(c);
  std::string what = f.str("dtype") + " " + f.str("op") + " " + std::to_string(count);
  std::string name = "v_" + f.str("dtype") + "_" + f.str("op") + "_" + std::to_string(count);
  px_var* var = nullptr;
  check(px_register_dense(c, name.c_str(), t, count, op, &var), "px_register_dense");
  size_t bytes = count * element_size(t);
  Buffers b(c, mode, bytes);
  for (int step = 0; step < steps; ++step) {
    fill_input(t, g_rank, static_cast<uint64_t>(step), 1, count, b.in);
    allreduce_ok(var, b.in, b.out, "step " + std::to_string(step), 60000);
    if (!getenv("PX_TEST_NO_REFERENCE"))
      verify(b.out, expected_result(t, op, world, static_cast<uint64_t>(step), 1, count),
             name + " " + mode + " step " + std::to_string(step));
  }
  px_var_stats stats;
  stats.struct_size = sizeof stats;
  check(px_var_stats_get(var, &stats), "px_var_stats_get");
  if (stats.ops < static_cast<uint64_t>(steps))
    die("stats.ops " + std::to_string(stats.ops) + " < steps");
  uint64_t hash = 1469598103934665603ull;  // FNV-1a of the last result: equal on every worker
  for (size_t i = 0; i < bytes; ++i)
    hash = (hash ^ static_cast<const unsigned char*>(b.out)[i]) * 1099511628211ull;
  printf("OK allreduce %s %s hash=%016llx\n", what.c_str(), mode.c_str(),
         static_cast<unsigned long long>(hash));
  return 0;
}

// sweep --counts N,N,... : every dtype x op x memory mode at each count.
int scenario_sweep(px_client* c, const Flags& f) {
  int world = world_size(c);
  int checked = 0;
  for (uint64_t count : f.u64_list("counts")) {
    for (int t = 0; t < 6; ++t) {
      for (int op = 0; op < 4; ++op) {
        std::string name =
            "sweep_" + std::to_string(t) + "_" + std::to_string(op) + "_" + std::to_string(count);
        px_var* var = nullptr;
        check(px_register_dense(c, name.c_str(), static_cast<px_dtype>(t), count,
                                static_cast<px_reduce_op>(op), &var),
              "px_register_dense");
        for (int m = 0; m < 6; ++m) {
          const std::string& mode = kMemoryModes[static_cast<size_t>(m)];
          Buffers b(c, mode, count * element_size(static_cast<px_dtype>(t)));
          fill_input(static_cast<px_dtype>(t), g_rank, static_cast<uint64_t>(m), 3, count, b.in);
          allreduce_ok(var, b.in, b.out, name + " " + mode, 60000);
          verify(b.out,
                 expected_result(static_cast<px_dtype>(t), static_cast<px_reduce_op>(op), world,
                                 static_cast<uint64_t>(m), 3, count),
                 name + " " + mode);
          ++checked;
        }
      }
    }
  }
  printf("OK sweep %d results\n", checked);
  return 0;
}

// shuffle --vars N --steps N: every rank submits all (variable, step) pairs in its own random
// order (steps of one variable stay in order, as the ABI defines), all in flight at once.
int scenario_shuffle(px_client* c, const Flags& f) {
  int nvars = f.i32("vars");
  int steps = f.i32("steps");
  int world = world_size(c);
  struct Slot {
    px_var* var;
    px_dtype t;
    px_reduce_op op;
    uint64_t count;
    std::vector<void*> bufs;
  };
  std::vector<Slot> slots(static_cast<size_t>(nvars));
  for (int v = 0; v < nvars; ++v) {
    Slot& s = slots[static_cast<size_t>(v)];
    s.t = static_cast<px_dtype>(v % 6);
    s.op = static_cast<px_reduce_op>((v / 6) % 4);
    s.count = 1 + static_cast<uint64_t>(v) * 977 % 50000;
    std::string name = "shuffle_" + std::to_string(v);
    check(px_register_dense(c, name.c_str(), s.t, s.count, s.op, &s.var), "px_register_dense");
    for (int k = 0; k < steps; ++k) {
      void* p = nullptr;
      check(px_alloc(c, s.count * element_size(s.t), &p), "px_alloc");
      fill_input(s.t, g_rank, static_cast<uint64_t>(k), static_cast<uint64_t>(v), s.count, p);
      s.bufs.push_back(p);
    }
  }
  std::vector<int> order;
  for (int v = 0; v < nvars; ++v)
    for (int k = 0; k < steps; ++k) order.push_back(v);
  std::mt19937 rng(static_cast<unsigned>(1000 + g_rank * 7919));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> next(static_cast<size_t>(nvars), 0);
  std::vector<px_request*> reqs;
  std::vector<std::pair<int, int>> what;
  for (int v : order) {
    int k = next[static_cast<size_t>(v)]++;
    Slot& s = slots[static_cast<size_t>(v)];
    px_request* r = nullptr;
    check(px_allreduce(s.var, s.bufs[static_cast<size_t>(k)], s.bufs[static_cast<size_t>(k)], &r),
          "px_allreduce");
    reqs.push_back(r);
    what.push_back({v, k});
  }
  check(px_wait_all(reqs.data(), reqs.size(), 60000), "px_wait_all");
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto [v, k] = what[i];
    Slot& s = slots[static_cast<size_t>(v)];
    verify(s.bufs[static_cast<size_t>(k)],
           expected_result(s.t, s.op, world, static_cast<uint64_t>(k), static_cast<uint64_t>(v),
                           s.count),
           "shuffle var " + std::to_string(v) + " step " + std::to_string(k));
    px_request_free(reqs[i]);
  }
  printf("OK shuffle %zu operations\n", reqs.size());
  return 0;
}

// crash: step 0 completes; then rank 1 kills itself and rank 0 must see PX_ERR_PEER_LOST.
int scenario_crash(px_client* c) {
  px_var* var = nullptr;
  check(px_register_dense(c, "grad", PX_F32, 1 << 20, PX_SUM, &var), "px_register_dense");
  std::vector<float> buf(1 << 20, 1.0f);
  allreduce_ok(var, buf.data(), buf.data(), "step 0", 20000);
  if (g_rank == 1) {
    printf("rank 1 killing itself\n");
    fflush(stdout);
    usleep(100000);
    raise(SIGKILL);
  }
  px_request* req = nullptr;
  check(px_allreduce(var, buf.data(), buf.data(), &req), "px_allreduce step 1");
  px_status s = px_wait(req, 10000);
  std::string message = px_last_error();
  expect_status(s, PX_ERR_PEER_LOST, "px_wait step 1");
  expect_contains(message, "local rank 1");
  expect_contains(message, "variable 'grad'");
  px_request_free(req);
  // The job is broken now: new operations fail at once with the same cause.
  check(px_allreduce(var, buf.data(), buf.data(), &req), "px_allreduce step 2");
  expect_status(px_wait(req, 10000), PX_ERR_PEER_LOST, "px_wait step 2");
  px_request_free(req);
  printf("OK crash: %s\n", message.c_str());
  return 0;
}

// mismatch: rank 0 registers f32[100] sum; rank 1, after a barrier, f64[100] sum.
int scenario_mismatch(px_client* c) {
  px_var* var = nullptr;
  std::vector<double> buf(100, 1.0);
  if (g_rank == 0) {
    check(px_register_dense(c, "weights", PX_F32, 100, PX_SUM, &var), "px_register_dense");
    check(px_barrier(c, 20000), "px_barrier");
    px_request* req = nullptr;
    check(px_allreduce(var, buf.data(), buf.data(), &req), "px_allreduce");
    px_status s = px_wait(req, 20000);
    std::string message = px_last_error();
    expect_status(s, PX_ERR_MISMATCH, "px_wait on the mismatched variable");
    expect_contains(message, "f32[100] sum");
    expect_contains(message, "f64[100] sum");
    px_request_free(req);
    printf("OK mismatch rank 0: %s\n", message.c_str());
  } else {
    check(px_barrier(c, 20000), "px_barrier");
    px_status s = px_register_dense(c, "weights", PX_F64, 100, PX_SUM, &var);
    std::string message = px_last_error();
    expect_status(s, PX_ERR_MISMATCH, "px_register_dense with another dtype");
    expect_contains(message, "f32[100] sum");
    expect_contains(message, "f64[100] sum");
    if (var) die("a handle was returned for a mismatched registration");
    printf("OK mismatch rank 1: %s\n", message.c_str());
  }
  return 0;
}

// timeout: rank 0's wait passes its deadline while rank 1 holds back; the request is freed
// while still in flight, and both ranks then carry on normally.
int scenario_timeout(px_client* c) {
  px_var* var = nullptr;
  check(px_register_dense(c, "slow", PX_F32, 4096, PX_SUM, &var), "px_register_dense");
  std::vector<float> buf(4096, 1.0f);
  px_request* req = nullptr;
  if (g_rank == 0) {
    check(px_allreduce(var, buf.data(), buf.data(), &req), "px_allreduce");
    int32_t done = 1;
    check(px_test(req, &done), "px_test");
    if (done) die("px_test reported completion before the peer submitted");
    px_status s = px_wait(req, 200);
    std::string message = px_last_error();
    expect_status(s, PX_ERR_TIMEOUT, "px_wait with a 200 ms deadline");
    expect_contains(message, "'slow' step 0");
    check(px_request_free(req), "px_request_free of an in-flight request");
    check(px_barrier(c, 20000), "px_barrier");
  } else {
    check(px_barrier(c, 20000), "px_barrier");  // rank 0 arrives only after its timeout
    allreduce_ok(var, buf.data(), buf.data(), "step 0", 20000);
  }
  std::vector<float> again(4096, 2.0f);
  allreduce_ok(var, again.data(), again.data(), "step 1", 20000);
  for (float v : again)
    if (v != 4.0f) die("step 1 after the timeout gave " + std::to_string(v));
  printf("OK timeout\n");
  return 0;
}

// abi: a caller compiled against ABI 2.0 is refused at connect.
int scenario_abi() {
  px_connect_options o;
  px_connect_options_init(&o);
  o.abi_version = 2u << 16;
  o.timeout_ms = 5000;
  px_client* client = nullptr;
  px_status s = px_connect(&o, &client);
  std::string message = px_last_error();
  expect_status(s, PX_ERR_VERSION, "px_connect with ABI 2.0");
  expect_contains(message, "2.0");
  std::string daemon_abi = "(ABI " + std::to_string(PX_ABI_VERSION_MAJOR) + "." +
                           std::to_string(PX_ABI_VERSION_MINOR) + ")";
  expect_contains(message, daemon_abi);
  if (client) die("a client was returned");
  printf("OK abi: %s\n", message.c_str());
  return 0;
}

// errors: argument checks that never reach the daemon, and an unknown-variable error.
int scenario_errors(px_client* c) {
  px_var* var = nullptr;
  expect_status(px_register_dense(c, "bad", static_cast<px_dtype>(17), 10, PX_SUM, &var),
                PX_ERR_INVALID, "bad dtype");
  expect_status(px_register_dense(c, "bad", PX_F32, 0, PX_SUM, &var), PX_ERR_INVALID, "zero count");
  check(px_register_dense(c, "ok", PX_F32, 256, PX_SUM, &var), "px_register_dense");
  std::vector<float> buf(512);
  px_request* req = nullptr;
  expect_status(px_allreduce(var, buf.data(), buf.data() + 1, &req), PX_ERR_INVALID,
                "overlapping in/out");
  expect_status(px_allreduce(var, nullptr, buf.data(), &req), PX_ERR_INVALID, "NULL in");
  void* p = nullptr;
  expect_status(px_alloc(c, 1ull << 40, &p), PX_ERR_NO_MEMORY, "huge px_alloc");
  expect_status(px_free(c, buf.data()), PX_ERR_INVALID, "px_free of foreign memory");
  expect_status(px_wait(nullptr, 0), PX_ERR_INVALID, "px_wait(NULL)");
  if (std::string(px_strerror(PX_ERR_PEER_LOST)).empty()) die("empty px_strerror");
  if (px_abi_version() != PX_ABI_VERSION) die("px_abi_version differs from the header");
  px_world_info w;
  w.struct_size = 0;
  expect_status(px_world(c, &w), PX_ERR_INVALID, "px_world without struct_size");
  expect_status(px_world(nullptr, &w), PX_ERR_INVALID, "px_world(NULL)");
  px_var_stats stats;
  stats.struct_size = 0;
  expect_status(px_var_stats_get(var, &stats), PX_ERR_INVALID,
                "px_var_stats_get without struct_size");
  expect_status(px_barrier(nullptr, 10), PX_ERR_INVALID, "px_barrier(NULL)");
  // Connecting where no daemon listens fails by the deadline, naming the path.
  px_connect_options o;
  px_connect_options_init(&o);
  o.socket_path = "/tmp/px-no-daemon-here.sock";
  o.timeout_ms = 200;
  px_client* none = nullptr;
  expect_status(px_connect(&o, &none), PX_ERR_CONNECT, "px_connect to a missing socket");
  expect_contains(px_last_error(), "/tmp/px-no-daemon-here.sock");
  o.socket_path = nullptr;
  o.local_size = 2;
  o.local_rank = 5;
  expect_status(px_connect(&o, &none), PX_ERR_INVALID, "px_connect with local_rank >= local_size");
  expect_status(px_connect(nullptr, nullptr), PX_ERR_INVALID, "px_connect(NULL out)");
  printf("OK errors\n");
  return 0;
}

// barriers --count N: N barriers in a row.
int scenario_barriers(px_client* c, const Flags& f) {
  int n = f.i32("count");
  for (int i = 0; i < n; ++i) check(px_barrier(c, 20000), "px_barrier");
  printf("OK %d barriers\n", n);
  return 0;
}

// world: prints where this worker sits, for the harness to check node-major ranks.
int scenario_world(px_client* c) {
  px_world_info w = world_of(c);
  printf("WORLD node=%d/%d rank=%d/%d local=%d/%d\n", w.node_index, w.node_count, w.rank,
         w.world_size, w.local_rank, w.local_size);
  check(px_barrier(c, 20000), "px_barrier");
  return 0;
}

// until-lost [--sparse] [--joined]: steps (allreduces, or pull + push of a sparse table)
// until one fails; it must fail with PX_ERR_PEER_LOST (a daemon of the cluster is killed
// meanwhile by the harness), or with --joined PX_ERR_MEMBERSHIP (a node joins; an ABI 1.14
// client, PX_TEST_OLD_ABI_SOCKET, is told PX_ERR_PEER_LOST).
// With PX_TEST_KILL_RANK=r and PX_TEST_KILL_STEP=s, the worker of global rank r kills
// itself (SIGKILL, no goodbye) at step s instead: the others must then fail. With
// PX_TEST_VANISH_NODE=k (netns clusters), node k's link goes down at step s instead.
int scenario_until_lost(px_client* c, bool sparse, bool auto_route, bool joined) {
  int kill_rank = getenv("PX_TEST_KILL_RANK") ? atoi(getenv("PX_TEST_KILL_RANK")) : -1;
  int kill_step = getenv("PX_TEST_KILL_STEP") ? atoi(getenv("PX_TEST_KILL_STEP")) : -1;
  int vanish_node = getenv("PX_TEST_VANISH_NODE") ? atoi(getenv("PX_TEST_VANISH_NODE")) : -1;
  px_world_info world = world_of(c);
  px_var* var = nullptr;
  if (sparse) {
    px_sparse_options o;
    px_sparse_options_init(&o);
    if (auto_route) o.route = PX_ROUTE_AUTO;
    check(px_register_sparse(c, "steady", PX_F32, 100000, 16, &o, &var), "px_register_sparse");
  } else {
    check(px_register_dense(c, "steady", PX_F32, 1 << 18, PX_SUM, &var), "px_register_dense");
  }
  std::vector<float> buf(1 << 18, 1.0f);
  std::vector<int64_t> rows(1000);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i * 97);
  for (int step = 0; step < 1000000; ++step) {
    if (world.rank == kill_rank && step == kill_step) {
      fflush(stdout);
      raise(SIGKILL);
    }
    if (vanish_node == world.node_index && world.local_rank == 0 && step == kill_step) {
      // The node drops off the network without closing anything (netns: link down).
      if (system("ip link set eth0 down") != 0) die("ip link set eth0 down failed");
      printf("node %d vanished at step %d\n", vanish_node, step);
    }
    px_request* req = nullptr;
    px_status s = PX_OK;
    auto t0 = std::chrono::steady_clock::now();  // how long the failing step waited
    if (sparse) {
      s = px_pull_rows(var, rows.data(), rows.size(), buf.data(), &req);
      if (s == PX_OK) s = px_wait(req, 30000);
      if (s == PX_OK) {
        px_request_free(req);
        s = px_push_rows(var, rows.data(), rows.size(), buf.data(), &req);
        if (s == PX_OK) s = px_wait(req, 30000);
      }
    } else {
      s = px_allreduce(var, buf.data(), buf.data(), &req);
      if (s == PX_OK) s = px_wait(req, 30000);
    }
    std::string message = px_last_error();
    px_request_free(req);
    if (s == PX_OK) {
      if (step == 0) {
        printf("first step done\n");
        if (const char* dir = getenv("PX_TEST_READY_DIR")) {
          std::string path = std::string(dir) + "/" + std::to_string(world.node_index);
          if (FILE* f = fopen(path.c_str(), "w")) fclose(f);
        }
      }
      std::fill(buf.begin(), buf.end(), 1.0f);
      continue;
    }
    if (joined && test_abi_minor() >= 15)
      expect_status(s, PX_ERR_MEMBERSHIP, "a step while a node joins");
    else
      expect_status(
          s, PX_ERR_PEER_LOST,
          joined ? "a step while a node joins (an ABI 1.14 client)" : "a step while a node dies");
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - t0);
    printf("LOST at step %d after %lld ms: %s\n", step, static_cast<long long>(waited.count()),
           message.c_str());
    if (sparse) {
      // A checkpoint needs every node's shards: it must fail (not hang) and say which.
      std::string dir = "/tmp/pxt-lost-ckpt-" + std::to_string(getpid());
      mkdir(dir.c_str(), 0700);
      auto t0 = std::chrono::steady_clock::now();
      px_status cs = px_checkpoint(c, dir.c_str(), 20000);
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string why = px_last_error();
      std::filesystem::remove_all(dir);
      expect_status(cs, PX_ERR_PEER_LOST, "a checkpoint with a node lost");
      printf("CHECKPOINT failed after %.1f s: %s\n", seconds, why.c_str());
    }
    return 0;
  }
  die("no failure after 1000000 steps");
}

// steady DIR: exact f32 sum allreduces until a file DIR/stop appears; after every step the
// number of steps done is in DIR/steps-RANK (global rank; replaced whole), so a test can
// watch the job go on while it does other things to the cluster. Whether to stop is itself
// agreed (a MAX allreduce of "I saw the file"), so every worker runs the same steps. Every
// wait has a 30 s deadline, the whole run 300 s.
int scenario_steady(px_client* c, const std::string& dir) {
  const uint64_t count = 4096;
  int world = world_size(c);
  px_var* var = nullptr;
  px_var* stop_var = nullptr;
  check(px_register_dense(c, "steady", PX_F32, count, PX_SUM, &var), "px_register_dense");
  check(px_register_dense(c, "stop", PX_I32, 1, PX_MAX, &stop_var), "px_register_dense");
  std::vector<unsigned char> in(count * sizeof(float)), out(in.size());
  auto start = std::chrono::steady_clock::now();
  std::string mine = dir + "/steps-" + std::to_string(g_rank);
  for (uint64_t step = 0;; ++step) {
    int32_t stop = access((dir + "/stop").c_str(), F_OK) == 0 ? 1 : 0;
    px_request* req = nullptr;
    std::string what = "stop flag before step " + std::to_string(step);
    check(px_allreduce(stop_var, &stop, &stop, &req), what.c_str());
    check(px_wait(req, 30000), what.c_str());
    px_request_free(req);
    if (stop) {
      printf("OK steady: %llu steps\n", static_cast<unsigned long long>(step));
      return 0;
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(300))
      die("no " + dir + "/stop after 300 s (step " + std::to_string(step) + ")");
    fill_input(PX_F32, g_rank, step, 1, count, in.data());
    what = "variable 'steady' step " + std::to_string(step);
    check(px_allreduce(var, in.data(), out.data(), &req), what.c_str());
    check(px_wait(req, 30000), what.c_str());
    px_request_free(req);
    verify(out.data(), expected_result(PX_F32, PX_SUM, world, step, 1, count), what);
    std::string tmp = mine + ".tmp";
    if (FILE* f = fopen(tmp.c_str(), "w")) {
      fprintf(f, "%llu\n", static_cast<unsigned long long>(step + 1));
      fclose(f);
      rename(tmp.c_str(), mine.c_str());
    }
  }
}

// cluster-mismatch: node i registers 100 + i elements; every worker must get
// PX_ERR_MISMATCH naming the nodes' shapes: from the registration itself if the nodes'
// verdict arrived first, else from its next operation.
// Registers an f32 sum variable of count values with options, then (if that was taken)
// takes one allreduce step of it: the first failure's status, and the message it left.
px_status register_and_step(px_client* c, const char* name, uint64_t count,
                            const px_dense_options& options, std::string* message) {
  px_var* var = nullptr;
  px_status s = px_register_dense_ex(c, name, PX_F32, count, PX_SUM, &options, &var);
  *message = px_last_error();
  if (s != PX_OK) return s;
  std::vector<float> buf(count, 1.0f);
  px_request* req = nullptr;
  check(px_allreduce(var, buf.data(), buf.data(), &req), "px_allreduce");
  s = px_wait(req, 20000);
  *message = px_last_error();
  px_request_free(req);
  return s;
}

int scenario_cluster_mismatch(px_client* c) {
  px_world_info w = world_of(c);
  px_dense_options o;
  px_dense_options_init(&o);
  std::string message;
  px_status s =
      register_and_step(c, "table", 100 + static_cast<uint64_t>(w.node_index), o, &message);
  expect_status(s, PX_ERR_MISMATCH, "a variable whose shape differs across nodes");
  expect_contains(message, "f32[100] sum");
  expect_contains(message, "f32[101] sum");
  // A dense wire dtype that differs across nodes (1.13): the message names both.
  o.wire_dtype = w.node_index == 0 ? PX_BF16 : PX_F32;
  std::string wire_message;
  s = register_and_step(c, "wired", 64, o, &wire_message);
  expect_status(s, PX_ERR_MISMATCH, "a dense wire dtype that differs across nodes");
  expect_contains(wire_message, "f32[64] sum wire=bf16");
  printf("OK cluster-mismatch: %s | %s\n", message.c_str(), wire_message.c_str());
  return 0;
}

// Every scenario and its flags (the sparse ones in sparse_scenarios.cc). The abi13-*
// scenarios take no flags.
const std::vector<ScenarioSpec> kScenarios = {
    // --dtype in px_dtype order, --op in px_reduce_op order, --memory in kMemoryModes order.
    {"allreduce",
     {"dtype:f32|f64|f16|bf16|i32|i64", "op:sum|mean|min|max", "count:n",
      "memory:arena|ordinary|inplace-arena|inplace-ordinary|arena-in|arena-out", "steps:n"},
     {},
     "allreduces of one variable, every step checked against the reference"},
    {"sweep", {"counts:n,n"}, {}, "every dtype x op x memory mode at each count"},
    {"shuffle", {"vars:n", "steps:n"}, {}, "vars x steps allreduces in a random order per rank"},
    {"barriers", {"count:n"}, {}, "barriers in a row"},
    {"until-lost",
     {},
     {"sparse", "auto-route", "joined"},
     "steps until a node is lost (PX_TEST_KILL_*, _VANISH_NODE; --auto-route: PX_ROUTE_AUTO; "
     "--joined: until a node joins)"},
    {"crash", {}, {}, "rank 1 kills itself mid-step; rank 0 sees PX_ERR_PEER_LOST"},
    {"mismatch", {}, {}, "one variable registered with two dtypes"},
    {"timeout", {}, {}, "a wait past its deadline, then normal steps"},
    {"errors", {}, {}, "argument checks of the C ABI"},
    {"abi", {}, {}, "a client of ABI 2.0 is refused"},
    {"world", {}, {}, "prints WORLD node=.. rank=.. local=.."},
    {"cluster-mismatch", {}, {}, "shapes that differ across nodes"},
    {"steady", {"dir"}, {}, "allreduces until a stop file appears in --dir (cluster faults)"},
    {"collectives", {}, {}, "px_broadcast, px_allgather, px_allgatherv against a reference"},
    {"exchanges", {}, {}, "px_reduce_scatter, px_alltoall, px_alltoallv against a reference"},
    {"priority",
     {"priority:n", "large:n", "rounds:n"},
     {},
     "a large allreduce at priority 0, a small one at --priority behind it: which ends first"},
    {"job-churn", {"rows:n"}, {}, "one short sparse + dense job (job-end tests)"},
    {"leave-early", {}, {}, "the last worker leaves; the others' next allreduce fails at once"},
    {"leave-mid-step", {}, {}, "the last worker leaves before a push; pulls wait at the owners"},
    {"limits-variables", {}, {}, "variables and sparse bytes past the job's limits"},
    {"limits-requests", {"dir"}, {}, "requests in flight past the job's limit"},
    {"limits-arena", {}, {}, "a worker's arena past the job's limit (connects itself)"},
};

const ScenarioSpec* find_spec(const std::string& name) {
  for (auto* table : {&kScenarios, &sparse_scenario_specs(), &wire_scenario_specs(),
                      &prefetch_scenario_specs(), &group_scenario_specs(), &cache_scenario_specs()})
    for (auto& spec : *table)
      if (spec.name == name) return &spec;
  return nullptr;
}

void print_help() {
  printf("usage: px_test_worker SCENARIO [--flag VALUE | --switch]...\n");
  for (auto* table : {&kScenarios, &sparse_scenario_specs(), &wire_scenario_specs(),
                      &prefetch_scenario_specs(), &group_scenario_specs(), &cache_scenario_specs()})
    for (auto& spec : *table)
      printf("  %s %s\n      %s\n", spec.name.c_str(), describe_flags(spec).c_str(),
             spec.about.c_str());
  printf("  abi13-*, abi18-* (no flags): the ABI 1.3 and 1.8 scenarios of abi_scenarios.cc\n");
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    print_help();
    return 2;
  }
  std::string scenario = argv[1];
  if (scenario == "--help" || scenario == "-h") {
    print_help();
    return 0;
  }
  if (const char* e = getenv("PX_TEST_EXACT")) exact_inputs() = std::string(e) == "1";
  const ScenarioSpec* spec = find_spec(scenario);
  // The ABI scenarios of abi_scenarios.cc (abi13-*, abi18-*), without flags.
  bool abi13 = scenario.rfind("abi13-", 0) == 0 || scenario.rfind("abi18-", 0) == 0;
  if (!spec && !abi13) {
    printf("USAGE px_test_worker: unknown scenario '%s' (px_test_worker --help lists them)\n",
           scenario.c_str());
    return 2;
  }
  // Checked before connecting: a bad command line fails at once, naming what is wrong.
  const ScenarioSpec no_flags{scenario, {}, {}, ""};
  Flags flags(spec ? *spec : no_flags, argc - 2, argv + 2);
  if (scenario == "abi") return scenario_abi();
  if (scenario == "abi13-connect") return run_connect_scenario();
  if (scenario == "limits-arena") return run_limits_arena();
  px_client* c = connect_default();
  // These end their client themselves (one of them tests px_disconnect).
  if (scenario == "abi13-lifetimes" || scenario == "abi13-abort")
    return run_abi_scenario(c, scenario);
  int rc = 1;
  if (scenario == "allreduce")
    rc = scenario_allreduce(c, flags);
  else if (scenario == "sweep")
    rc = scenario_sweep(c, flags);
  else if (scenario == "shuffle")
    rc = scenario_shuffle(c, flags);
  else if (scenario == "crash")
    rc = scenario_crash(c);
  else if (scenario == "mismatch")
    rc = scenario_mismatch(c);
  else if (scenario == "timeout")
    rc = scenario_timeout(c);
  else if (scenario == "errors")
    rc = scenario_errors(c);
  else if (scenario == "barriers")
    rc = scenario_barriers(c, flags);
  else if (scenario == "world")
    rc = scenario_world(c);
  else if (scenario == "until-lost")
    rc = scenario_until_lost(c, flags.on("sparse"), flags.on("auto-route"), flags.on("joined"));
  else if (scenario == "steady")
    rc = scenario_steady(c, flags.str("dir"));
  else if (scenario == "cluster-mismatch")
    rc = scenario_cluster_mismatch(c);
  else if (scenario == "collectives")
    rc = run_collectives_scenario(c);
  else if (scenario == "exchanges")
    rc = run_exchanges_scenario(c);
  else if (scenario == "priority")
    rc = run_priority_scenario(c, flags);
  else if (scenario == "job-churn")
    rc = run_job_churn(c, flags);
  else if (scenario == "leave-early")
    rc = run_leave_early(c);
  else if (scenario == "leave-mid-step")
    rc = run_leave_mid_step(c);
  else if (scenario == "limits-variables")
    rc = run_limits_variables(c);
  else if (scenario == "limits-requests")
    rc = run_limits_requests(c, flags.str("dir"));
  else if (abi13)
    rc = run_abi_scenario(c, scenario);
  else if (scenario.rfind("wire-", 0) == 0)
    rc = run_wire_scenario(c, scenario, flags);
  else if (scenario.rfind("prefetch-", 0) == 0)
    rc = run_prefetch_scenario(c, scenario, flags);
  else if (scenario.rfind("cache-", 0) == 0)
    rc = run_cache_scenario(c, scenario, flags);
  else if (scenario.rfind("group-", 0) == 0)
    rc = run_group_scenario(c, scenario, flags);
  else
    rc = run_sparse_scenario(c, scenario, flags);
  check(px_disconnect(c), "px_disconnect");
  return rc;
}
