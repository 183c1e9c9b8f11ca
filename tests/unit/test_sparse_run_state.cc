// The router's run lifecycle (sparse_run_state.h) and a route move's (route_move_state.h):
// the moves the router makes are legal, and anything else (skipping a state, going back) is not.
#include <doctest/doctest.h>

#include <cstddef>
#include <set>
#include <utility>
#include <vector>

#include "daemon/sparse/route_move_state.h"
#include "daemon/sparse/sparse_run_state.h"

namespace px {
namespace {

constexpr RunState kAll[] = {RunState::kCreated,   RunState::kWaitingForPush, RunState::kPreparing,
                             RunState::kPrepared,  RunState::kSending,        RunState::kSent,
                             RunState::kAbandoned, RunState::kFinished};

}  // namespace

TEST_CASE("run state: exactly the lifecycle's moves are legal") {
  const std::set<std::pair<RunState, RunState>> legal = {
      {RunState::kCreated, RunState::kWaitingForPush},
      {RunState::kCreated, RunState::kPreparing},
      {RunState::kWaitingForPush, RunState::kPreparing},
      {RunState::kPreparing, RunState::kPrepared},
      {RunState::kPrepared, RunState::kSending},
      {RunState::kSending, RunState::kSent},
      {RunState::kSent, RunState::kAbandoned},
      {RunState::kSent, RunState::kFinished},
      {RunState::kAbandoned, RunState::kFinished},
  };
  for (RunState from : kAll) {
    for (RunState to : kAll) {
      CAPTURE(run_state_name(from));
      CAPTURE(run_state_name(to));
      CHECK(run_transition_legal(from, to) == (legal.count({from, to}) == 1));
    }
  }
}

TEST_CASE("run state: the router's paths walk legal moves; sent means sent or later") {
  // A pull behind a push; a run refused or finished after sending; one failed from outside.
  const std::vector<std::vector<RunState>> paths = {
      {RunState::kCreated, RunState::kWaitingForPush, RunState::kPreparing, RunState::kPrepared,
       RunState::kSending, RunState::kSent, RunState::kFinished},
      {RunState::kCreated, RunState::kPreparing, RunState::kPrepared, RunState::kSending,
       RunState::kSent, RunState::kAbandoned, RunState::kFinished},
  };
  for (const auto& path : paths)
    for (size_t i = 0; i + 1 < path.size(); ++i) CHECK(run_transition_legal(path[i], path[i + 1]));
  for (RunState s : kAll) {
    bool sent = s == RunState::kSent || s == RunState::kAbandoned || s == RunState::kFinished;
    CHECK(run_has_sent(s) == sent);
    CHECK(!run_transition_legal(RunState::kFinished, s));
    CHECK(!run_transition_legal(s, s));
  }
  static_assert(run_transition_legal(RunState::kSending, RunState::kSent));
  static_assert(!run_transition_legal(RunState::kPreparing, RunState::kSending));
}

}  // namespace px

namespace px {

TEST_CASE("route move state: exactly the lifecycle's moves are legal") {
  constexpr MoveState kStates[] = {
      MoveState::kIdle,      MoveState::kHolding,    MoveState::kAgreeing, MoveState::kDraining,
      MoveState::kExporting, MoveState::kExchanging, MoveState::kGathered, MoveState::kLayingOut};
  std::set<std::pair<MoveState, MoveState>> legal = {
      {MoveState::kIdle, MoveState::kHolding},
      {MoveState::kIdle, MoveState::kAgreeing},
      {MoveState::kHolding, MoveState::kAgreeing},
      {MoveState::kAgreeing, MoveState::kDraining},
      {MoveState::kDraining, MoveState::kExporting},
      {MoveState::kExporting, MoveState::kExchanging},
      {MoveState::kExchanging, MoveState::kGathered},
      {MoveState::kGathered, MoveState::kLayingOut},
  };
  for (MoveState from : kStates)  // giving up: any state back to idle
    if (from != MoveState::kIdle) legal.insert({from, MoveState::kIdle});
  for (MoveState from : kStates) {
    for (MoveState to : kStates) {
      CAPTURE(move_state_name(from));
      CAPTURE(move_state_name(to));
      CHECK(move_transition_legal(from, to) == (legal.count({from, to}) == 1));
    }
  }
  // Operations are held in every state but idle; a move is under way from draining on.
  for (MoveState s : kStates) {
    CHECK(move_holds(s) == (s != MoveState::kIdle));
    CHECK(move_under_way(s) == (s >= MoveState::kDraining));
  }
}

}  // namespace px
