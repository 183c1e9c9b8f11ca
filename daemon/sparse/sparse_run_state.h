// Where one of the router's sparse operations (a SparseRun: a pull or push step, a load, a
// read) is in its life, and which moves between those states are legal. The counters that
// are not states (pool tasks still at work on the workers' buffers, requests still out) stay
// counters on the run.
#pragma once

#include <cstdint>

namespace px {

enum class RunState : uint8_t {
  // Built from the workers' entries; start() has not looked at the variable's runs yet.
  kCreated,
  // A pull behind pushes of the variable that have not sent: it cannot be served before
  // they are applied, so it is not prepared before they leave (it would take CPU from them).
  kWaitingForPush,
  // Checking the workers' input and planning the requests, inline or on the pool.
  kPreparing,
  // Ready to send, once every run of the variable started before it has sent (a node's
  // pushes must reach each owner in step order).
  kPrepared,
  // Its turn to send: a push summing its groups on the pool, or a run waiting for the
  // variable's cluster-wide id. Runs after it in the variable's send order wait.
  kSending,
  // Every request issued (or the run refused); replies, scatters and pool tasks may still
  // be outstanding. Runs after it may send.
  kSent,
  // Sent, then failed from outside (poisoned variable, broken job) while pool tasks still
  // worked on the workers' buffers: requests still out no longer count, the run finishes
  // once those tasks end.
  kAbandoned,
  // The workers were answered; nothing of the run counts any more.
  kFinished,
};

// The lifecycle, in one place: created -> (waiting for push ->) preparing -> prepared ->
// sending -> sent (-> abandoned) -> finished.
constexpr bool run_transition_legal(RunState from, RunState to) {
  switch (from) {
    case RunState::kCreated:
      return to == RunState::kWaitingForPush || to == RunState::kPreparing;
    case RunState::kWaitingForPush:
      return to == RunState::kPreparing;
    case RunState::kPreparing:
      return to == RunState::kPrepared;
    case RunState::kPrepared:
      return to == RunState::kSending;
    case RunState::kSending:
      return to == RunState::kSent;
    case RunState::kSent:
      return to == RunState::kAbandoned || to == RunState::kFinished;
    case RunState::kAbandoned:
      return to == RunState::kFinished;
    case RunState::kFinished:
      return false;
  }
  return false;
}

// Every request of the run issued (it may be finished since).
constexpr bool run_has_sent(RunState state) {
  return state == RunState::kSent || state == RunState::kAbandoned || state == RunState::kFinished;
}

constexpr const char* run_state_name(RunState state) {
  switch (state) {
    case RunState::kCreated:
      return "created";
    case RunState::kWaitingForPush:
      return "waiting for push";
    case RunState::kPreparing:
      return "preparing";
    case RunState::kPrepared:
      return "prepared";
    case RunState::kSending:
      return "sending";
    case RunState::kSent:
      return "sent";
    case RunState::kAbandoned:
      return "abandoned";
    case RunState::kFinished:
      return "finished";
  }
  return "?";
}

}  // namespace px
