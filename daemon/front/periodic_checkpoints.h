// Periodic checkpoints of sparse variables (service.checkpoint_interval_s): every interval,
// each started job that pushed since its last one gets a new generation of checkpoints
// (sharding/checkpoint_generations.h) in service.checkpoint_dir, of all its sparse
// variables, each cut after the push steps this node has sent (as px_checkpoint's); the
// newest service.checkpoint_keep generations stay. On a cluster the job's lowest node with
// workers starts it: every node's owner writes its shard file into the same folder (a
// shared path, or one copied together for a restore elsewhere), that node the manifests.
// A daemon restarted with the same config restores each variable from the newest complete
// generation when it is registered again. Loop thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "daemon/common/job.h"
#include "daemon/common/loop_timer.h"

namespace px {

class Server;

class PeriodicCheckpoints {
 public:
  explicit PeriodicCheckpoints(Server& server) : server_(server) {}

  // From Server::run: arms the timer if an interval and a directory are configured.
  void start();
  // From Server::shutdown: no new generation starts (one under way is left partial).
  void stop();

  struct JobState {
    std::weak_ptr<Job> run;     // the run of the job these counts are about
    uint64_t pushes_saved = 0;  // push steps summed over its variables, last generation
    uint64_t generation = 0;    // the newest this daemon committed (0: none)
    bool writing = false;
  };

 private:
  void arm();
  void tick();
  bool starts_here(const Job& job) const;
  void checkpoint_job(const std::shared_ptr<Job>& job);

  Server& server_;
  bool running_ = false;
  std::shared_ptr<LoopTimer> timer_;
  std::map<std::string, JobState> jobs_;  // by job name
};

}  // namespace px
