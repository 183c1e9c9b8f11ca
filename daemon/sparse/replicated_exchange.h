// The exchange of the replicated routes (allgatherv, allreduce): every node holds the whole
// table, and a push step is exchanged with the other nodes by a collective before every
// replica applies the identical update. allgatherv gathers the nodes' coalesced rows (their
// counts first, then rows and values); allreduce densifies the gradient to rows x (dim + 1),
// the extra column counting who touched a row, sums it across the nodes and collects the
// touched rows. When and in which order the steps are applied is the ShardOwner's business.
// Loop thread only; the heavy parts run through the owner's SerialQueue or the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/common/log.h"
#include "daemon/common/offload.h"
#include "daemon/common/serial_queue.h"
#include "daemon/sparse/shard_request.h"
#include "sharding/sparse_spec.h"
#include "transport/collectives/collective_transport.h"

namespace px {

class ReplicatedExchange {
 public:
  // A push step exchanged: every node's rows of it, as batches to apply (allgatherv: one per
  // node, in node order; allreduce: one, already summed; each keeps its memory alive). Called
  // on the loop thread, in whatever order the steps complete; never for a failed step (the
  // failure is logged).
  using Exchanged = std::function<void(uint64_t step, std::vector<ShardRequest> batches)>;

  // route: kAllgatherv or kAllreduce; rows: the table's rows (allreduce's dense buffer).
  ReplicatedExchange(std::string label, Route route, int node, int node_count, size_t dim,
                     uint64_t rows, ThreadPool& pool, PostToLoop post,
                     std::shared_ptr<SerialQueue> queue, Exchanged exchanged);

  // Cluster: the transport and cluster-wide id the collectives use. Without them (or alone)
  // a step is exchanged at once with this node's rows only.
  void attach(CollectiveTransport* fabric, uint32_t global_id, size_t chunk_bytes);

  // The job and variable its log lines name (ShardOwner::set_names).
  void set_log_fields(LogFields fields) { log_fields_ = std::move(fields); }

  // This node's push step (coalesced over its workers; kept alive until applied).
  void exchange(ShardRequest mine);

  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  struct Step;
  void allgatherv(const std::shared_ptr<Step>& ex);
  void allgatherv_rows(const std::shared_ptr<Step>& ex);
  void allreduce(const std::shared_ptr<Step>& ex);
  void allreduce_collect(const std::shared_ptr<Step>& ex);
  void done(const std::shared_ptr<Step>& ex);
  LogFields step_fields(uint64_t step) const;

  std::string label_;
  LogFields log_fields_;
  Route route_;
  int node_;
  int node_count_;
  size_t dim_;
  uint64_t rows_;
  ThreadPool& pool_;
  PostToLoop post_;
  std::shared_ptr<SerialQueue> queue_;
  Exchanged exchanged_;
  CollectiveTransport* fabric_ = nullptr;
  uint32_t global_id_ = 0;
  size_t chunk_bytes_ = 256 * 1024;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
};

}  // namespace px
