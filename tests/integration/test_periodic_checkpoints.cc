// Periodic checkpoints (service.checkpoint_interval_s): generations written while a job
// trains, the newest checkpoint_keep kept, and a daemon killed with SIGKILL that restarts
// with the same settings restores the newest complete generation bitwise and trains on.
// Real parallaxd and px_test_worker processes (sparse-train, sparse_scenarios.cc).
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "sharding/checkpoint.h"
#include "sharding/checkpoint_generations.h"
#include "tests/integration/harness.h"

using namespace pxt;

namespace {

constexpr uint64_t kRows = 1000, kDim = 8;  // sparse-train's table

std::vector<std::string> train(uint64_t steps) {
  return {"sparse-train",        "--optimizer",  "adam", "--aggregation", "mean", "--steps",
          std::to_string(steps), "--partitions", "4",    "--route",       "ps"};
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The table a generation's shard files hold, hashed as sparse-train hashes what it reads.
std::string shard_files_hash(const std::string& folder, const px::ManifestData& m) {
  std::vector<float> table(kRows * kDim, 0.0f);
  uint64_t rows = 0;
  for (const std::string& file : m.shard_files) {
    px::ShardFileData data;
    std::string error;
    REQUIRE_MESSAGE(px::read_shard_file(folder + "/" + file, &data, &error), error);
    REQUIRE(data.dim == kDim);
    for (size_t i = 0; i < data.rows.size(); ++i)
      std::memcpy(&table[static_cast<size_t>(data.rows[i]) * kDim], &data.values[i * kDim],
                  kDim * sizeof(float));
    rows += data.rows.size();
  }
  CHECK(rows == kRows);
  uint64_t hash = 1469598103934665603ull;
  for (float v : table) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  char text[32];
  snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace

TEST_CASE(
    "checkpoints: periodic generations keep the newest and a SIGKILLed daemon restarts from it") {
  ScratchDir scratch("periodic-ckpt");
  const std::string& dir = scratch.path();
  std::vector<std::string> settings = {"--checkpoint-dir",  dir, "--checkpoint-interval-s", "1",
                                       "--checkpoint-keep", "2"};
  {
    DaemonProcess daemon("pck1", settings);
    // 40 steps with 100 ms pauses: about 4 s of training, a generation every second.
    auto results =
        run_workers(daemon, "pck", 2, train(40), 120000, {{"PX_TEST_STEP_SLEEP_MS", "100"}});
    CHECK(all_ok(results));
    std::string log = daemon.log();
    CHECK_MESSAGE(count(log, "periodic checkpoint of job 'pck': generation") >= 3, log);
    CHECK_MESSAGE(contains(log, "(1 older removed)"), log);
    CHECK(daemon.kill_and_reap(SIGKILL) == 128 + SIGKILL);
  }
  // The newest two complete generations stay; a partial one only if newer (being written
  // when the job ended).
  uint64_t newest = px::newest_generation(dir, "pck");
  REQUIRE(newest >= 3);
  int complete = 0;
  for (const auto& e : std::filesystem::directory_iterator(px::generations_dir(dir, "pck"))) {
    std::string name = e.path().filename().string();
    if (contains(name, ".partial"))
      CHECK(std::stoull(name) > newest);
    else
      ++complete;
  }
  CHECK(complete == 2);
  std::string folder = px::generation_dir(dir, "pck", newest);
  px::ManifestData manifest;
  std::string error;
  REQUIRE_MESSAGE(
      px::read_manifest(px::checkpoint_stem(folder, "pck", "emb") + ".manifest", &manifest, &error),
      error);
  uint64_t saved = manifest.optimizer_steps;
  CHECK(saved > 0);
  CHECK(saved <= 40);
  std::string expected = shard_files_hash(folder, manifest);

  // Restarted with the same settings (restore defaults to the checkpoint directory): the
  // table is the generation's, bitwise, and 5 more steps match the uninterrupted reference.
  DaemonProcess daemon("pck2", settings);
  auto results = run_workers(daemon, "pck", 2, train(saved + 5), 120000,
                             {{"PX_TEST_START_STEP", std::to_string(saved)}});
  CHECK(all_ok(results));
  CHECK(field(results[0].output + results[1].output, "start_hash") == expected);
  CHECK_MESSAGE(contains(daemon.log(), "restored from " + folder), daemon.log());
}

TEST_CASE(
    "checkpoints: a node killed mid-training on 3 nodes restarts and training resumes from the "
    "newest generation") {
  // Periodic generations in a directory every node shares (one machine); node 1 is killed
  // with SIGKILL once two generations exist. The other nodes' workers fail naming it; node
  // 1 is started again, the cluster re-forms, and a new run of the job reads the step its
  // table was restored to (px_var_stats.restored_steps), which equals the newest
  // generation's files bitwise, and trains to the end: every pull and the final table match
  // the uninterrupted reference.
  ScratchDir scratch("cluster-ckpt");
  const std::string& dir = scratch.path();
  // The kill is seen at once (the connection closes); the silence bound only has to outlast
  // the restarted node's restore on its loop, which under ASan beside a parallel test took
  // over 1.5 s.
  ClusterProcesses cluster("pckc", 3,
                           {"--checkpoint-dir", dir, "--checkpoint-interval-s", "1",
                            "--checkpoint-keep", "2", "--peer-silence-ms", "5000"});
  std::vector<WorkerResult> interrupted;
  std::thread workers([&] {
    interrupted = run_cluster_workers(cluster, "pckc", 1, train(60), 120000,
                                      {{"PX_TEST_STEP_SLEEP_MS", "100"}});
  });
  for (int waited = 0; waited < 30000 && px::newest_generation(dir, "pckc") < 2; waited += 50)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(px::newest_generation(dir, "pckc") >= 2);
  CHECK(cluster.node(1).kill_and_reap(SIGKILL) == 128 + SIGKILL);
  workers.join();
  std::string named = "node 1 (" + cluster.endpoints()[1] + ")";
  for (int node : {0, 2}) {
    const WorkerResult& r = interrupted[static_cast<size_t>(node)];
    CHECK(r.exit_code != 0);
    CHECK_MESSAGE(contains(r.output, named), r.output);
  }

  cluster.restart(1);
  for (int node : {0, 2})
    for (int waited = 0; waited < 30000 && !contains(cluster.node(node).log(), "re-formed under");
         waited += 50)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  uint64_t newest = px::newest_generation(dir, "pckc");
  std::string folder = px::generation_dir(dir, "pckc", newest);
  px::ManifestData manifest;
  std::string error;
  REQUIRE_MESSAGE(px::read_manifest(px::checkpoint_stem(folder, "pckc", "emb") + ".manifest",
                                    &manifest, &error),
                  error);
  CHECK(manifest.nodes == 3);
  std::string expected = shard_files_hash(folder, manifest);
  auto results =
      run_cluster_workers(cluster, "pckc", 1, train(60), 120000, {{"PX_TEST_RESUME", "1"}});
  CHECK(all_ok(results));
  std::string steps = std::to_string(manifest.optimizer_steps);
  for (auto& r : results) CHECK_MESSAGE(contains(r.output, "resumed at step " + steps), r.output);
  CHECK(field(results[0].output, "start_hash") == expected);
  CHECK(same_field(results, "table_hash"));
}
