// The launchers' variables px_connect reads (clients/c/launch_env.h), one environment at a
// time from a map: torchrun, Open MPI, Slurm, PARALLAX_* over each, and bad values.
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "clients/c/launch_env.h"
#include "parallax_c.h"

using namespace px;

namespace {

using Env = std::map<std::string, std::string>;

LaunchEnv read(const Env& env, std::string* error = nullptr) {
  std::string why;
  LaunchEnv out;
  bool ok = read_launch_env(
      [&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      &out, &why);
  if (error) *error = ok ? "" : why;
  if (!error) REQUIRE_MESSAGE(ok, why);
  return out;
}

}  // namespace

TEST_CASE("launch env: nothing set leaves every field unset") {
  LaunchEnv e = read({});
  CHECK(e.launcher.empty());
  CHECK(e.job.empty());
  CHECK(e.socket_path.empty());
  CHECK(e.local_rank == -1);
  CHECK(e.local_size == 0);
  CHECK(e.rank == -1);
}

TEST_CASE("launch env: torchrun, its run id, 'none' and restarts") {
  Env torchrun{{"LOCAL_RANK", "1"},
               {"LOCAL_WORLD_SIZE", "4"},
               {"RANK", "5"},
               {"TORCHELASTIC_RUN_ID", "exp7"},
               {"MASTER_ADDR", "10.0.0.2"},
               {"MASTER_PORT", "29500"},
               {"TORCHELASTIC_RESTART_COUNT", "0"}};
  LaunchEnv e = read(torchrun);
  CHECK(e.launcher == "torchrun");
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 4);
  CHECK(e.rank == 5);
  CHECK(e.rank_variable == "RANK");
  CHECK(e.job == "exp7");
  // torchrun's default id is "none" for every job: the rendezvous address names it.
  torchrun["TORCHELASTIC_RUN_ID"] = "none";
  CHECK(read(torchrun).job == "torchrun-10.0.0.2:29500");
  torchrun["TORCHELASTIC_RESTART_COUNT"] = "2";
  CHECK(read(torchrun).job == "torchrun-10.0.0.2:29500-restart2");
  // "none" without the address is refused, unless PARALLAX_JOB names the job.
  torchrun.erase("MASTER_PORT");
  std::string error;
  read(torchrun, &error);
  CHECK(error.find("TORCHELASTIC_RUN_ID is 'none'") != std::string::npos);
  CHECK(error.find("PARALLAX_JOB") != std::string::npos);
  torchrun["PARALLAX_JOB"] = "mine";
  CHECK(read(torchrun).job == "mine");
  // LOCAL_RANK alone (a launcher copying torchrun's variables) counts as torchrun.
  e = read({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}});
  CHECK(e.launcher == "torchrun");
  CHECK(e.job.empty());
  CHECK(e.local_size == 2);
}

TEST_CASE("launch env: Slurm's tasks per node, its step and its ranks") {
  Env slurm{{"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "3"}, {"SLURM_LOCALID", "0"},
            {"SLURM_PROCID", "6"},    {"SLURM_NODEID", "3"},  {"SLURM_TASKS_PER_NODE", "2(x3),1"}};
  LaunchEnv e = read(slurm);
  CHECK(e.launcher == "slurm");
  CHECK(e.job == "slurm-4242.3");  // two steps of one allocation are two jobs
  CHECK(e.local_rank == 0);
  CHECK(e.local_size == 1);  // node 3 of 2, 2, 2, 1
  CHECK(e.rank == 6);
  CHECK(e.rank_variable == "SLURM_PROCID");
  slurm["SLURM_NODEID"] = "2";
  CHECK(read(slurm).local_size == 2);
  // The step's own list wins over the allocation's.
  slurm["SLURM_STEP_TASKS_PER_NODE"] = "3,1(x2)";
  CHECK(read(slurm).local_size == 1);
  slurm["SLURM_NODEID"] = "0";
  CHECK(read(slurm).local_size == 3);
  // SLURM_NTASKS_PER_NODE only when there is no list; no step id, no suffix.
  e = read({{"SLURM_JOB_ID", "9"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  CHECK(e.local_size == 2);
  CHECK(e.job == "slurm-9");
  std::string error;
  slurm["SLURM_NODEID"] = "5";
  read(slurm, &error);
  CHECK(error == "SLURM_STEP_TASKS_PER_NODE='3,1(x2)' has no count for node 5 (SLURM_NODEID)");
}

TEST_CASE("launch env: Slurm's tasks-per-node lists") {
  int32_t n = -1;
  CHECK((slurm_tasks_on_node("4", 0, &n) && n == 4));
  CHECK_FALSE(slurm_tasks_on_node("4", 1, &n));
  CHECK_FALSE(slurm_tasks_on_node("4", -1, &n));
  CHECK((slurm_tasks_on_node("2(x3),1", 2, &n) && n == 2));
  CHECK((slurm_tasks_on_node("2(x3),1", 3, &n) && n == 1));
  CHECK((slurm_tasks_on_node("1,8(x2),3", 2, &n) && n == 8));
  for (const char* bad : {"", "x", "2(x", "2(3)", "2(x3", ",1", "1,,2", "-1", "2(x-1)"})
    CHECK_FALSE_MESSAGE(slurm_tasks_on_node(bad, 0, &n), std::string(bad));
}

TEST_CASE("launch env: Open MPI, inside a Slurm allocation too") {
  Env ompi{{"OMPI_COMM_WORLD_RANK", "3"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
           {"PMIX_NAMESPACE", "prterun-host-77@1"},
           {"SLURM_JOB_ID", "11"},
           {"SLURM_LOCALID", "0"}};
  LaunchEnv e = read(ompi);
  CHECK(e.launcher == "openmpi");
  CHECK(e.job == "mpirun-prterun-host-77@1");
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 2);
  CHECK(e.rank == 3);
}

TEST_CASE("launch env: PARALLAX_* over the launcher's, field by field, and bad counts") {
  Env env{{"PARALLAX_LOCAL_RANK", "0"},
          {"PARALLAX_SOCKET", "/tmp/p.sock"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"TORCHELASTIC_RUN_ID", "r1"}};
  LaunchEnv e = read(env);
  CHECK(e.local_rank == 0);
  CHECK(e.local_size == 2);
  CHECK(e.job == "r1");
  CHECK(e.socket_path == "/tmp/p.sock");
  std::string error;
  read({{"PARALLAX_LOCAL_SIZE", "two"}}, &error);
  CHECK(error == "PARALLAX_LOCAL_SIZE='two' is not a count");
  read({{"LOCAL_RANK", "-1"}}, &error);
  CHECK(error == "LOCAL_RANK='-1' is not a count");
  read({{"SLURM_JOB_ID", "1"}, {"SLURM_PROCID", "1x"}}, &error);
  CHECK(error == "SLURM_PROCID='1x' is not a count");
}

TEST_CASE(
    "launch env: px_launch_info_from_env refuses a NULL or short struct, reads the process's") {
  CHECK(px_launch_info_from_env(nullptr) == PX_ERR_INVALID);
  px_launch_info info{};
  info.struct_size = sizeof info - 1;  // an older, smaller struct than this function fills
  CHECK(px_launch_info_from_env(&info) == PX_ERR_INVALID);
  CHECK(std::string(px_last_error()).find("struct_size") != std::string::npos);
  const Env torchrun{{"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"RANK", "3"},
                     {"TORCHELASTIC_RUN_ID", "unit"}};
  for (const auto& [name, value] : torchrun) setenv(name.c_str(), value.c_str(), 1);
  info.struct_size = sizeof info;
  px_status status = px_launch_info_from_env(&info);
  for (const auto& [name, value] : torchrun) unsetenv(name.c_str());
  REQUIRE(status == PX_OK);
  CHECK(std::string(info.launcher) == "torchrun");
  CHECK(std::string(info.job_name) == "unit");
  CHECK((info.local_rank == 1 && info.local_size == 2 && info.rank == 3));
}
