// Helpers shared by the integration-test worker's scenarios.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallax_c.h"
#include "tests/integration/text_util.h"
#include "tests/integration/worker_flags.h"

namespace pxt {
inline int g_rank = -1;

[[noreturn]] inline void die(const std::string& what) {
  fprintf(stdout, "FAIL rank %d: %s\n", g_rank, what.c_str());
  fflush(stdout);
  exit(1);
}

inline void check(px_status s, const char* what) {
  if (s != PX_OK) die(std::string(what) + ": " + px_strerror(s) + ": " + px_last_error());
}

inline void expect_status(px_status got, px_status want, const char* what) {
  if (got != want)
    die(std::string(what) + ": expected " + px_strerror(want) + ", got " + px_strerror(got) + " (" +
        px_last_error() + ")");
}

inline void expect_contains(const std::string& text, const std::string& part) {
  if (!contains(text, part)) die("message '" + text + "' does not contain '" + part + "'");
}

// The ABI minor this worker connects as: PX_TEST_OLD_ABI_SOCKET names a daemon whose worker
// is an ABI 1.14 client (one built before PX_ERR_MEMBERSHIP, which calls the
// px_connect_options_init function, not the header's macro).
inline uint32_t test_abi_minor() {
  const char* old = getenv("PX_TEST_OLD_ABI_SOCKET");
  const char* socket = getenv("PARALLAX_SOCKET");
  return old && socket && std::string(old) == socket ? 14 : PX_ABI_VERSION_MINOR;
}

// The function callers built before 1.15 call (the header's macro of that name replaces it).
extern "C" void(px_connect_options_init)(px_connect_options* options);

inline px_client* connect_default() {
  px_client* client = nullptr;
  px_connect_options o;
  if (test_abi_minor() < PX_ABI_VERSION_MINOR)
    (px_connect_options_init)(&o);
  else
    px_connect_options_init(&o);
  o.timeout_ms = 20000;
  if (const char* a = getenv("PX_TEST_ARENA_BYTES")) o.arena_bytes = strtoull(a, nullptr, 10);
  check(px_connect(&o, &client), "px_connect");
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(client, &w), "px_world");
  g_rank = w.rank;
  return client;
}

inline px_world_info world_of(px_client* c) {
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  return w;
}

inline int world_size(px_client* c) {
  return world_of(c).world_size;
}

// px_last_error() of the px_wait in the last wait_free or check_wait: px_request_free,
// a successful call, clears the thread's own message.
inline std::string g_wait_message;

// Waits up to timeout_ms for r and frees it; returns the wait's status.
inline px_status wait_free(px_request* r, int timeout_ms = 30000) {
  px_status s = px_wait(r, timeout_ms);
  g_wait_message = px_last_error();
  px_request_free(r);
  return s;
}

// A wait that must succeed, then px_request_free (that must too): fails the worker with
// the wait's message otherwise.
inline void check_wait(px_request* r, const std::string& what, int timeout_ms = 30000) {
  px_status s = px_wait(r, timeout_ms);
  g_wait_message = px_last_error();
  if (s != PX_OK) die(what + ": " + px_strerror(s) + ": " + g_wait_message);
  check(px_request_free(r), ("px_request_free " + what).c_str());
}

// The message of the last failure: of a px_wait inside wait_free, or of a direct call.
inline std::string last_message() {
  std::string direct = px_last_error();
  return direct.empty() ? g_wait_message : direct;
}

// One operation that must succeed, submitted, waited for (up to timeout_ms) and freed.
inline void allreduce_ok(px_var* v, const void* in, void* out, const std::string& what,
                         int timeout_ms = 30000) {
  px_request* r = nullptr;
  check(px_allreduce(v, in, out, &r), ("px_allreduce " + what).c_str());
  check_wait(r, what, timeout_ms);
}
// A rows operation (px_pull_rows, px_push_rows, px_read_rows, px_load_rows) that must
// succeed: submitted, waited for and freed.
template <typename Rows>
inline void rows_ok(px_status (*op)(px_var*, const int64_t*, uint64_t, Rows, px_request**),
                    const char* name, px_var* v, const int64_t* idx, size_t n, Rows rows,
                    const std::string& what) {
  px_request* r = nullptr;
  check(op(v, idx, n, rows, &r), (name + (" " + what)).c_str());
  check_wait(r, what);
}
inline void pull_rows_ok(px_var* v, const int64_t* idx, size_t n, void* rows,
                         const std::string& what) {
  rows_ok(px_pull_rows, "px_pull_rows", v, idx, n, rows, what);
}
inline void push_rows_ok(px_var* v, const int64_t* idx, size_t n, const void* grads,
                         const std::string& what) {
  rows_ok(px_push_rows, "px_push_rows", v, idx, n, grads, what);
}
inline void read_rows_ok(px_var* v, const int64_t* idx, size_t n, void* rows,
                         const std::string& what) {
  rows_ok(px_read_rows, "px_read_rows", v, idx, n, rows, what);
}
inline void load_rows_ok(px_var* v, const int64_t* idx, size_t n, const void* rows,
                         const std::string& what) {
  rows_ok(px_load_rows, "px_load_rows", v, idx, n, rows, what);
}

// Table options of the training scenarios (wire, prefetch): uniform initial values in
// [-bound, bound) from seed, SGD at lr, and the --partitions and
// --route hybrid|ps|alltoall-rows|alltoall-columns flags.
inline px_sparse_options training_options(const Flags& f, uint64_t seed, double bound, double lr) {
  px_sparse_options o;
  px_sparse_options_init(&o);
  o.initializer = PX_INIT_UNIFORM;
  o.init_seed = seed;
  o.init_low = -bound;
  o.init_high = bound;
  o.learning_rate = lr;
  o.partitions = uint32_t(f.u64("partitions", 0));
  if (f.has("route")) {
    static const int32_t kRoutes[] = {PX_ROUTE_HYBRID, PX_ROUTE_PS, PX_ROUTE_ALLTOALL,
                                      PX_ROUTE_ALLTOALL};
    o.route = kRoutes[f.choice("route")];
    o.alltoall_split = f.choice("route") == 3 ? PX_SPLIT_COLUMNS : PX_SPLIT_ROWS;
  }
  return o;
}

// The sparse-variable scenarios (sparse_scenarios.cc): their flags, and running one
// (returns the exit code).
const std::vector<ScenarioSpec>& sparse_scenario_specs();
int run_sparse_scenario(px_client* c, const std::string& scenario, const Flags& flags);
// Sparse rows and gradients in a 16-bit wire dtype (wire_scenarios.cc).
const std::vector<ScenarioSpec>& wire_scenario_specs();
int run_wire_scenario(px_client* c, const std::string& scenario, const Flags& flags);
// Pull steps issued ahead of the previous push step (prefetch_scenarios.cc).
const std::vector<ScenarioSpec>& prefetch_scenario_specs();
// PX_BOUNDED tables through the hot-row cache (cache_scenarios.cc).
const std::vector<ScenarioSpec>& cache_scenario_specs();
int run_cache_scenario(px_client* c, const std::string& scenario, const Flags& flags);
int run_prefetch_scenario(px_client* c, const std::string& scenario, const Flags& flags);
// Table groups: several tables in one step (group_scenarios.cc).
const std::vector<ScenarioSpec>& group_scenario_specs();
int run_group_scenario(px_client* c, const std::string& scenario, const Flags& flags);
// ABI 1.3 scenarios (abi_scenarios.cc): after connecting, and before (connect itself).
int run_abi_scenario(px_client* c, const std::string& scenario);
int run_connect_scenario();
// px_broadcast, px_allgather, px_allgatherv against a reference (collective_scenarios.cc).
int run_collectives_scenario(px_client* c);
// px_reduce_scatter, px_alltoall, px_alltoallv against a reference (exchange_scenarios.cc).
int run_exchanges_scenario(px_client* c);
// priority_scenario.cc: a large priority-0 allreduce with a small one at --priority behind it.
int run_priority_scenario(px_client* c, const Flags& flags);
// One short sparse + dense job, as a shared cluster runs by the hundred (job_end_scenarios.cc).
int run_job_churn(px_client* c, const Flags& flags);
// The last worker leaves; the others' next step fails at once (job_end_scenarios.cc).
int run_leave_early(px_client* c);
// The last worker leaves between a pull and its push; the others' next pull waits at the
// owners until the job ends (job_end_scenarios.cc).
int run_leave_mid_step(px_client* c);
// The per-job limits of the daemon, met by a job's workers (limits_scenarios.cc).
int run_limits_variables(px_client* c);
int run_limits_requests(px_client* c, const std::string& dir);
int run_limits_arena();  // connects by itself: the connection is what is refused

}  // namespace pxt
