// Per-job limits of parallaxd (limits.* in the config): a real daemon with small limits and
// real workers that cross them (limits_scenarios.cc). Past a limit the worker or request is
// refused with an error naming it, and the job, the daemon and other jobs go on.
#include <doctest/doctest.h>

#include <string>

#include "tests/integration/harness.h"

using namespace pxt;

TEST_CASE("limits: variables and sparse table bytes per job, then the job goes on") {
  DaemonProcess daemon("lim-vars", {"--job-variables", "3", "--job-sparse-table-bytes", "40000"});
  auto results = run_workers(daemon, "limits-variables", 2, {"limits-variables"});
  CHECK(all_ok(results));
  for (auto& r : results) {
    CHECK(contains(r.output, "REFUSED register 'second'"));
    CHECK(contains(r.output, "REFUSED register 'd'"));
  }
  CHECK(contains(daemon.log(), "limits.job_variables = 3"));
  // The refusal's log line carries the job, variable and worker as fields (logfmt).
  CHECK(contains(daemon.log(), "| job=limits-variables variable=d rank="));
  // Limits are per job: another job gets its own three variables.
  CHECK(all_ok(run_workers(daemon, "other", 2, {"shuffle", "--vars", "3", "--steps", "2"})));
  CHECK(daemon.alive());
}

TEST_CASE("limits: requests in flight per job") {
  ScratchDir dir("lim-req");
  DaemonProcess daemon("lim-req", {"--job-requests-in-flight", "4"});
  auto results =
      run_workers(daemon, "limits-requests", 2, {"limits-requests", "--dir", dir.path()});
  CHECK(all_ok(results));
  CHECK(contains(results[0].output, "REFUSED fifth request"));
  // Below the limit, many steps in flight at once are fine.
  CHECK(all_ok(run_workers(daemon, "many", 2, {"shuffle", "--vars", "2", "--steps", "1"})));
  CHECK(daemon.alive());
}

TEST_CASE("limits: arena bytes per job") {
  DaemonProcess daemon("lim-arena", {"--job-arena-bytes", std::to_string(48ull << 20)});
  auto results = run_workers(daemon, "limits-arena", 2, {"limits-arena"}, 60000);
  REQUIRE(results.size() == 2);
  int refused = 0, waited = 0;
  for (auto& r : results) {
    CHECK(r.exit_code == 0);
    refused += contains(r.output, "REFUSED") ? 1 : 0;
    waited += contains(r.output, "WAITED") ? 1 : 0;
  }
  CHECK(refused == 1);
  CHECK(waited == 1);
  // The refused worker's arena was never counted and the waiting one's is given back: a job
  // whose arenas fit runs.
  std::map<std::string, std::string> env = {{"PX_TEST_ARENA_BYTES", std::to_string(16ull << 20)}};
  CHECK(all_ok(run_workers(daemon, "limits-arena", 2,
                           {"allreduce", "--dtype", "f32", "--op", "sum", "--count", "1000",
                            "--memory", "arena", "--steps", "2"},
                           60000, env)));
  CHECK(daemon.alive());
}
