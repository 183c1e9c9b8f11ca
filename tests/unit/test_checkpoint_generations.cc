// Periodic checkpoint generations (sharding/checkpoint_generations.h): numbering that
// continues across restarts, a generation visible only once committed, pruning to the
// newest K (and of partial folders left behind), and which manifest a restore takes.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "sharding/checkpoint.h"
#include "sharding/checkpoint_generations.h"
#include "tests/unit/temp_dir.h"

using namespace px;
using px::test::TempDir;
using px::test::write_text;

namespace {

bool exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

// A generation holding one manifest for variable v (content irrelevant here).
void make_generation(const std::string& dir, const std::string& job, uint64_t n) {
  std::string error;
  REQUIRE(begin_generation(dir, job, n, &error));
  write_text(checkpoint_stem(partial_generation_dir(dir, job, n), job, "v") + ".manifest", "m");
  REQUIRE_MESSAGE(commit_generation(dir, job, n, &error), error);
}

}  // namespace

TEST_CASE("checkpoint generations: numbering, commit, prune") {
  TempDir tmp;
  const std::string dir = tmp.path();
  CHECK(next_generation(dir, "job/1") == 1);  // nothing there yet, not even the folder
  CHECK(newest_generation(dir, "job/1") == 0);
  CHECK(generations_dir(dir, "job/1") == dir + "/job_1");

  std::string error;
  REQUIRE(begin_generation(dir, "job/1", 1, &error));
  CHECK(exists(dir + "/job_1/0000000001.partial"));
  CHECK(newest_generation(dir, "job/1") == 0);  // not committed: not a checkpoint
  CHECK(next_generation(dir, "job/1") == 2);    // but its number is taken
  REQUIRE(commit_generation(dir, "job/1", 1, &error));
  CHECK(exists(dir + "/job_1/0000000001"));
  CHECK_FALSE(exists(dir + "/job_1/0000000001.partial"));
  CHECK(newest_generation(dir, "job/1") == 1);

  for (uint64_t n = 2; n <= 4; ++n) make_generation(dir, "job/1", n);
  REQUIRE(begin_generation(dir, "job/1", 5, &error));  // being written: stays
  // A partial one older than the newest complete: a daemon died writing it.
  std::filesystem::rename(dir + "/job_1/0000000002", dir + "/job_1/0000000002.partial");
  CHECK(prune_generations(dir, "job/1", 2) == 2);  // 1 (complete) and 2 (partial)
  CHECK_FALSE(exists(dir + "/job_1/0000000001"));
  CHECK_FALSE(exists(dir + "/job_1/0000000002.partial"));
  CHECK(exists(dir + "/job_1/0000000003"));
  CHECK(exists(dir + "/job_1/0000000004"));
  CHECK(exists(dir + "/job_1/0000000005.partial"));
  CHECK(next_generation(dir, "job/1") == 6);
  discard_generation(dir, "job/1", 5);
  CHECK_FALSE(exists(dir + "/job_1/0000000005.partial"));
  CHECK(next_generation(dir, "job/1") == 5);

  // A failed commit (the partial folder is gone) says which folder.
  CHECK_FALSE(commit_generation(dir, "job/1", 9, &error));
  CHECK(error.find("0000000009.partial") != std::string::npos);
  // Other names in the job's folder are not generations.
  write_text(dir + "/job_1/notes.txt", "x");
  std::filesystem::create_directories(dir + "/job_1/12a");
  CHECK(newest_generation(dir, "job/1") == 4);
}

TEST_CASE("checkpoint generations: a restore takes the newer of the flat and the newest") {
  TempDir tmp;
  const std::string dir = tmp.path();
  CHECK(restore_manifest(dir, "j", "v") == "");
  std::string flat = checkpoint_stem(dir, "j", "v") + ".manifest";
  write_text(flat, "m");
  CHECK(restore_manifest(dir, "j", "v") == flat);
  make_generation(dir, "j", 1);
  make_generation(dir, "j", 2);
  std::string newest = checkpoint_stem(generation_dir(dir, "j", 2), "j", "v") + ".manifest";
  // Make the flat manifest clearly older, then newer, than the generation's.
  std::filesystem::last_write_time(
      flat, std::filesystem::last_write_time(newest) - std::chrono::seconds(10));
  CHECK(restore_manifest(dir, "j", "v") == newest);
  std::filesystem::last_write_time(
      flat, std::filesystem::last_write_time(newest) + std::chrono::seconds(10));
  CHECK(restore_manifest(dir, "j", "v") == flat);
  // A variable the newest generation lacks: only the flat one counts.
  CHECK(restore_manifest(dir, "j", "w") == "");
}
