// Worker scenario "exchanges": px_reduce_scatter for every dtype x op, px_alltoall for
// every dtype and px_alltoallv with uneven and empty blocks, in arena and ordinary memory,
// at sizes below and above the daemon's inline threshold, checked bitwise against a
// reference built here from every rank's known input; then bad input (counts that do not
// match between two workers, counts above the variable's, sizes the call refuses). On a
// cluster run it with PX_TEST_EXACT=1: sums are then exact in every order.
#include <cstring>
#include <string>
#include <vector>

#include "parallax_c.h"
#include "tests/integration/worker_data.h"
#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

const px_dtype kDtypes[] = {PX_F32, PX_F64, PX_F16, PX_BF16, PX_I32, PX_I64};
const char* const kDtypeNames[] = {"f32", "f64", "f16", "bf16", "i32", "i64"};
const px_reduce_op kOps[] = {PX_SUM, PX_MEAN, PX_MIN, PX_MAX, PX_PROD};
const char* const kOpNames[] = {"sum", "mean", "min", "max", "prod"};

// A buffer in the arena or in ordinary memory.
struct Buffer {
  px_client* client;
  std::vector<unsigned char> plain;
  void* arena = nullptr;
  void* data = nullptr;
  Buffer(px_client* c, bool in_arena, size_t bytes) : client(c) {
    if (in_arena) {
      check(px_alloc(c, bytes ? bytes : 1, &arena), "px_alloc");
      data = arena;
    } else {
      plain.resize(bytes ? bytes : 1);
      data = plain.data();
    }
  }
  ~Buffer() {
    if (arena) px_free(client, arena);
  }
  unsigned char* bytes() { return static_cast<unsigned char*>(data); }
};

void run(px_request* r, const std::string& what) {
  px_status s = px_wait(r, 60000);
  if (s != PX_OK) die(what + ": " + px_status_name(s) + ": " + px_request_error(r));
  check(px_request_free(r), "px_request_free");
}

void expect_bytes(const unsigned char* got, const unsigned char* want, size_t n,
                  const std::string& what) {
  if (n > 0 && std::memcmp(got, want, n) != 0) die(what + ": result differs from the reference");
}

// Elements rank `from` sends rank `to` in the uneven alltoallv: some empty, none above most.
uint64_t uneven_count(int from, int to, uint64_t most) {
  if ((from + 2 * to) % 4 == 1) return 0;
  return (static_cast<uint64_t>(from) * 37 + static_cast<uint64_t>(to) * 11 + most / 2) %
         (most + 1);
}

void reduce_scatters(px_client* c, const px_world_info& w, uint64_t* step) {
  const uint64_t sizes[] = {1, 300, 20000};  // 20000 x 8 bytes x workers goes to the pool
  for (int d = 0; d < 6; ++d) {
    px_dtype t = kDtypes[d];
    size_t es = element_size(t);
    for (int o = 0; o < 5; ++o) {
      for (uint64_t count : sizes) {
        std::string tag =
            std::string(kDtypeNames[d]) + " " + kOpNames[o] + "[" + std::to_string(count) + "]";
        px_var* v = nullptr;
        check(px_register_dense(c, ("rs-" + tag).c_str(), t, count, kOps[o], &v), "register");
        uint64_t all = count * static_cast<uint64_t>(w.world_size);
        std::vector<unsigned char> want = expected_result(t, kOps[o], w.world_size, *step, 8, all);
        for (int arena = 0; arena < 2; ++arena) {
          Buffer in(c, arena, all * es), out(c, arena, count * es);
          fill_input_for(t, kOps[o], w.rank, *step, 8, all, in.data);
          std::memset(out.data, 0xab, count * es);
          px_request* r = nullptr;
          check(px_reduce_scatter(v, in.data, out.data, &r), "px_reduce_scatter");
          std::string what = "reduce_scatter " + tag + (arena ? " arena" : " ordinary");
          run(r, what);
          expect_bytes(out.bytes(), want.data() + static_cast<size_t>(w.rank) * count * es,
                       count * es, what);
        }
        ++*step;
      }
    }
  }
}

void alltoalls(px_client* c, const px_world_info& w, uint64_t* step) {
  const uint64_t sizes[] = {1, 300, 20000};
  size_t world = static_cast<size_t>(w.world_size);
  for (int d = 0; d < 6; ++d) {
    px_dtype t = kDtypes[d];
    size_t es = element_size(t);
    for (uint64_t count : sizes) {
      std::string tag = std::string(kDtypeNames[d]) + "[" + std::to_string(count) + "]";
      px_var* v = nullptr;
      check(px_register_dense(c, ("a2a-" + tag).c_str(), t, count, PX_SUM, &v), "register");
      for (int arena = 0; arena < 2; ++arena) {
        std::string mode = arena ? " arena" : " ordinary";
        // Equal blocks: block k of rank r's input is for rank k (seed 20 + k).
        {
          Buffer in(c, arena, world * count * es), out(c, arena, world * count * es);
          std::vector<unsigned char> want(world * count * es);
          for (size_t k = 0; k < world; ++k) {
            fill_input(t, w.rank, *step, 20 + k, count, in.bytes() + k * count * es);
            fill_input(t, static_cast<int>(k), *step, 20 + static_cast<uint64_t>(w.rank), count,
                       want.data() + k * count * es);
          }
          px_request* r = nullptr;
          check(px_alltoall(v, in.data, out.data, &r), "px_alltoall");
          run(r, "alltoall " + tag + mode);
          expect_bytes(out.bytes(), want.data(), want.size(), "alltoall " + tag + mode);
          ++*step;
        }
        // Uneven blocks, some empty.
        {
          std::vector<uint64_t> send(world), recv(world);
          uint64_t sent = 0, received = 0;
          for (size_t k = 0; k < world; ++k) {
            sent += send[k] = uneven_count(w.rank, static_cast<int>(k), count);
            received += recv[k] = uneven_count(static_cast<int>(k), w.rank, count);
          }
          Buffer in(c, arena, sent * es), out(c, arena, received * es);
          std::vector<unsigned char> want(received * es);
          for (size_t k = 0, at = 0, from = 0; k < world; ++k) {
            fill_input(t, w.rank, *step, 40 + k, send[k], in.bytes() + at);
            fill_input(t, static_cast<int>(k), *step, 40 + static_cast<uint64_t>(w.rank), recv[k],
                       want.data() + from);
            at += send[k] * es;
            from += recv[k] * es;
          }
          px_request* r = nullptr;
          check(px_alltoallv(v, in.data, send.data(), out.data, recv.data(), &r), "px_alltoallv");
          run(r, "alltoallv " + tag + mode);
          expect_bytes(out.bytes(), want.data(), want.size(), "alltoallv " + tag + mode);
          ++*step;
        }
      }
    }
  }
}

void bad_input(px_client* c, const px_world_info& w) {
  size_t world = static_cast<size_t>(w.world_size);
  px_var* v = nullptr;
  check(px_register_dense(c, "exchange-bad", PX_I32, 8, PX_SUM, &v), "register");
  std::vector<int32_t> x(8 * world, w.rank), y(8 * world);
  std::vector<uint64_t> send(world, 4), recv(world, 4);
  px_request* r = nullptr;
  send[0] = 9;  // above the variable's count of 8
  expect_status(px_alltoallv(v, x.data(), send.data(), y.data(), recv.data(), &r), PX_ERR_INVALID,
                "alltoallv count above the variable's");
  expect_contains(px_last_error(), "above the variable's count");
  expect_status(px_reduce_scatter(v, x.data(), x.data(), &r), PX_ERR_INVALID,
                "reduce_scatter in place");
  // On one node only: two workers that disagree on a block's size fail the step for every
  // local worker (on a cluster the job would end, see docs/limits.md).
  if (w.local_size > 1 && w.world_size == w.local_size) {
    send[0] = 4;
    if (w.rank == 1) recv[0] = 3;  // rank 0 sends rank 1 four elements
    check(px_alltoallv(v, x.data(), send.data(), y.data(), recv.data(), &r), "px_alltoallv");
    expect_status(px_wait(r, 30000), PX_ERR_INVALID, "alltoallv with counts that disagree");
    expect_contains(px_request_error(r), "rank 0 sends 4 elements to rank 1, which expects 3");
    check(px_request_free(r), "px_request_free");
  }
}

}  // namespace

int run_exchanges_scenario(px_client* c) {
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  uint64_t step = 0;
  reduce_scatters(c, w, &step);
  alltoalls(c, w, &step);
  bad_input(c, w);
  check(px_barrier(c, 30000), "px_barrier");
  return 0;
}

}  // namespace pxt
