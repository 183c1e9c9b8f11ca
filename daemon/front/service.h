// parallaxd as an operated service: systemd readiness, watchdog and status
// (systemd_notify.h), SIGHUP reopening the log file, and the SIGTERM drain:
//   1. new connections, new jobs and new steps are refused (PX_ERR_CONNECT, PX_ERR_PEER_LOST,
//      naming the node and that it drains); an entry that completes a step another local
//      worker already submitted is still taken, so no step is left half-matched;
//   2. operations under way get service.drain_timeout_ms to finish; past it they fail with
//      PX_ERR_PEER_LOST naming the node;
//   3. every sparse variable of every job is checkpointed into service.checkpoint_dir (the
//      restore directory by default), within service.checkpoint_timeout_ms;
//   4. every job fails on this node and on the others (the message names the node and says
//      it drained), and the daemon exits: 0 if every sparse variable was saved, else 1.
// A second SIGTERM exits at once (status 1). The Server calls in; this class reaches into
// the Server (a friend) for its sessions, jobs and scheduler. Loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/common/job.h"
#include "daemon/common/loop_timer.h"
#include "daemon/front/systemd_notify.h"
#include "transport/ipc/shm_layout.h"

namespace px {

class Server;

class Service {
 public:
  explicit Service(Server& server);

  // From Server::run, once the socket listens: READY=1, the watchdog, SIGHUP.
  void start();
  // From Server::shutdown: closes the timers and handles (the loop can end).
  void stop();

  void on_sigterm();
  void on_sighup();

  bool draining() const { return phase_ != Phase::kRunning; }
  // While draining: whether a worker's entry may still run (it completes a step another
  // local worker of job submitted before the drain); else why not, for its completion.
  bool admits(Job& job, const SubmitEntry& entry, std::string* why) const;
  // Why a new connection or a new job is refused while draining.
  std::string refusal() const;
  // The STATUS= line for systemd: jobs and workers, the cluster, or the drain's progress.
  std::string status_line() const;

 private:
  enum class Phase { kRunning, kSteps, kCheckpoint, kDone };
  struct Checkpoints;  // the checkpoint phase's progress, shared with its callbacks

  static void on_poll(uv_timer_t* timer);
  uint64_t operations_in_flight() const;
  void cut_operations();
  void start_checkpoint();
  void checkpoint_finished(bool saved, const std::string& summary);
  void finish(bool saved, const std::string& summary);
  std::string node() const;  // "node 0", "node 1 (10.0.0.2:7070)"

  Server& server_;
  SystemdNotifier notifier_;
  Phase phase_ = Phase::kRunning;
  bool started_ = false;
  uv_signal_t sighup_{};
  uv_timer_t poll_{};               // while draining: are the operations done, is the deadline past
  uint64_t steps_deadline_ms_ = 0;  // uv_now() value
  std::vector<std::shared_ptr<Job>> drained_jobs_;  // running when SIGTERM came
  std::shared_ptr<Checkpoints> checkpoints_;
  std::shared_ptr<LoopTimer> checkpoint_deadline_;
};

}  // namespace px
