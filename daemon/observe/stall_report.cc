#include "daemon/observe/stall_report.h"

#include "daemon/common/operation.h"

namespace px {
namespace {

constexpr size_t kNamedWorkers = 16;

std::string head(const Stall& s) {
  return "stall: job '" + s.job + "', variable '" + s.variable + "', " + s.operation + " step " +
         std::to_string(s.step) + ", " + s.node_label + ": ";
}

std::string describe(const StalledWorker& w) {
  std::string text = "local rank " + std::to_string(w.local_rank) + " (";
  if (w.rank >= 0) text += "global rank " + std::to_string(w.rank) + ", ";
  text += w.connected ? "pid " + std::to_string(w.pid) : std::string("gone");
  return text + ")";
}

// A pull step is served once the push steps before it are applied (under PX_SYNC; fewer
// under PX_BOUNDED). A local worker whose pushes stop short of the pull's step is what it
// waits for here (a worker that pulled again without pushing: in PyTorch a training
// forward whose backward never came); else the push is on its way, or, on a cluster, it
// waits for another node's workers.
std::string pull_waits_for(const InFlightOperation& op) {
  constexpr uint16_t kPush = static_cast<uint16_t>(Opcode::kPushRows);
  std::string missing;
  int count = 0;
  for (int r = 0; r < op.local_workers; ++r) {
    uint64_t pushed = op.var->steps_submitted(r, kPush);
    if (pushed >= op.step) continue;
    if (++count <= static_cast<int>(kNamedWorkers))
      missing +=
          (missing.empty() ? "" : ", ") + std::to_string(r) + " (pushed " +
          (pushed == 0 ? std::string("no step") : "up to step " + std::to_string(pushed - 1)) + ")";
  }
  if (count > static_cast<int>(kNamedWorkers))
    missing += " and " + std::to_string(count - static_cast<int>(kNamedWorkers)) + " more";
  if (count > 0)
    return " (push step " + std::to_string(op.step - 1) + " has not come from local rank" +
           (count > 1 ? "s " : " ") + missing +
           ": a pull waits for the push steps before it, so a worker that pulls again before "
           "pushing the step it pulled, as in a training forward whose backward never came, "
           "holds every worker's next pull)";
  if (op.job->world().node_count > 1)
    return " (waiting for the push steps before it: `pxctl stalls` on the other nodes names "
           "whose)";
  return " (waiting for the push steps before it to be applied on this node)";
}

}  // namespace

std::vector<Stall> find_waiting_steps(const Job& job, int64_t now_ns, int64_t threshold_ns,
                                      const StallContext& context) {
  std::vector<Stall> stalls;
  Job& j = const_cast<Job&>(job);  // members() and variables() have no const overloads
  const JobWorld& world = job.world();
  for (auto& var : j.variables()) {
    for (auto& [key, pending] : var->pending) {
      if (pending.failure != PX_OK || now_ns - pending.first_ns <= threshold_ns) continue;
      Stall s;
      s.job = job.name();
      s.variable = var->name;
      s.operation = operation_info(key.first).name ? operation_info(key.first).name : "?";
      s.step = key.second;
      s.node = context.node;
      s.node_label = context.node_label;
      s.waited_ms = (now_ns - pending.first_ns) / 1000000;
      s.kind = "workers";
      std::string missing, arrived;
      for (size_t r = 0; r < pending.by_rank.size(); ++r) {
        int rank = static_cast<int>(r);
        if (pending.by_rank[r]) {
          s.arrived.push_back(rank);
          if (s.arrived.size() <= kNamedWorkers)
            arrived += (arrived.empty() ? "" : ", ") + std::to_string(rank);
          continue;
        }
        StalledWorker w;
        w.local_rank = rank;
        w.rank = world.world_size > 0 ? world.rank_offset + rank : -1;
        const auto& member = r < j.members().size() ? j.members()[r] : nullptr;
        w.connected = member != nullptr;
        w.pid = member && context.pid_of ? context.pid_of(*member) : 0;
        s.missing.push_back(w);
        // The log line names the first kNamedWorkers; the list has them all.
        if (s.missing.size() <= kNamedWorkers)
          missing += (missing.empty() ? "" : ", ") + describe(w);
      }
      if (s.missing.size() > kNamedWorkers)
        missing += " and " + std::to_string(s.missing.size() - kNamedWorkers) + " more";
      if (s.arrived.size() > kNamedWorkers) arrived = std::to_string(s.arrived.size()) + " of them";
      s.description = head(s) + "waiting " + std::to_string(s.waited_ms) + " ms for " + missing +
                      " to submit it; local ranks " + (arrived.empty() ? "none" : arrived) + " did";
      stalls.push_back(std::move(s));
    }
  }
  return stalls;
}

Stall in_flight_stall(const InFlightOperation& op, int64_t now_ns, const StallContext& context) {
  Stall s;
  s.job = op.job->name();
  s.variable = op.var->name;
  s.operation = op.operation;
  s.step = op.step;
  s.node = context.node;
  s.node_label = context.node_label;
  s.waited_ms = (now_ns - op.matched_ns) / 1000000;
  s.kind = op.stage;
  for (int r = 0; r < op.local_workers; ++r) s.arrived.push_back(r);
  std::string stage = op.stage;
  std::string why;
  if (std::string(op.operation) == "pull" && (stage == "waiting for push" || stage == "sent")) {
    why = pull_waits_for(op);
  } else if (stage == "cross_node") {
    why = " (waiting for the other nodes: `pxctl stalls` there names whose)";
  }
  s.description = head(s) + "all " + std::to_string(op.local_workers) +
                  " local workers submitted it " + std::to_string(s.waited_ms) +
                  " ms ago; it is in stage '" + stage + "'" + why;
  return s;
}

}  // namespace px
