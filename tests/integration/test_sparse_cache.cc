// The hot-row cache (px_sparse_options.cache_rows): real parallaxd processes on loopback over
// tcp;ofi_rxm and one real worker per node that checks every pulled row against a simulation
// of the cache's rule and the bounded staleness it promises, then the checkpoint and the
// final table against every gradient applied exactly once (cache_scenarios.cc).
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/integration/text_util.h"

using namespace pxt;

TEST_CASE(
    "hot-row cache: across 3 nodes rows are served from the cache within its staleness, held "
    "gradients reach their owners exactly once, checkpoints and reads include them") {
  ClusterProcesses cluster("cache3", 3);
  for (std::string staleness : {"1", "2"}) {
    CAPTURE(staleness);
    ScratchDir dir("cache-ckpt-" + staleness);
    auto results = run_cluster_workers(
        cluster, "cache-" + staleness, 1,
        {"cache-train", "--steps", "8", "--cache-staleness", staleness, "--dir", dir.path()});
    REQUIRE(all_ok(results));
    uint64_t hits = 0, flushed = 0;
    for (const WorkerResult& r : results) {
      hits += std::strtoull(field(r.output, "hits").c_str(), nullptr, 10);
      flushed += std::strtoull(field(r.output, "flushed").c_str(), nullptr, 10);
    }
    CHECK(hits > 0);
    CHECK(flushed > 0);
  }
}
