// Worker scenario "collectives": px_broadcast (every root), px_allgather and px_allgatherv
// for every dtype, in arena and ordinary memory, at sizes below and above the daemon's
// inline-copy threshold, checked bitwise against a reference built here from every rank's
// known input; then the bad inputs (mismatched roots and counts, a root out of range).
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
  px_status s = px_wait(r, 30000);
  if (s != PX_OK) die(what + ": " + px_status_name(s) + ": " + px_request_error(r));
  check(px_request_free(r), "px_request_free");
}

void expect_bytes(const unsigned char* got, const unsigned char* want, size_t n,
                  const std::string& what) {
  if (n > 0 && std::memcmp(got, want, n) != 0) die(what + ": result differs from the reference");
}

}  // namespace

int run_collectives_scenario(px_client* c) {
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  const uint64_t sizes[] = {1, 777, 40000};  // 40000 x 8 bytes goes through the pool
  uint64_t step = 0;
  for (int d = 0; d < 6; ++d) {
    px_dtype t = kDtypes[d];
    size_t es = element_size(t);
    for (uint64_t count : sizes) {
      std::string tag = std::string(kDtypeNames[d]) + "[" + std::to_string(count) + "]";
      px_var* v = nullptr;
      check(px_register_dense(c, ("coll-" + tag).c_str(), t, count, PX_SUM, &v), "register");
      for (int arena = 0; arena < 2; ++arena) {
        std::string mode = arena ? " arena" : " ordinary";
        // Broadcast from the first and the last rank (every rank when there are few).
        for (int root = 0; root < w.world_size; ++root) {
          if (w.world_size > 3 && root != 0 && root != w.world_size - 1) continue;
          Buffer in(c, arena, count * es), out(c, arena, count * es);
          std::vector<unsigned char> want(count * es);
          fill_input(t, root, step, 5, count, want.data());
          if (w.rank == root) std::memcpy(in.data, want.data(), want.size());
          std::memset(out.data, 0xab, count * es);
          px_op_options o;
          px_op_options_init(&o);
          o.root = root;
          px_request* r = nullptr;
          check(px_broadcast_ex(v, w.rank == root ? in.data : nullptr, out.data, &o, &r),
                "px_broadcast");
          std::string what = "broadcast " + tag + mode + " root " + std::to_string(root);
          run(r, what);
          expect_bytes(out.bytes(), want.data(), want.size(), what);
          ++step;
        }
        // Allgather: every rank's block, in rank order.
        {
          Buffer in(c, arena, count * es), out(c, arena, count * es * w.world_size);
          fill_input(t, w.rank, step, 6, count, in.data);
          std::vector<unsigned char> want(count * es * w.world_size);
          for (int k = 0; k < w.world_size; ++k)
            fill_input(t, k, step, 6, count, want.data() + k * count * es);
          px_request* r = nullptr;
          check(px_allgather(v, in.data, out.data, &r), "px_allgather");
          run(r, "allgather " + tag + mode);
          expect_bytes(out.bytes(), want.data(), want.size(), "allgather " + tag + mode);
          ++step;
        }
        // Allgatherv: uneven blocks, one of them empty.
        {
          std::vector<uint64_t> counts(static_cast<size_t>(w.world_size));
          uint64_t total = 0;
          for (int k = 0; k < w.world_size; ++k)
            total += counts[k] = k == 1 ? 0 : (count * (k + 1) / w.world_size + k) % (count + 1);
          uint64_t mine = counts[static_cast<size_t>(w.rank)];
          Buffer in(c, arena, mine * es), out(c, arena, total * es);
          fill_input(t, w.rank, step, 7, mine, in.data);
          std::vector<unsigned char> want(total * es);
          for (int k = 0, at = 0; k < w.world_size; at += static_cast<int>(counts[k++] * es))
            fill_input(t, k, step, 7, counts[k], want.data() + at);
          px_request* r = nullptr;
          check(px_allgatherv(v, in.data, counts.data(), out.data, &r), "px_allgatherv");
          run(r, "allgatherv " + tag + mode);
          expect_bytes(out.bytes(), want.data(), want.size(), "allgatherv " + tag + mode);
          ++step;
        }
      }
    }
  }
  // Bad input: workers naming different roots, or giving different counts, fail the step
  // for every worker with PX_ERR_INVALID; a root out of range is refused at the call.
  px_var* v = nullptr;
  check(px_register_dense(c, "coll-bad", PX_I32, 8, PX_SUM, &v), "register");
  std::vector<int32_t> x(8, w.rank), y(8 * static_cast<size_t>(w.world_size));
  px_request* r = nullptr;
  px_op_options o;
  px_op_options_init(&o);
  o.root = w.world_size;
  expect_status(px_broadcast_ex(v, x.data(), y.data(), &o, &r), PX_ERR_INVALID,
                "root out of range");
  // (On one node only: a node whose step failed leaves the others' cross-node stage waiting
  // for it, see README Limits.)
  if (w.local_size > 1 && w.world_size == w.local_size) {
    o.root = w.rank == 0 ? 0 : 1;
    check(px_broadcast_ex(v, x.data(), y.data(), &o, &r), "px_broadcast_ex");
    expect_status(px_wait(r, 30000), PX_ERR_INVALID, "broadcast with different roots");
    expect_contains(px_request_error(r), "root");
    check(px_request_free(r), "px_request_free");
    std::vector<uint64_t> counts(static_cast<size_t>(w.world_size), 2);
    counts[0] = w.local_rank == 0 ? 2 : 3;
    check(px_allgatherv(v, x.data(), counts.data(), y.data(), &r), "px_allgatherv");
    expect_status(px_wait(r, 30000), PX_ERR_INVALID, "allgatherv with different counts");
    expect_contains(px_request_error(r), "counts");
    check(px_request_free(r), "px_request_free");
  }
  check(px_barrier(c, 30000), "px_barrier");
  return 0;
}

}  // namespace pxt
