#include "daemon/front/service.h"

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <set>

#include "daemon/common/log.h"
#include "daemon/dense/admission.h"
#include "daemon/front/server.h"
#include "daemon/front/session.h"
#include "daemon/sparse/sparse_router.h"

namespace px {
namespace {

constexpr uint64_t kPollMs = 20;
// After the jobs failed, before the sockets close: the workers read their completions and,
// on a cluster, the other nodes hear of the jobs' end from this node (not as a lost node).
constexpr uint64_t kExitDelayMs = 200;

}  // namespace

struct Service::Checkpoints {
  std::string dir;
  int left = 0;
  bool done = false;
  std::vector<std::string> saved, failed;
};

Service::Service(Server& server) : server_(server), notifier_([this] { return status_line(); }) {}

void Service::start() {
  uv_signal_init(server_.loop(), &sighup_);
  sighup_.data = this;
  uv_signal_start(
      &sighup_, [](uv_signal_t* handle, int) { static_cast<Service*>(handle->data)->on_sighup(); },
      SIGHUP);
  uv_timer_init(server_.loop(), &poll_);
  poll_.data = this;
  started_ = true;
  notifier_.start(server_.loop());
}

void Service::stop() {
  if (!started_) return;
  started_ = false;
  notifier_.stop();
  uv_close(reinterpret_cast<uv_handle_t*>(&sighup_), nullptr);
  uv_timer_stop(&poll_);
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), nullptr);
  if (checkpoint_deadline_) checkpoint_deadline_->cancel();
}

void Service::on_sighup() {
  std::string error;
  if (log_file_path().empty()) {
    PX_LOG_INFO("SIGHUP: logging to stderr, no log file to reopen");
  } else if (reopen_log_file(&error)) {
    PX_LOG_INFO("SIGHUP: reopened the log file %s", log_file_path().c_str());
  } else {
    PX_LOG_ERROR("SIGHUP: %s; logging goes on to the file opened before", error.c_str());
  }
}

std::string Service::node() const {
  return server_.node_label(server_.config_.node_index);
}

std::string Service::refusal() const {
  return "parallaxd on " + node() + " is draining (SIGTERM) and takes no new workers or jobs";
}

bool Service::admits(Job& job, const SubmitEntry& entry, std::string* why) const {
  Variable* var = job.find(entry.var_id);
  // Another local worker submitted this step before the drain: its match must complete.
  if (phase_ == Phase::kSteps && var && var->pending.count({entry.opcode, entry.step}) != 0)
    return true;
  *why = "parallaxd on " + node() + " is draining (SIGTERM) and starts no new operations";
  if (var) *why += step_suffix(*var, entry.opcode, entry.step);
  return false;
}

uint64_t Service::operations_in_flight() const {
  uint64_t n = 0;
  for (auto& [id, session] : server_.sessions_) n += session->outstanding();
  return n;
}

std::string Service::status_line() const {
  switch (phase_) {
    case Phase::kRunning: {
      size_t workers = 0;
      for (auto& [name, job] : server_.jobs_) workers += static_cast<size_t>(job->connected());
      std::string line =
          std::to_string(server_.jobs_.size()) + " jobs, " + std::to_string(workers) + " workers";
      if (server_.cluster_) {
        line += "; " + node() + " of " + std::to_string(cluster_indices(server_.config_)) +
                " in cluster '" + server_.config_.cluster + "', ";
        line += !server_.cluster_broken_.empty() ? "broken: " + server_.cluster_broken_
                : server_.cluster_->ready()      ? "formed"
                                                 : "waiting for the other nodes";
      }
      return line;
    }
    case Phase::kSteps:
      return "draining: " + std::to_string(operations_in_flight()) +
             " operations in flight, then the sparse checkpoint";
    case Phase::kCheckpoint:
      return "draining: checkpointing " + std::to_string(checkpoints_ ? checkpoints_->left : 0) +
             " sparse variables into " + server_.config_.drain_checkpoint_dir;
    case Phase::kDone:
      return "drained; exiting";
  }
  return "";
}

void Service::on_sigterm() {
  if (phase_ != Phase::kRunning) {
    PX_LOG_WARN("second SIGTERM: exiting now, without finishing the drain");
    phase_ = Phase::kDone;  // a checkpoint finishing meanwhile changes nothing now
    if (checkpoints_) checkpoints_->done = true;
    server_.exit_code_ = 1;
    server_.shutdown();
    return;
  }
  phase_ = Phase::kSteps;
  uint64_t in_flight = operations_in_flight();
  PX_LOG_INFO(
      "SIGTERM: draining: no new workers, jobs or steps; %llu operations in flight get %lld ms "
      "to finish, then sparse variables are checkpointed (a second SIGTERM exits at once)",
      static_cast<unsigned long long>(in_flight),
      static_cast<long long>(server_.config_.drain_timeout_ms));
  notifier_.stopping();
  notifier_.status(status_line());
  // Workers still connecting, and jobs waiting for their workers, will not start.
  auto jobs = server_.jobs_;  // a refused worker leaves its job, which may end it
  for (auto& [name, job] : jobs) {
    // Kept until the checkpoint: workers told of the drain may leave, which ends the job.
    if (job->ready() && job->broken().empty()) drained_jobs_.push_back(job);
    if (job->ready()) continue;
    auto members = job->members();
    // join_job puts only sessions in a job's members: the cast is safe.
    for (auto& member : members)
      if (member) std::static_pointer_cast<Session>(member)->refuse(PX_ERR_CONNECT, refusal());
  }
  steps_deadline_ms_ =
      uv_now(server_.loop()) + static_cast<uint64_t>(server_.config_.drain_timeout_ms);
  uv_timer_start(&poll_, on_poll, 0, kPollMs);
}

void Service::on_poll(uv_timer_t* timer) {
  auto* self = static_cast<Service*>(timer->data);
  if (self->phase_ != Phase::kSteps) return;
  uint64_t in_flight = self->operations_in_flight();
  if (in_flight > 0 && uv_now(timer->loop) < self->steps_deadline_ms_) return;
  uv_timer_stop(timer);
  if (in_flight > 0) self->cut_operations();
  self->start_checkpoint();
}

// The drain deadline passed with operations still under way (most likely waiting for a
// local worker that stopped submitting, or for another node): they fail now, on this node.
void Service::cut_operations() {
  std::string why = "parallaxd on " + node() +
                    " is draining (SIGTERM) and this operation did not finish within "
                    "service.drain_timeout_ms (" +
                    std::to_string(server_.config_.drain_timeout_ms) + " ms)";
  PX_LOG_WARN("drain: %llu operations still in flight after %lld ms: failing them",
              static_cast<unsigned long long>(operations_in_flight()),
              static_cast<long long>(server_.config_.drain_timeout_ms));
  for (auto& [name, job] : server_.jobs_)
    if (job->ready() && job->broken().empty())
      server_.scheduler_.fail_job(*job, PX_ERR_PEER_LOST, why);
}

void Service::start_checkpoint() {
  phase_ = Phase::kCheckpoint;
  auto state = std::make_shared<Checkpoints>();
  checkpoints_ = state;
  state->dir = server_.config_.drain_checkpoint_dir;
  // The jobs that ran when the drain began: their workers may have left since (a worker
  // leaving marks its job broken), but every push step sent is in the shards.
  std::vector<std::pair<std::shared_ptr<Job>, Variable*>> variables;
  for (auto& job : drained_jobs_) {
    for (auto& var : job->variables()) {
      if (!var->sparse) continue;
      if (var->poison_status != PX_OK) {  // registered differently: nothing agreed to save
        PX_LOG_WARN_AT(job_fields(job->name(), var->name),
                       "drain: sparse variable '%s' of job '%s' is not saved: %s",
                       var->name.c_str(), job->name().c_str(), var->poison_message.c_str());
        continue;
      }
      variables.emplace_back(job, var.get());
    }
  }
  if (variables.empty()) return checkpoint_finished(true, "no sparse variables to save");
  if (state->dir.empty()) {
    PX_LOG_WARN(
        "drain: %zu sparse variables are not saved: neither service.checkpoint_dir nor restore "
        "is set",
        variables.size());
    return checkpoint_finished(true, "sparse variables not saved (no checkpoint directory)");
  }
  std::error_code ec;
  std::filesystem::create_directories(state->dir, ec);
  if (ec) {
    PX_LOG_ERROR("drain: cannot create the checkpoint directory %s: %s", state->dir.c_str(),
                 ec.message().c_str());
    return checkpoint_finished(false, "sparse variables NOT saved: " + ec.message());
  }
  state->left = static_cast<int>(variables.size());
  PX_LOG_INFO("drain: checkpointing %d sparse variables into %s", state->left, state->dir.c_str());
  notifier_.status(status_line());
  checkpoint_deadline_ = LoopTimer::start(
      server_.loop(), static_cast<uint64_t>(server_.config_.drain_checkpoint_timeout_ms),
      [this, state] {
        if (state->done) return;
        state->done = true;
        PX_LOG_ERROR(
            "drain: %d sparse variables were not saved within service.checkpoint_timeout_ms "
            "(%lld ms)",
            state->left, static_cast<long long>(server_.config_.drain_checkpoint_timeout_ms));
        checkpoint_finished(false, std::to_string(state->left) +
                                       " sparse variables NOT saved (checkpoint deadline)");
      });
  for (auto& [job, var] : variables) {
    std::string label = "'" + var->name + "' of job '" + job->name() + "'";
    // Every push this node sent: the owners apply them (and, on a cluster, every node's
    // pushes of those steps) before they write, so the files are one consistent cut.
    uint64_t pushes = var->sparse->push_steps;
    server_.scheduler_.sparse().checkpoint(
        job, *var, pushes, state->dir,
        [this, state, label, pushes, fields = job_fields(job->name(), var->name)](
            px_status status, const std::string& error) {
          if (state->done) return;
          if (status == PX_OK) {
            state->saved.push_back(label + " after " + std::to_string(pushes) + " push steps");
          } else {
            PX_LOG_ERROR_AT(fields, "drain: sparse variable %s not saved: %s", label.c_str(),
                            error.c_str());
            state->failed.push_back(label);
          }
          if (--state->left > 0) return;
          state->done = true;
          if (checkpoint_deadline_) checkpoint_deadline_->cancel();
          bool saved = state->failed.empty();
          std::string summary =
              saved ? "its sparse variables are saved in " + state->dir
                    : std::to_string(state->failed.size()) + " sparse variables NOT saved";
          checkpoint_finished(saved, summary);
        });
  }
}

void Service::checkpoint_finished(bool saved, const std::string& summary) {
  if (checkpoints_) {
    for (const std::string& s : checkpoints_->saved)
      PX_LOG_INFO("drain: saved sparse variable %s", s.c_str());
  }
  finish(saved, summary);
}

void Service::finish(bool saved, const std::string& summary) {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  notifier_.status(status_line());
  std::string why = "parallaxd on " + node() + " drained (SIGTERM) and exits" +
                    (summary.empty() ? "" : "; " + summary);
  PX_LOG_INFO("%s", why.c_str());
  // Every job ends here and, through the coordinator, on the other nodes: also those whose
  // local workers left during the drain (a clean leave fails only what needed the worker,
  // and the other nodes' workers would otherwise go on using this node's shards).
  std::vector<std::shared_ptr<Job>> jobs = drained_jobs_;
  for (auto& [name, job] : server_.jobs_)
    if (job->ready()) jobs.push_back(job);
  std::set<Job*> ended;
  for (auto& job : jobs) {
    if (!ended.insert(job.get()).second) continue;
    if (job->broken().empty()) server_.break_job(*job, why, Server::Break::kFailure);
    if (server_.cluster_ && job->barrier_id() != 0)
      server_.cluster_->report_job_broken(job->name(), job->barrier_id(), why, false);
  }
  bool ended_jobs = !ended.empty();
  server_.exit_code_ = saved ? 0 : 1;
  if (!ended_jobs) return server_.shutdown();
  LoopTimer::start(server_.loop(), kExitDelayMs, [this] { server_.shutdown(); });
}

}  // namespace px
