// Where a PX_ROUTE_AUTO table's route estimate and move (route_move.cc) is, and which moves
// between those states are legal, as sparse_run_state.h does for a run. What is not a state
// stays beside it: the step operations are held from, the held operations, the attempt (a
// generation that late callbacks of an abandoned agreement or move compare against).
#pragma once

#include <cstdint>

namespace px {

enum class MoveState : uint8_t {
  // Nothing pending: operations run as they come.
  kIdle,
  // The pull that closes an estimate's window has started: operations of later steps wait
  // (hold_from) until it is sent and the nodes have agreed.
  kHolding,
  // That pull was sent: the nodes' samples are being all-gathered.
  kAgreeing,
  // The agreed estimate chose another route: every operation now waits, and the table's
  // operations under way drain.
  kDraining,
  // Drained here: waiting for every node to drain, then exporting this node's rows.
  kExporting,
  // The exports (or, replicated, this node's whole replica) are being exchanged.
  kExchanging,
  // Every node's rows are here; the new layout takes them once the table is drained again.
  kGathered,
  // The new layout is being filled from the rows (on the pool).
  kLayingOut,
};

// The lifecycle, in one table: idle -> holding -> agreeing -> (idle | draining -> exporting
// -> exchanging -> gathered -> laying out -> idle). An agreement may start without a hold
// (a window closed by a pull refused before it was held); any state may fall back to idle
// when the agreement or move is given up (a failed collective, a poisoned variable, a broken
// job, the table released).
constexpr bool move_transition_legal(MoveState from, MoveState to) {
  if (to == MoveState::kIdle) return from != MoveState::kIdle;
  switch (from) {
    case MoveState::kIdle:
      return to == MoveState::kHolding || to == MoveState::kAgreeing;
    case MoveState::kHolding:
      return to == MoveState::kAgreeing;
    case MoveState::kAgreeing:
      return to == MoveState::kDraining;
    case MoveState::kDraining:
      return to == MoveState::kExporting;
    case MoveState::kExporting:
      return to == MoveState::kExchanging;
    case MoveState::kExchanging:
      return to == MoveState::kGathered;
    case MoveState::kGathered:
      return to == MoveState::kLayingOut;
    case MoveState::kLayingOut:
      return false;
  }
  return false;
}

// Operations of steps from hold_from on wait (every operation, from kDraining on).
constexpr bool move_holds(MoveState state) {
  return state != MoveState::kIdle;
}

// A move is under way: finished runs and checkpoints may let it go on.
constexpr bool move_under_way(MoveState state) {
  return state >= MoveState::kDraining;
}

constexpr const char* move_state_name(MoveState state) {
  switch (state) {
    case MoveState::kIdle:
      return "idle";
    case MoveState::kHolding:
      return "holding";
    case MoveState::kAgreeing:
      return "agreeing";
    case MoveState::kDraining:
      return "draining";
    case MoveState::kExporting:
      return "exporting";
    case MoveState::kExchanging:
      return "exchanging";
    case MoveState::kGathered:
      return "gathered";
    case MoveState::kLayingOut:
      return "laying out";
  }
  return "?";
}

}  // namespace px
