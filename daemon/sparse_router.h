// The node side of sparse variables: turns the local workers' pulls and pushes into one
// request per owning shard (the union of their rows; their gradients coalesced), sends them
// through the variable's SparseChannel and hands the results back to every worker.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "collective_transport.h"
#include "job.h"
#include "partition_map.h"
#include "shard_owner.h"
#include "sparse_channel.h"
#include "sparse_spec.h"
#include "thread_pool.h"

namespace px {

class Session;
struct SparseRun;

// What a node holds for one sparse variable.
struct SparseTable {
  SparseShape shape;
  SparseOptions options;
  PartitionMap map;
  std::shared_ptr<ShardOwner> owner;
  std::shared_ptr<SparseChannel> channel;
  // Counters for stats: rows the local workers pulled (duplicates included) and the rows
  // this node asked the shards for (their union), summed over pull steps.
  uint64_t rows_pulled = 0;
  uint64_t rows_unique = 0;
  std::set<SparseRun*> in_flight;  // operations past local matching, not yet complete
};

class SparseRouter {
 public:
  using PostToLoop = std::function<void(std::function<void()>)>;
  SparseRouter(ThreadPool& pool, PostToLoop post) : pool_(pool), post_(std::move(post)) {}

  void set_fabric(CollectiveTransport* fabric) { fabric_ = fabric; }

  // Sets up the variable's table on this node (its shards allocated and initialised).
  std::shared_ptr<SparseTable> create(const Job& job, const Variable& var, SparseShape shape,
                                      const SparseOptions& options,
                                      std::function<std::string(int)> node_label);

  // A pull or push step every local worker submitted.
  void run_step(std::shared_ptr<Job> job, Variable& var, Opcode opcode, uint64_t step,
                PendingStep pending);
  // One worker's load or read (not steps).
  void run_single(std::shared_ptr<Session> session, Variable& var, const SubmitEntry& entry);
  // Completes the variable's operations in flight with status (poisoned variable, broken
  // job); their transfers still under way are ignored when they finish.
  void fail_in_flight(Variable& var, px_status status, const std::string& why);

 private:
  using Run = SparseRun;
  void start(const std::shared_ptr<Run>& run);
  void prepare_rows(Run& run);
  void prepare_updates(Run& run);
  void send(const std::shared_ptr<Run>& run);
  void deliver(const std::shared_ptr<Run>& run);
  void scatter(Run& run);
  void finish(Run& run, px_status status, const std::string& message);
  // work off the loop when heavy, then `then` on the loop.
  void offload(bool heavy, std::function<void()> work, std::function<void()> then);

  ThreadPool& pool_;
  PostToLoop post_;
  CollectiveTransport* fabric_ = nullptr;
};

}  // namespace px
