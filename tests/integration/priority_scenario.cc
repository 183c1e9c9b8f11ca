// Worker scenario "priority": in each round a large allreduce at priority 0 and, submitted
// right behind it, a small one at --priority. Prints "PRIORITY round=R small_first=0|1"
// (whether the small one had completed while the large one had not) and checks both results.
// With priority the small one's messages overtake the large one's chunks waiting for the
// link on every node (transport/fabric/send_window.h), so it finishes first; the large one
// needs 2 (n - 1) ring steps of many chunks, the small one one exchange.
#include <cstdio>
#include <string>
#include <vector>

#include "parallax_c.h"
#include "tests/integration/worker_util.h"

namespace pxt {
namespace {

px_request* submit(px_var* v, float* buffer, int priority, const char* what) {
  px_op_options o;
  px_op_options_init(&o);
  o.priority = priority;
  px_request* r = nullptr;
  check(px_allreduce_ex(v, buffer, buffer, &o, &r), what);  // in place
  return r;
}

void expect_all(const float* got, size_t n, float want, const std::string& what) {
  for (size_t i = 0; i < n; i += n / 7 + 1)  // a spread of elements, the last among them
    if (got[i] != want || got[n - 1] != want)
      die(what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", not " +
          std::to_string(want));
}

}  // namespace

int run_priority_scenario(px_client* c, const Flags& flags) {
  px_world_info w = world_of(c);
  uint64_t large_count = flags.u64("large", 16ull << 20);
  const uint64_t small_count = 1024;
  int priority = static_cast<int>(flags.u64("priority"));
  uint64_t rounds = flags.u64("rounds", 3);
  px_var *large = nullptr, *small = nullptr;
  check(px_register_dense(c, "prio-large", PX_F32, large_count, PX_SUM, &large), "register large");
  check(px_register_dense(c, "prio-small", PX_F32, small_count, PX_SUM, &small), "register small");
  void *large_mem = nullptr, *small_mem = nullptr;
  check(px_alloc(c, large_count * sizeof(float), &large_mem), "px_alloc large");
  check(px_alloc(c, small_count * sizeof(float), &small_mem), "px_alloc small");
  auto* large_buf = static_cast<float*>(large_mem);
  auto* small_buf = static_cast<float*>(small_mem);
  // Small integers: every summation order gives the same exact float.
  float ranks_sum = static_cast<float>(w.world_size * (w.world_size + 1) / 2);
  for (uint64_t round = 0; round < rounds; ++round) {
    for (uint64_t i = 0; i < large_count; ++i) large_buf[i] = static_cast<float>(w.rank + 1);
    for (uint64_t i = 0; i < small_count; ++i)
      small_buf[i] = static_cast<float>(w.rank + 1 + static_cast<int>(round));
    px_request* l = submit(large, large_buf, 0, "px_allreduce_ex large");
    px_request* s = submit(small, small_buf, priority, "px_allreduce_ex small");
    check_wait(s, "small allreduce", 120000);
    int32_t large_done = 0;
    check(px_test(l, &large_done), "px_test large");
    check_wait(l, "large allreduce", 120000);
    expect_all(large_buf, large_count, ranks_sum, "large allreduce");
    expect_all(small_buf, small_count,
               ranks_sum + static_cast<float>(w.world_size * static_cast<int>(round)),
               "small allreduce");
    printf("PRIORITY round=%llu small_first=%d\n", static_cast<unsigned long long>(round),
           large_done ? 0 : 1);
  }
  check(px_free(c, large_mem), "px_free");
  check(px_free(c, small_mem), "px_free");
  printf("OK priority\n");
  return 0;
}

}  // namespace pxt
