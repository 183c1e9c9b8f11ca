#include "daemon/dense/step_matcher.h"

#include <algorithm>
#include <utility>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/admission.h"
#include "transport/ipc/control_channel.h"

namespace px {
namespace {

// Pending steps hold admitted opcodes only: every one has a name.
const char* op_name(uint16_t opcode) {
  return operation_info(opcode).name;
}

// The barrier (variable 0) has no name to show: its steps are named by number alone.
std::string pending_suffix(const Variable& var, const std::pair<uint16_t, uint64_t>& key) {
  return var.id == 0 ? " (barrier " + std::to_string(key.second) + ")"
                     : step_suffix(var, key.first, key.second);
}

// Fails every contribution of a pending step, and the step's later arrivals, with status.
void fail_pending(PendingStep& pending, px_status status, const std::string& message) {
  pending.failure = status;
  pending.failure_message = message;
  for (auto& c : pending.by_rank) {
    if (c) c->worker->complete(c->request_id, status, message);
    c.reset();
  }
}

}  // namespace

std::optional<PendingStep> match_step(Job& job, Variable& var, int rank,
                                      const std::shared_ptr<Completer>& worker,
                                      const SubmitEntry& entry, const std::string& invalid) {
  PX_ASSERT_LOOP_THREAD();
  auto key = std::make_pair(entry.opcode, entry.step);
  PendingStep& pending = var.pending[key];
  if (pending.by_rank.empty()) {
    pending.by_rank.resize(static_cast<size_t>(job.local_size()));
    pending.first_ns = monotonic_ns();
  }
  ++pending.arrived;
  pending.priority = std::max(pending.priority, entry.priority);
  bool everyone_arrived = pending.arrived == static_cast<uint32_t>(job.local_size());
  if (pending.failure == PX_OK && !invalid.empty()) fail_pending(pending, PX_ERR_INVALID, invalid);
  if (pending.failure != PX_OK) {
    // A failed step stays until its last worker came, so late arrivals get its failure
    // instead of opening the step anew.
    worker->complete(entry.request_id, pending.failure, pending.failure_message);
    if (everyone_arrived) var.pending.erase(key);
    return std::nullopt;
  }
  pending.by_rank[static_cast<size_t>(rank)] =
      Contribution{worker, entry.request_id, entry.in, entry.out, entry.root, nullptr};
  if (!everyone_arrived) return std::nullopt;
  std::optional<PendingStep> complete(std::move(pending));
  var.pending.erase(key);
  return complete;
}

void fail_pending_steps(Variable& var, px_status status, const std::string& why) {
  for (auto& [key, pending] : var.pending) {
    std::string message = why + step_suffix(var, key.first, key.second);
    for (auto& c : pending.by_rank)
      if (c) c->worker->complete(c->request_id, status, message);
  }
  var.pending.clear();
}

bool withdraw_from_step(Job& job, int local_rank, Completer& worker, uint64_t request_id,
                        const std::string& reason, std::string* message) {
  size_t rank = static_cast<size_t>(local_rank);
  for (auto& var : job.variables()) {
    for (auto& [key, pending] : var->pending) {
      if (rank >= pending.by_rank.size() || !pending.by_rank[rank] ||
          pending.by_rank[rank]->request_id != request_id)
        continue;
      std::string suffix = pending_suffix(*var, key);
      *message =
          worker.label() + " withdrew from its " + op_name(key.first) + ": " + reason + suffix;
      worker.complete(request_id, PX_ERR_CANCELLED, std::string("withdrawn: ") + reason + suffix);
      pending.by_rank[rank].reset();
      fail_pending(pending, PX_ERR_CANCELLED, *message);
      return true;
    }
  }
  return false;
}

std::vector<StalledStep> fail_stalled_steps(Job& job, int64_t now_ns, int64_t stall_ns) {
  std::vector<StalledStep> failed;
  for (auto& var : job.variables()) {
    for (auto& [key, pending] : var->pending) {
      if (pending.failure != PX_OK || now_ns - pending.first_ns <= stall_ns) continue;
      std::string missing, waiting;
      for (size_t r = 0; r < pending.by_rank.size(); ++r) {
        std::string& list = pending.by_rank[r] ? waiting : missing;
        if (!list.empty()) list += ", ";
        if (pending.by_rank[r]) {
          list += std::to_string(r);
        } else {
          auto& member = job.members()[r];
          list += member ? member->label() : "local rank " + std::to_string(r) + " (gone)";
        }
      }
      std::string message = std::string(op_name(key.first)) + " stalled: " + missing +
                            " did not submit it within " + std::to_string(stall_ns / 1000000) +
                            " ms of the first local worker (step_stall_ms); local ranks " +
                            waiting + " were waiting" + pending_suffix(*var, key);
      fail_pending(pending, PX_ERR_TIMEOUT, message);
      failed.push_back({message, var->name, key.second});
    }
  }
  return failed;
}

}  // namespace px
