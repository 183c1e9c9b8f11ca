#include "daemon/cluster/agreement.h"

namespace px {

Agreement::Agreement(int node_count, std::function<std::string(int node)> node_label)
    : node_count_(node_count), node_label_(std::move(node_label)) {}

std::optional<Agreement::Verdict> Agreement::job_joined(int node, const std::string& job,
                                                        uint32_t local_size, bool nccl) {
  auto& sizes = job_sizes_[job];
  sizes.resize(static_cast<size_t>(node_count_));
  sizes[static_cast<size_t>(node)] = Joined{local_size, nccl};
  for (auto& s : sizes)
    if (!s) return std::nullopt;
  Verdict world;
  world.kind = Verdict::Kind::kJobWorld;
  world.job = job;
  world.device_routes = true;
  for (auto& s : sizes) {
    world.local_sizes.push_back(s->local_size);
    world.device_routes = world.device_routes && s->nccl;
  }
  world.id = next_id_++;
  runs_[world.id] = Run{job, std::vector<bool>(static_cast<size_t>(node_count_), false)};
  job_sizes_.erase(job);
  // A new run of the job (every node's workers joined afresh): its variables are agreed on
  // afresh, under new ids.
  for (auto it = vars_.lower_bound({job, ""}); it != vars_.end() && it->first.first == job;)
    it = vars_.erase(it);
  return world;
}

std::optional<Agreement::Verdict> Agreement::var_registered(int node, const std::string& job,
                                                            const std::string& var,
                                                            const Fingerprint& fingerprint) {
  Var& v = vars_[{job, var}];
  v.by_node.resize(static_cast<size_t>(node_count_));
  auto& mine = v.by_node[static_cast<size_t>(node)];
  if (mine && !(*mine == fingerprint)) {
    // The node's own workers disagree: the variable is poisoned there, so everywhere (even
    // if it was decided already: that node cannot take part in it).
    Verdict mismatch;
    mismatch.kind = Verdict::Kind::kVarMismatch;
    mismatch.job = job;
    mismatch.var = var;
    mismatch.message = "variable '" + var + "' of job '" + job + "' is registered on " +
                       node_label_(node) + " as " + mine->describe_difference(fingerprint) +
                       " and as " + fingerprint.describe_difference(*mine);
    v.verdict = mismatch;
    return mismatch;
  }
  if (v.verdict) {
    if (mine) return std::nullopt;  // a repeat of what it said: it has the verdict
    mine = fingerprint;             // decided before this node registered: tell it alone
    Verdict late = *v.verdict;
    late.to = node;
    return late;
  }
  mine = fingerprint;
  for (auto& f : v.by_node)
    if (!f) return std::nullopt;
  Verdict verdict;
  verdict.job = job;
  verdict.var = var;
  bool same = true;
  for (auto& f : v.by_node) same = same && *f == *v.by_node[0];
  if (same) {
    verdict.kind = Verdict::Kind::kVarReady;
    verdict.id = next_id_++;
  } else {
    verdict.kind = Verdict::Kind::kVarMismatch;
    verdict.message = differs_across_nodes(job, var, v);
  }
  v.verdict = verdict;
  return verdict;
}

std::optional<Agreement::Verdict> Agreement::job_left(int node, const std::string& job,
                                                      uint32_t barrier_id) {
  auto it = runs_.find(barrier_id);
  if (it == runs_.end() || it->second.job != job) return std::nullopt;
  it->second.left[static_cast<size_t>(node)] = true;
  for (bool left : it->second.left)
    if (!left) return std::nullopt;
  runs_.erase(it);
  // Every node sends its JobLeft before a later run's JobJoin on the same connection, so no
  // later run of this name can have registered variables yet: they are all this run's.
  for (auto v = vars_.lower_bound({job, ""}); v != vars_.end() && v->first.first == job;)
    v = vars_.erase(v);
  Verdict end;
  end.kind = Verdict::Kind::kJobEnd;
  end.job = job;
  end.id = barrier_id;
  return end;
}

// Every node's shape, each as the words that differ from node 0's (node 0's from node 1's),
// so that the message stays short enough to name every node however long the options are.
std::string Agreement::differs_across_nodes(const std::string& job, const std::string& var,
                                            const Var& v) const {
  std::string shapes;
  const Fingerprint& first = *v.by_node[0];
  for (size_t i = 0; i < v.by_node.size(); ++i) {
    const Fingerprint& f = *v.by_node[i];
    const Fingerprint& other = i == 0 && v.by_node.size() > 1 ? *v.by_node[1] : first;
    shapes +=
        (i ? ", " : "") + node_label_(static_cast<int>(i)) + ": " + f.describe_difference(other);
  }
  return "variable '" + var + "' of job '" + job + "' differs across nodes: " + shapes;
}

}  // namespace px
