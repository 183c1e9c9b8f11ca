#include "daemon/dense/alltoall_step.h"

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/common/loop_thread.h"
#include "daemon/common/operation.h"
#include "daemon/dense/host_copies.h"
#include "daemon/observe/step_trace.h"
#include "transport/collectives/pairwise_exchange.h"

namespace px {
namespace {

struct AlltoallRun {
  explicit AlltoallRun(const StepContext& c) : context(c) {}
  StepContext context;
  std::shared_ptr<Job> job;
  Variable* var = nullptr;  // kept alive by job
  uint64_t step = 0;
  uint8_t priority = 0;
  uint64_t elem = 4;
  std::vector<std::shared_ptr<Completer>> workers;  // by local rank
  std::vector<uint64_t> request_ids;
  std::vector<const char*> blocks;  // each local worker's blocks, after its counts
  std::vector<char*> outputs;
  // Per local worker, per global rank: elements sent to / received from it, and where that
  // block starts (bytes) in the worker's blocks / output.
  std::vector<std::vector<uint64_t>> send_counts, recv_counts, send_at, recv_at;
  uint64_t bytes_moved = 0;
  // Cluster, per node: what this node sends it (counts [local sender][its rank], blocks in
  // that order) and what it sent this node (counts [its sender][local receiver], blocks).
  std::vector<std::vector<uint64_t>> header_out, header_in;
  std::vector<std::vector<char>> payload_out, payload_in;
  std::mutex mismatch_mutex;
  std::string mismatch;  // the first count another node disagreed on
  StepTrace trace;

  int first_rank() const { return job->world().rank_offset; }
  int local_size() const { return static_cast<int>(workers.size()); }
  std::string what() const {
    return "alltoall of '" + var->name + "' step " + std::to_string(step);
  }
};

void finish(AlltoallRun& run, px_status status, const std::string& message) {
  if (status == PX_OK) {
    run.var->stats.ops += 1;
    run.var->stats.bytes += run.bytes_moved;
  }
  trace_finished(run.trace, "alltoall", status, status == PX_OK ? run.bytes_moved : 0);
  for (size_t r = 0; r < run.workers.size(); ++r)
    run.workers[r]->complete(run.request_ids[r], status, message);
}

std::string disagree(int sender, int receiver, uint64_t sends, uint64_t expects) {
  return "rank " + std::to_string(sender) + " sends " + std::to_string(sends) +
         " elements to rank " + std::to_string(receiver) + ", which expects " +
         std::to_string(expects) + " (its recv_counts[" + std::to_string(sender) + "])";
}

// Reads each local worker's counts, checks them and its buffers against each other and the
// variable, and the local pairs against each other. Empty if all is well.
std::string read_counts(AlltoallRun& run, const PendingStep& pending) {
  size_t world = static_cast<size_t>(run.job->world().world_size);
  uint64_t most = run.var->fingerprint.count, header = 2 * world * sizeof(uint64_t);
  for (size_t w = 0; w < pending.by_rank.size(); ++w) {
    const Contribution& c = *pending.by_rank[w];
    const char* in = c.worker->arena().base() + c.in.offset;
    std::vector<uint64_t> send(world), recv(world);  // copies: the client may scribble
    std::memcpy(send.data(), in, world * sizeof(uint64_t));
    std::memcpy(recv.data(), in + world * sizeof(uint64_t), world * sizeof(uint64_t));
    std::vector<uint64_t> send_at(world), recv_at(world);
    uint64_t sent = 0, received = 0;
    for (size_t k = 0; k < world; ++k) {
      if (send[k] > most || recv[k] > most)
        return c.worker->label() + " gave a count of " +
               std::to_string(std::max(send[k], recv[k])) + " for rank " + std::to_string(k) +
               ", above the variable's count " + std::to_string(most);
      send_at[k] = sent;
      recv_at[k] = received;
      sent += send[k] * run.elem;
      received += recv[k] * run.elem;
    }
    if (c.in.bytes != header + sent || c.out.bytes != received)
      return c.worker->label() + "'s buffers (" + std::to_string(c.in.bytes - header) + "/" +
             std::to_string(c.out.bytes) + " bytes) do not hold the blocks its counts name (" +
             std::to_string(sent) + "/" + std::to_string(received) + ")";
    run.blocks[w] = in + header;
    run.send_counts[w] = std::move(send);
    run.recv_counts[w] = std::move(recv);
    run.send_at[w] = std::move(send_at);
    run.recv_at[w] = std::move(recv_at);
    run.bytes_moved += received;
  }
  int first = run.first_rank();
  for (int s = 0; s < run.local_size(); ++s)
    for (int r = 0; r < run.local_size(); ++r) {
      uint64_t sends = run.send_counts[s][static_cast<size_t>(first + r)];
      uint64_t expects = run.recv_counts[r][static_cast<size_t>(first + s)];
      if (sends != expects) return disagree(first + s, first + r, sends, expects);
    }
  return "";
}

// Blocks between this node's own workers.
void add_local_copies(const AlltoallRun& run, std::vector<HostCopy>* copies) {
  int first = run.first_rank();
  for (int s = 0; s < run.local_size(); ++s)
    for (int r = 0; r < run.local_size(); ++r) {
      auto S = static_cast<size_t>(first + s), R = static_cast<size_t>(first + r);
      copies->push_back({run.outputs[r] + run.recv_at[r][S], run.blocks[s] + run.send_at[s][R],
                         run.send_counts[s][R] * run.elem});
    }
}

// Cluster, on the pool: the counts and blocks this node sends each other node.
void pack(AlltoallRun& run) {
  const JobWorld& world = run.job->world();
  size_t nodes = static_cast<size_t>(world.node_count);
  run.header_out.assign(nodes, {});
  run.payload_out.assign(nodes, {});
  run.header_in.assign(nodes, {});
  run.payload_in.assign(nodes, {});
  int first = 0;
  for (size_t k = 0; k < nodes; first += world.node_sizes[k++]) {
    if (static_cast<int>(k) == world.node_index) continue;
    int size = world.node_sizes[k];
    uint64_t bytes = 0;
    for (int s = 0; s < run.local_size(); ++s)
      for (int r = first; r < first + size; ++r) {
        run.header_out[k].push_back(run.send_counts[s][static_cast<size_t>(r)]);
        bytes += run.send_counts[s][static_cast<size_t>(r)] * run.elem;
      }
    run.payload_out[k].resize(bytes);
    char* at = run.payload_out[k].data();
    for (int s = 0; s < run.local_size(); ++s) {  // a sender's blocks for node k are adjacent
      uint64_t from = run.send_at[s][static_cast<size_t>(first)];
      uint64_t len = 0;
      for (int r = first; r < first + size; ++r)
        len += run.send_counts[s][static_cast<size_t>(r)] * run.elem;
      if (len == 0) continue;  // (an empty payload has no data(): memcpy takes no null)
      std::memcpy(at, run.blocks[s] + from, len);
      at += len;
    }
    run.header_in[k].assign(static_cast<size_t>(size) * run.workers.size(), 0);
  }
}

// Where node k's blocks go (on a transport thread, once its counts arrived): they are
// received whole whatever they say; a count this node's workers did not expect fails the
// step here once every transfer is done.
std::pair<void*, size_t> receive_from(AlltoallRun& run, int k) {
  const JobWorld& world = run.job->world();
  int first = 0;
  for (int n = 0; n < k; ++n) first += world.node_sizes[static_cast<size_t>(n)];
  const std::vector<uint64_t>& counts = run.header_in[static_cast<size_t>(k)];
  uint64_t bytes = 0;
  for (int s = 0; s < world.node_sizes[static_cast<size_t>(k)]; ++s)
    for (int r = 0; r < run.local_size(); ++r) {
      uint64_t sends = counts[static_cast<size_t>(s * run.local_size() + r)];
      uint64_t expects = run.recv_counts[r][static_cast<size_t>(first + s)];
      bytes += sends * run.elem;
      if (sends != expects) {
        std::lock_guard<std::mutex> lock(run.mismatch_mutex);
        if (run.mismatch.empty())
          run.mismatch = disagree(first + s, run.first_rank() + r, sends, expects);
      }
    }
  std::vector<char>& payload = run.payload_in[static_cast<size_t>(k)];
  payload.resize(bytes);
  return {payload.data(), bytes};
}

// Cluster, after the exchange: the other nodes' blocks and this node's own to the outputs.
void unpack(const std::shared_ptr<AlltoallRun>& run) {
  const JobWorld& world = run->job->world();
  std::vector<HostCopy> copies;
  add_local_copies(*run, &copies);
  int first = 0;
  for (size_t k = 0; k < world.node_sizes.size(); first += world.node_sizes[k++]) {
    if (static_cast<int>(k) == world.node_index) continue;
    const char* at = run->payload_in[k].data();
    for (int s = first; s < first + world.node_sizes[k]; ++s)
      for (int r = 0; r < run->local_size(); ++r) {
        uint64_t bytes = run->recv_counts[r][static_cast<size_t>(s)] * run->elem;
        copies.push_back({run->outputs[r] + run->recv_at[r][static_cast<size_t>(s)], at, bytes});
        at += bytes;
      }
  }
  trace_stage(run->trace, "unpack");
  run_host_copies(run->context.offload, std::move(copies), [run] { finish(*run, PX_OK, ""); });
}

void across_nodes(const std::shared_ptr<AlltoallRun>& run) {
  Job& job = *run->job;
  Variable& var = *run->var;
  if (var.poison_status != PX_OK) return finish(*run, var.poison_status, var.poison_message);
  if (!job.broken().empty())
    return finish(*run, PX_ERR_PEER_LOST, job.broken() + " (" + run->what() + ")");
  if (var.global_id == 0) {  // the nodes have not all registered the variable yet
    var.awaiting_global_id.push_back([run] { across_nodes(run); });
    return;
  }
  const JobWorld& world = job.world();
  PairwiseExchangeSpec spec;
  spec.peers.resize(static_cast<size_t>(world.node_count));
  for (size_t k = 0; k < spec.peers.size(); ++k) {
    if (static_cast<int>(k) == world.node_index) continue;
    ExchangeWithPeer& peer = spec.peers[k];
    peer.header = run->header_out[k].data();
    peer.header_bytes = run->header_out[k].size() * sizeof(uint64_t);
    peer.payload = run->payload_out[k].data();
    peer.payload_bytes = run->payload_out[k].size();
    peer.recv_header = run->header_in[k].data();
    peer.recv_header_bytes = run->header_in[k].size() * sizeof(uint64_t);
  }
  AlltoallRun* raw = run.get();  // the exchange's callbacks end before its done
  spec.receiver_payload = [raw](int k) { return receive_from(*raw, k); };
  spec.tag_base = make_tag(TagKind::kAlltoall, var.global_id, run->step);
  spec.priority = run->priority;
  spec.chunk_bytes = run->context.chunk_bytes;
  start_pairwise_exchange(*run->context.fabric, spec, [run](bool ok, const std::string& error) {
    run->context.offload.post()([run, ok, error] {
      Job& job = *run->job;
      if (!ok) {
        std::string why = !job.broken().empty() ? job.broken() : "across nodes: " + error;
        return finish(*run, PX_ERR_PEER_LOST, why + " (" + run->what() + ")");
      }
      if (!run->mismatch.empty())
        return finish(*run, PX_ERR_INVALID, run->mismatch + " (" + run->what() + ")");
      unpack(run);
    });
  });
}

}  // namespace

void run_alltoall_step(const StepContext& context, std::shared_ptr<Job> job, Variable& var,
                       uint64_t step, PendingStep pending) {
  PX_ASSERT_LOOP_THREAD();
  auto run = std::make_shared<AlltoallRun>(context);
  run->job = std::move(job);
  run->var = &var;
  run->step = step;
  run->priority = pending.priority;
  run->elem = dtype_size(var.fingerprint.dtype);
  trace_started(run->trace, run->job, var, "alltoall", step, pending.first_ns);
  size_t n = pending.by_rank.size();
  run->blocks.resize(n);
  run->send_counts.resize(n);
  run->recv_counts.resize(n);
  run->send_at.resize(n);
  run->recv_at.resize(n);
  for (auto& c : pending.by_rank) {
    run->workers.push_back(c->worker);
    run->request_ids.push_back(c->request_id);
    run->outputs.push_back(c->worker->arena().base() + c->out.offset);
  }
  std::string invalid = read_counts(*run, pending);
  if (!invalid.empty()) {
    std::string message = invalid + " (" + run->what() + ")";
    finish(*run, PX_ERR_INVALID, message);
    // The other nodes would wait for this node's blocks: the job ends on every node.
    return end_job_for_local_failure(context, *run->job, message);
  }
  const JobWorld& world = run->job->world();
  if (!context.fabric || world.node_count <= 1) {
    std::vector<HostCopy> copies;
    add_local_copies(*run, &copies);
    trace_stage(run->trace, "local_copy");
    return run_host_copies(run->context.offload, std::move(copies),
                           [run] { finish(*run, PX_OK, ""); });
  }
  trace_stage(run->trace, "pack");
  context.offload.run(
      true, [run] { pack(*run); },
      [run] {
        trace_stage(run->trace, "cross_node");
        across_nodes(run);
      });
}

}  // namespace px
