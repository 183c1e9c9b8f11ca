#include "daemon/front/periodic_checkpoints.h"

#include <vector>

#include "daemon/common/log.h"
#include "daemon/front/server.h"
#include "sharding/checkpoint_generations.h"

namespace px {

void PeriodicCheckpoints::start() {
  const DaemonConfig& c = server_.config();
  if (c.checkpoint_interval_s == 0 || c.drain_checkpoint_dir.empty()) return;
  running_ = true;
  PX_LOG_INFO("periodic checkpoints every %llu s into %s, keeping the newest %d per job",
              static_cast<unsigned long long>(c.checkpoint_interval_s),
              c.drain_checkpoint_dir.c_str(), c.checkpoint_keep);
  arm();
}

void PeriodicCheckpoints::stop() {
  running_ = false;
  if (timer_) timer_->cancel();
  timer_.reset();
}

void PeriodicCheckpoints::arm() {
  timer_ = LoopTimer::start(server_.loop(), server_.config().checkpoint_interval_s * 1000,
                            [this] { tick(); });
}

void PeriodicCheckpoints::tick() {
  if (!running_) return;
  arm();
  if (server_.service().draining()) return;          // the drain writes its own checkpoint
  for (auto it = jobs_.begin(); it != jobs_.end();)  // runs that ended
    it = (it->second.run.expired() && !it->second.writing) ? jobs_.erase(it) : std::next(it);
  for (const auto& [name, job] : server_.jobs())
    if (job->ready() && job->broken().empty() && job->departed().empty() && starts_here(*job))
      checkpoint_job(job);
}

// One node writes the manifests: the job's lowest node with workers.
bool PeriodicCheckpoints::starts_here(const Job& job) const {
  const JobWorld& world = job.world();
  for (size_t n = 0; n < world.node_sizes.size(); ++n)
    if (world.node_sizes[n] > 0) return static_cast<int>(n) == world.node_index;
  return true;  // a single node
}

void PeriodicCheckpoints::checkpoint_job(const std::shared_ptr<Job>& job) {
  JobState& state = jobs_[job->name()];
  if (state.run.lock() != job) state = JobState{job, 0, 0, false};
  if (state.writing) {
    PX_LOG_WARN_AT(job_fields(job->name()),
                   "periodic checkpoint of job '%s' skipped: the previous one is still writing",
                   job->name().c_str());
    return;
  }
  std::vector<Variable*> variables;
  uint64_t pushes = 0;
  for (auto& var : job->variables()) {
    if (!var->sparse || var->poison_status != PX_OK) continue;
    variables.push_back(var.get());
    pushes += var->sparse->push_steps;
  }
  // Nothing pushed since the last generation (or since the run began: a restored table is
  // in its checkpoint already), or nothing to save: no new generation.
  if (variables.empty() || pushes == state.pushes_saved) return;

  const std::string& dir = server_.config().drain_checkpoint_dir;
  uint64_t generation = next_generation(dir, job->name());
  std::string error;
  if (!begin_generation(dir, job->name(), generation, &error)) {
    PX_LOG_ERROR_AT(job_fields(job->name()), "periodic checkpoint of job '%s': %s",
                    job->name().c_str(), error.c_str());
    return;
  }
  state.writing = true;
  struct Progress {
    int left = 0;
    bool done = false;
    std::vector<std::string> failed;
  };
  auto progress = std::make_shared<Progress>();
  progress->left = static_cast<int>(variables.size());
  std::string name = job->name();
  std::weak_ptr<Job> run = job;
  // Called once: every variable saved, one failed, or the deadline.
  auto finish = [this, progress, name, run, dir, generation, pushes](const std::string& failure) {
    progress->done = true;
    auto it = jobs_.find(name);
    bool ours = it != jobs_.end() && it->second.run.lock() == run.lock();
    if (ours) it->second.writing = false;
    std::string error = failure;
    if (error.empty()) commit_generation(dir, name, generation, &error);
    if (!error.empty()) {
      PX_LOG_ERROR_AT(job_fields(name),
                      "periodic checkpoint generation %llu of job '%s' is not saved: %s",
                      static_cast<unsigned long long>(generation), name.c_str(), error.c_str());
      discard_generation(dir, name, generation);
      return;
    }
    if (ours) {
      it->second.generation = generation;
      it->second.pushes_saved = pushes;
    }
    int removed = prune_generations(dir, name, server_.config().checkpoint_keep);
    PX_LOG_INFO_AT(
        job_fields(name),
        "periodic checkpoint of job '%s': generation %llu saved in %s (%d older removed)",
        name.c_str(), static_cast<unsigned long long>(generation),
        generation_dir(dir, name, generation).c_str(), removed);
  };
  auto deadline = LoopTimer::start(
      server_.loop(), static_cast<uint64_t>(server_.config().drain_checkpoint_timeout_ms),
      [progress, finish, this] {
        if (progress->done) return;
        finish(std::to_string(progress->left) +
               " sparse variables were not written within service.checkpoint_timeout_ms (" +
               std::to_string(server_.config().drain_checkpoint_timeout_ms) + " ms)");
      });
  std::string folder = partial_generation_dir(dir, name, generation);
  for (Variable* var : variables) {
    std::string variable = var->name;
    server_.scheduler().sparse().checkpoint(
        job, *var, var->sparse->push_steps, folder,
        [progress, finish, deadline, variable](px_status status, const std::string& error) {
          if (progress->done) return;
          if (status != PX_OK) progress->failed.push_back("'" + variable + "': " + error);
          if (--progress->left > 0) return;
          deadline->cancel();
          std::string failure;
          for (const std::string& f : progress->failed)
            failure += (failure.empty() ? "" : "; ") + f;
          finish(failure);
        });
  }
}

}  // namespace px
