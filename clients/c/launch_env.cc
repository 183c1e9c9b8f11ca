#include "clients/c/launch_env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

namespace px {
namespace {

// A non-negative integer, the whole of text.
bool parse_count(const std::string& text, int64_t* out) {
  if (text.empty() || text[0] == '-' || text[0] == '+' || text[0] == ' ') return false;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(text.c_str(), &end, 10);
  if (*end || errno || x > INT32_MAX) return false;
  *out = x;
  return true;
}

class Reader {
 public:
  Reader(const EnvLookup& env, std::string* error) : env_(env), error_(error) {}

  std::string text(const char* name) const {
    const char* v = env_(name);
    return v ? v : "";
  }
  bool set(const char* name) const { return !text(name).empty(); }

  // Sets *out from the variable when it is set (and not already set by an earlier rule);
  // false, naming the variable, if its value is not a non-negative integer.
  bool count(const char* name, int32_t* out, int32_t unset) {
    std::string v = text(name);
    if (v.empty() || *out != unset) return true;
    int64_t x;
    if (!parse_count(v, &x)) return fail(std::string(name) + "='" + v + "' is not a count");
    *out = static_cast<int32_t>(x);
    return true;
  }

  bool fail(const std::string& why) {
    *error_ = why;
    return false;
  }

 private:
  const EnvLookup& env_;
  std::string* error_;
};

// torchrun (and launchers that copy it: LOCAL_RANK, LOCAL_WORLD_SIZE, RANK). Its default
// rendezvous id is the string "none": the same for every job, so the job is named from the
// rendezvous address instead, unique among the jobs running at once.
bool read_torchrun(Reader& r, LaunchEnv* out) {
  if (!r.count("LOCAL_RANK", &out->local_rank, -1) ||
      !r.count("LOCAL_WORLD_SIZE", &out->local_size, 0) || !r.count("RANK", &out->rank, -1))
    return false;
  out->rank_variable = "RANK";
  if (!out->job.empty()) return true;
  std::string id = r.text("TORCHELASTIC_RUN_ID");
  if (id == "none") {
    std::string addr = r.text("MASTER_ADDR"), port = r.text("MASTER_PORT");
    if (addr.empty() || port.empty())
      return r.fail(
          "TORCHELASTIC_RUN_ID is 'none' (torchrun's default) and MASTER_ADDR/MASTER_PORT are "
          "not both set, so this job cannot be told from others on the daemon: give torchrun "
          "--rdzv-id, or set PARALLAX_JOB");
    id = "torchrun-" + addr + ":" + port;
  }
  if (id.empty()) return true;
  int32_t restarts = 0;
  if (!r.count("TORCHELASTIC_RESTART_COUNT", &restarts, 0)) return false;
  // A restarted group is a new job: the old one's workers may not all have left yet.
  out->job = restarts > 0 ? id + "-restart" + std::to_string(restarts) : id;
  return true;
}

bool read_openmpi(Reader& r, LaunchEnv* out) {
  if (!r.count("OMPI_COMM_WORLD_LOCAL_RANK", &out->local_rank, -1) ||
      !r.count("OMPI_COMM_WORLD_LOCAL_SIZE", &out->local_size, 0) ||
      !r.count("OMPI_COMM_WORLD_RANK", &out->rank, -1))
    return false;
  out->rank_variable = "OMPI_COMM_WORLD_RANK";
  std::string id = r.text("PMIX_NAMESPACE");
  if (id.empty()) id = r.text("OMPI_MCA_ess_base_jobid");
  if (out->job.empty() && !id.empty()) out->job = "mpirun-" + id;
  return true;
}

// srun's tasks. Slurm sets SLURM_NTASKS_PER_NODE only with --ntasks-per-node, but always
// the tasks-per-node list (the step's, else the allocation's) with this node's index in it.
// Two steps of one allocation share SLURM_JOB_ID, so the job name carries the step.
bool read_slurm(Reader& r, LaunchEnv* out) {
  if (!r.count("SLURM_LOCALID", &out->local_rank, -1) || !r.count("SLURM_PROCID", &out->rank, -1))
    return false;
  out->rank_variable = "SLURM_PROCID";
  if (out->local_size == 0) {
    const char* list_name =
        r.set("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    std::string list = r.text(list_name), node = r.text("SLURM_NODEID");
    int64_t node_index;
    if (!list.empty() && !node.empty()) {
      if (!parse_count(node, &node_index))
        return r.fail("SLURM_NODEID='" + node + "' is not a count");
      if (!slurm_tasks_on_node(list, node_index, &out->local_size))
        return r.fail(std::string(list_name) + "='" + list + "' has no count for node " + node +
                      " (SLURM_NODEID)");
    } else if (r.set("SLURM_NTASKS_PER_NODE")) {
      int32_t tasks = 0;
      std::string v = r.text("SLURM_NTASKS_PER_NODE");
      if (!slurm_tasks_on_node(v, 0, &tasks))
        return r.fail("SLURM_NTASKS_PER_NODE='" + v + "' is not a count");
      out->local_size = tasks;
    }
  }
  if (out->job.empty()) {
    std::string step = r.text("SLURM_STEP_ID");
    out->job = "slurm-" + r.text("SLURM_JOB_ID") + (step.empty() ? "" : "." + step);
  }
  return true;
}

}  // namespace

bool slurm_tasks_on_node(const std::string& list, int64_t node, int32_t* out) {
  // The whole list is read, so that a malformed one fails on every node alike.
  int64_t found = -1;
  size_t at = 0;
  for (;;) {
    size_t comma = list.find(',', at);
    std::string item = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    int64_t tasks = 0, repeat = 1;
    size_t paren = item.find("(x");
    if (paren == std::string::npos) {
      if (!parse_count(item, &tasks)) return false;
    } else if (item.back() != ')' || !parse_count(item.substr(0, paren), &tasks) ||
               !parse_count(item.substr(paren + 2, item.size() - paren - 3), &repeat)) {
      return false;
    }
    if (found < 0 && node >= 0 && node < repeat) found = tasks;
    node -= repeat;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (found < 0) return false;
  *out = static_cast<int32_t>(found);
  return true;
}

bool read_launch_env(const EnvLookup& env, LaunchEnv* out, std::string* error) {
  Reader r(env, error);
  *out = LaunchEnv{};
  out->socket_path = r.text("PARALLAX_SOCKET");
  out->job = r.text("PARALLAX_JOB");
  if (!r.count("PARALLAX_LOCAL_RANK", &out->local_rank, -1) ||
      !r.count("PARALLAX_LOCAL_SIZE", &out->local_size, 0))
    return false;
  // The launcher that started this process: the innermost first (torchrun or mpirun inside
  // a Slurm allocation sees the allocation's SLURM_* too).
  if (r.set("TORCHELASTIC_RUN_ID") || r.set("LOCAL_RANK")) {
    out->launcher = "torchrun";
    return read_torchrun(r, out);
  }
  if (r.set("OMPI_COMM_WORLD_RANK")) {
    out->launcher = "openmpi";
    return read_openmpi(r, out);
  }
  if (r.set("SLURM_JOB_ID")) {
    out->launcher = "slurm";
    return read_slurm(r, out);
  }
  return true;
}

}  // namespace px
