// What px_connect takes from the environment for the fields its caller leaves unset: the
// PARALLAX_* variables, else what the launcher that started this process set (torchrun,
// Open MPI's mpirun, Slurm's srun). One set of rules in libparallax, so that C, Python,
// Rust and Julia workers started by one launcher agree (docs/launchers.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace px {

struct LaunchEnv {
  std::string launcher;     // "torchrun", "openmpi", "slurm", or "" (none found)
  std::string socket_path;  // "": not set
  std::string job;          // "": not set
  int32_t local_rank = -1;  // -1: not set
  int32_t local_size = 0;   // 0: not set
  // The launcher's global rank, to compare with the daemons' (-1: none), and its variable.
  int32_t rank = -1;
  std::string rank_variable;
};

// Looks a variable up; null when it is not set. Tests pass a map; px_connect, getenv.
using EnvLookup = std::function<const char*(const char* name)>;

// Reads the rules; false with *error naming the variable and what is wrong with its value
// (not a number, a torchrun run id of "none" without MASTER_ADDR/MASTER_PORT, ...).
bool read_launch_env(const EnvLookup& env, LaunchEnv* out, std::string* error);

// The count of node `node` (0-based) in a Slurm tasks-per-node list ("2(x3),1" is 2, 2, 2,
// 1); false if the list is malformed or shorter.
bool slurm_tasks_on_node(const std::string& list, int64_t node, int32_t* out);

}  // namespace px
