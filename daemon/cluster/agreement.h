// The coordinator's agreement on jobs and variables, without sockets or messages: it is told
// what each node reported (its part of a job, a variable's registration) and answers with
// the verdict to send, if any. Cluster (cluster_coordinator.cc) turns the reports it reads
// off the control connections into calls here and each verdict into a message, so every
// rule of agreement can be tested without a network (tests/unit/test_agreement.cc).
//
// Ids: one counter hands out both a job run's barrier id and a variable's cluster-wide id
// (both tag bulk messages, so they never collide), starting at 1 (0 means "none yet").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/common/job.h"

namespace px {

class Agreement {
 public:
  // What the coordinator sends, to every node or to one.
  struct Verdict {
    enum class Kind { kJobWorld, kVarReady, kVarMismatch, kJobEnd };
    static constexpr int kEveryNode = -1;

    Kind kind = Kind::kJobWorld;
    int to = kEveryNode;  // a node index: only that node needs it (it registered late)
    std::string job;
    std::string var;  // kVarReady, kVarMismatch
    uint32_t id = 0;  // kJobWorld, kJobEnd: the run's barrier id; kVarReady: the global id
    std::vector<uint32_t> local_sizes;  // kJobWorld: workers on each node, by node
    bool device_routes = false;         // kJobWorld: every node can run NCCL
    std::string message;                // kVarMismatch: why, naming the nodes
  };

  // node_label(i): how messages name node i ("node 2 (10.0.0.3:7070)"); asked each time a
  // message is written, since a node's host may be learnt only when it joins.
  Agreement(int node_count, std::function<std::string(int node)> node_label);

  // Node `node` has local_size workers in `job` (and can run NCCL: nccl). Once every node said
  // so, the job's world goes to every node under a fresh barrier id, with device routes if
  // every node can run NCCL, and the job's variables are forgotten: the run that starts is
  // agreed on afresh (a job re-run under the same name gets new ids).
  std::optional<Verdict> job_joined(int node, const std::string& job, uint32_t local_size,
                                    bool nccl = false);

  // Node `node` registered `var` of `job` as `fingerprint` (again, with another fingerprint,
  // when its own workers disagree). Once every node registered it: ready under a fresh id if
  // all fingerprints are equal, else a mismatch naming every node's shape. A node whose own
  // workers disagree poisons the variable everywhere at once. A node that registers after
  // the verdict gets it alone.
  std::optional<Verdict> var_registered(int node, const std::string& job, const std::string& var,
                                        const Fingerprint& fingerprint);

  // Every local worker of the run `barrier_id` of `job` has left node `node`. Once every node
  // said so, the run ends everywhere (kJobEnd) and its variables' agreement state is
  // forgotten. A run this agreement never started, or a node that says it twice, changes
  // nothing.
  std::optional<Verdict> job_left(int node, const std::string& job, uint32_t barrier_id);

  // The cluster re-formed, on node_count nodes (fewer with membership on etcd, after a loss;
  // nodes are then the epoch's ranks): every run and registration of the earlier epoch is
  // gone (every job failed when the node was lost). Ids go on counting.
  void reset(int node_count) {
    job_sizes_.clear();
    vars_.clear();
    runs_.clear();
    node_count_ = node_count;
  }
  // Ids from here on are at least `first` (never 0 in the tags' 24 bits). A coordinator
  // restarted from scratch would count from 1 again while the members still hold the old
  // epoch's ids (runs ended there, variables' traffic marked dead): each epoch starts its
  // ids in a range of its own (Cluster::form), so an old id is never handed out again.
  void skip_ids_below(uint32_t first) {
    if (next_id_ < first) next_id_ = first;
    if ((next_id_ & 0xffffffu) == 0) ++next_id_;
  }

  int node_count() const { return node_count_; }
  // Runs started and not yet ended everywhere (for tests and leak checks).
  size_t running() const { return runs_.size(); }
  size_t variables() const { return vars_.size(); }

 private:
  struct Var {
    std::vector<std::optional<Fingerprint>> by_node;
    // Set once decided; kept for a node that registers after it (a node whose own workers
    // disagreed decides it early).
    std::optional<Verdict> verdict;
  };

  std::string differs_across_nodes(const std::string& job, const std::string& var,
                                   const Var& v) const;

  int node_count_;
  std::function<std::string(int)> node_label_;
  struct Joined {
    uint32_t local_size = 0;
    bool nccl = false;
  };
  std::map<std::string, std::vector<std::optional<Joined>>> job_sizes_;
  std::map<std::pair<std::string, std::string>, Var> vars_;
  struct Run {
    std::string job;
    std::vector<bool> left;  // by node
  };
  std::map<uint32_t, Run> runs_;  // by barrier id
  uint32_t next_id_ = 1;
};

}  // namespace px
