// libparallax: submitting operations (allreduce, the sparse row operations) with their
// per-operation options, and refusing memory the daemon cannot touch.
#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "clients/c/client_internal.h"
#include "clients/c/cuda_runtime.h"
#include "clients/c/requests_internal.h"

using px::fail;
using px::succeed;

namespace px {
namespace {

struct OpOptions {
  uint8_t priority = 0;
  int32_t root = 0;
  bool cuda = false;  // PX_MEMORY_CUDA
  int32_t device = -1;
  void* stream = nullptr;
};

// Reads the caller's options (any size from struct_size up to ours; missing fields keep
// their defaults) and refuses what this build cannot do.
px_status resolve_options(Client* c, const std::string& who, const px_op_options* in,
                          OpOptions* out) {
  px_op_options o;
  px_op_options_init(&o);
  if (in) {
    if (in->struct_size < sizeof(uint32_t) || in->struct_size > (1u << 16))
      return fail(c, PX_ERR_INVALID,
                  who + ": options->struct_size is not set (use px_op_options_init)");
    std::memcpy(&o, in, std::min<size_t>(in->struct_size, sizeof o));
  }
  if (o.memory_kind != PX_MEMORY_HOST && o.memory_kind != PX_MEMORY_CUDA)
    return fail(c, PX_ERR_INVALID, who + ": unknown memory_kind " + std::to_string(o.memory_kind));
  if (o.priority < 0 || o.priority > 255)
    return fail(c, PX_ERR_INVALID,
                who + ": priority " + std::to_string(o.priority) + " is not in 0..255");
  out->priority = static_cast<uint8_t>(o.priority);
  out->root = o.root;
  out->cuda = o.memory_kind == PX_MEMORY_CUDA;
  out->device = o.device;
  out->stream = o.stream;
  return PX_OK;
}

BufferRef host_buffer(uint64_t offset, uint64_t bytes) {
  return BufferRef{offset, bytes, static_cast<uint32_t>(MemoryKind::kHostArena), 0};
}

// Hands a prepared request to the daemon; on success *out_request names it.
px_status submit_request(const std::shared_ptr<Client>& client, const SubmitEntry& entry,
                         std::shared_ptr<Request> request, px_request** out_request) {
  Client* c = client.get();
  Request* r = request.get();
  r->step = entry.step;
  c->requests[r] = request;
  px_status status = submit(c, entry, r);
  if (status != PX_OK) {
    destroy_request(c, r);
    return status;
  }
  *out_request = add_request_handle(client, std::move(request));
  return succeed();
}

}  // namespace

px_status usable(Client* c) {
  if (c->closed) return fail(c, PX_ERR_CANCELLED, "the client was disconnected");
  if (c->lost_status != PX_OK) return fail(c, c->lost_status, c->lost_message);
  return PX_OK;
}

px_status check_in_flight(Client* c, const std::string& who) {
  size_t held = c->in_flight.size() + c->deferred_submits;
  if (held < c->submit_ring.capacity()) return PX_OK;
  return fail(c, PX_ERR_BUSY,
              who + ": " + std::to_string(held) +
                  " requests in flight, the most parallaxd allows; wait some first");
}

// A new request with staging_bytes of arena room for ordinary memory (none if 0).
px_status new_request(Client* c, const std::string& who, uint64_t staging_bytes,
                      std::shared_ptr<Request>* out) {
  auto request = std::make_shared<Request>();
  if (staging_bytes > 0) {
    auto staging = c->allocator.allocate(staging_bytes);
    if (!staging)
      return fail(c, PX_ERR_NO_MEMORY,
                  who + ": no room in the arena to stage " + std::to_string(staging_bytes) +
                      " bytes of ordinary memory (largest free block " +
                      std::to_string(c->allocator.largest_free_block()) +
                      "); use px_alloc buffers or a larger arena");
    request->has_staging = true;
    request->staging_offset = *staging;
  }
  request->client = c;
  request->id = c->next_request_id++;
  *out = std::move(request);
  return PX_OK;
}

px_status check_host_pointer(Client* c, const std::string& who, const void* p) {
  if (!is_cuda_device_pointer(p)) return PX_OK;
  return fail(c, PX_ERR_INVALID,
              who +
                  ": a CUDA device pointer where host memory is needed (pass host memory, "
                  "or px_alloc_ex device memory with PX_MEMORY_CUDA in the options)");
}

px_status submit(Client* c, const SubmitEntry& entry, Request* r) {
  if (!c->submit_ring.try_push(entry))
    return fail(c, PX_ERR_INTERNAL, "submission ring unexpectedly full");
  if (c->submit_ring.consumer_needs_wakeup()) c->submit_bell.ring();
  c->in_flight[r->id] = r;
  return PX_OK;
}

int make_completion_epoll(Client* c, std::string* error) {
  if (!Doorbell::create(&c->user_bell, error)) return -1;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    *error = std::string("epoll_create1: ") + strerror(errno);
    return -1;
  }
  int fds[3] = {c->completion_bell.fd(), c->user_bell.fd(), c->socket_fd};
  for (int fd : fds) {
    epoll_event ev{};
    ev.events = EPOLLIN | (fd == c->socket_fd ? uint32_t{EPOLLRDHUP} : 0u);
    ev.data.fd = fd;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
      *error = std::string("epoll_ctl: ") + strerror(errno);
      ::close(ep);
      return -1;
    }
  }
  return ep;
}

namespace {

// What every operation starts with: clears *out_request, finds the variable, names it.
px_status find_operand(px_var* handle, const char* fn, px_request** out_request, VarRef* ref,
                       std::string* who) {
  if (!out_request) return fail(PX_ERR_INVALID, std::string(fn) + ": out_request is NULL");
  *out_request = nullptr;
  if (!find_var(handle, ref)) return stale_handle(fn, "variable", handle);
  *who = std::string(fn) + "('" + ref->var->name + "')";
  return PX_OK;
}

// A variable with px_sparse_options.prefetch: owners serve pull step n+1's rows that no node
// pulled in step n before step n's push is applied, trusting that every worker's push step
// n has only rows of its own pull step n. Pulls record their rows (*pulled, kept by
// remember_pull once the step is taken); pushes are held to them. Changes nothing itself.
// (Caller holds c->mutex.)
constexpr size_t kPrefetchStepsKept = 16;  // pull steps ahead of their push remembered

px_status check_prefetch_promise(Client* c, const Var* var, const std::string& who, Opcode opcode,
                                 const int64_t* indices, uint64_t n, std::vector<int64_t>* pulled) {
  if (opcode == Opcode::kPullRows) {
    // A pull with a bad index fails whole at the daemon (none of its rows are asked for):
    // its push step may then push nothing.
    std::vector<int64_t> rows(indices, indices + n);
    if (std::any_of(rows.begin(), rows.end(), [var](int64_t row) {
          return row < 0 || static_cast<uint64_t>(row) >= var->count;
        }))
      rows.clear();
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    *pulled = std::move(rows);
    return PX_OK;
  }
  if (opcode != Opcode::kPushRows) return PX_OK;
  uint64_t step = var->next_push_step;
  auto it = var->pulled_rows.find(step);
  if (it == var->pulled_rows.end() && n > 0)
    return fail(c, PX_ERR_INVALID,
                who + ": push step " + std::to_string(step) + " of a variable with prefetch, but " +
                    (step >= var->next_pull_step
                         ? std::string("pull step ") + std::to_string(step) + " was not issued"
                         : std::string("its pull step is too far back")) +
                    "; a push step may only push rows its pull step pulled");
  for (uint64_t i = 0; i < n; ++i) {
    if (std::binary_search(it->second.begin(), it->second.end(), indices[i])) continue;
    return fail(c, PX_ERR_INVALID,
                who + ": row " + std::to_string(indices[i]) + " at position " + std::to_string(i) +
                    " of push step " + std::to_string(step) + " was not pulled in pull step " +
                    std::to_string(step) +
                    "; with prefetch a push step may only push rows its pull step pulled (the "
                    "next step's other rows may already have been served)");
  }
  return PX_OK;
}

// The step is taken (it is submitted or the job breaks): the promise's bookkeeping moves.
void remember_pull(Var* var, uint64_t step, std::vector<int64_t> rows) {
  var->pulled_rows[step] = std::move(rows);
  while (var->pulled_rows.size() > kPrefetchStepsKept)
    var->pulled_rows.erase(var->pulled_rows.begin());
}
void forget_pulls_through(Var* var, uint64_t step) {
  var->pulled_rows.erase(var->pulled_rows.begin(), var->pulled_rows.upper_bound(step));
}

// (1.12) Tables of a group: each of the n indices, table-local, as the group's row (a table's
// rows start at its row_offset), table_of(i) the table of index i. An index out of its
// table's range becomes -1, which the daemon refuses as for any variable (the step's
// semantics unchanged); *note then names the first one's table, for the request's message.
template <typename TableOf>
std::vector<int64_t> group_rows(const int64_t* indices, uint64_t n, TableOf table_of,
                                std::string* note) {
  std::vector<int64_t> rows(n);
  for (uint64_t i = 0; i < n; ++i) {
    const Var* table = table_of(i);
    int64_t index = indices[i];
    if (index >= 0 && static_cast<uint64_t>(index) < table->count) {
      rows[i] = static_cast<int64_t>(table->row_offset) + index;
      continue;
    }
    rows[i] = -1;
    if (note->empty())
      *note = "position " + std::to_string(i) + " is index " + std::to_string(index) +
              " of table '" + table->table + "', outside its " + std::to_string(table->count) +
              " rows";
  }
  return rows;
}

px_status submit_var_rows(const VarRef& ref, const std::string& who, Opcode opcode,
                          const int64_t* indices, uint64_t n, const void* rows_in, void* rows_out,
                          const px_op_options* options, std::string index_note,
                          px_request** out_request);

// Submits a sparse operation. rows is read (push, load) or written (pull, read). Buffers
// outside the arena, or misaligned, are staged through one arena block. A table of a group
// submits its group's operation, its indices translated.
px_status submit_rows(px_var* handle, Opcode opcode, const char* fn, const int64_t* indices,
                      uint64_t n, const void* rows_in, void* rows_out, const px_op_options* options,
                      px_request** out_request) {
  VarRef ref;
  std::string who;
  px_status status = find_operand(handle, fn, out_request, &ref, &who);
  if (status != PX_OK) return status;
  Client* c = ref.client.get();
  if (!ref.var->sparse) return fail(c, PX_ERR_INVALID, who + ": not a sparse variable");
  if (!ref.var->group)
    return submit_var_rows(ref, who, opcode, indices, n, rows_in, rows_out, options, "",
                           out_request);
  const Var* table = ref.var;
  who = std::string(fn) + "('" + table->name + "' table '" + table->table + "')";
  if (n > 0 && !indices) return fail(c, PX_ERR_INVALID, who + ": NULL buffer");
  if (n > (1ull << 40) / (table->dim * sizeof(float) + sizeof(int64_t)))
    return fail(c, PX_ERR_INVALID, who + ": " + std::to_string(n) + " rows is too many");
  OpOptions op;
  if ((status = resolve_options(c, who, options, &op)) != PX_OK) return status;
  if (op.cuda)
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who +
                    ": a table's indices are translated on the host, so a table of a group "
                    "takes host memory; for device memory use the group's variable with its "
                    "rows (px_register_sparse_group's out_group)");
  std::string note;
  std::vector<int64_t> rows = group_rows(
      indices, n, [table](uint64_t) { return table; }, &note);
  return submit_var_rows(VarRef{ref.client, table->group}, who, opcode, rows.data(), n, rows_in,
                         rows_out, options, std::move(note), out_request);
}

// (1.12) px_pull_rows_group, px_push_rows_group, px_prefetch_rows_group: one step of the
// tables' group over all their rows.
px_status submit_group_rows(px_var* const* tables, uint64_t n, const uint64_t* counts,
                            Opcode opcode, const char* fn, const int64_t* indices,
                            const void* rows_in, void* rows_out, const px_op_options* options,
                            px_request** out_request, bool prefetch = false) {
  if (!out_request) return fail(PX_ERR_INVALID, std::string(fn) + ": out_request is NULL");
  *out_request = nullptr;
  if (!tables || !counts || n == 0 || n > (1u << 20))
    return fail(PX_ERR_INVALID, std::string(fn) + ": needs 1 or more tables and their counts");
  std::vector<VarRef> refs(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (!find_var(tables[i], &refs[i])) return stale_handle(fn, "variable", tables[i]);
    const Var* table = refs[i].var;
    const Var* group = refs[0].var->group;
    if (!table->group || table->group != group || refs[i].client != refs[0].client)
      return fail(refs[i].client.get(), PX_ERR_INVALID,
                  std::string(fn) + ": tables[" + std::to_string(i) + "] ('" + table->name +
                      (table->group ? "' table '" + table->table + "'" : "'") +
                      ") is not a table of the group of tables[0] ('" + refs[0].var->name +
                      "'); the tables of one grouped step come from one "
                      "px_register_sparse_group");
  }
  Client* c = refs[0].client.get();
  const Var* group = refs[0].var->group;
  if (prefetch && !refs[0].var->prefetch)
    return fail(c, PX_ERR_INVALID,
                std::string(fn) + "('" + refs[0].var->name +
                    "'): the group was registered without px_sparse_options.prefetch");
  std::string who = std::string(fn) + "('" + group->name + "')";
  uint64_t total = 0;
  std::vector<uint64_t> table_end(n);  // the end of tables[i]'s indices
  for (uint64_t i = 0; i < n; ++i) {
    if (counts[i] > (1ull << 40) - total) return fail(c, PX_ERR_INVALID, who + ": too many rows");
    total += counts[i];
    table_end[i] = total;
  }
  if (total > 0 && !indices) return fail(c, PX_ERR_INVALID, who + ": NULL buffer");
  OpOptions op;
  px_status status = resolve_options(c, who, options, &op);
  if (status != PX_OK) return status;
  if (op.cuda)
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                who +
                    ": a grouped step translates its tables' indices on the host, so it "
                    "takes host memory; for device memory use the group's variable with its "
                    "rows (px_register_sparse_group's out_group)");
  std::string note;
  uint64_t at = 0;
  std::vector<int64_t> rows = group_rows(
      indices, total,
      [&](uint64_t i) {
        while (i >= table_end[at]) ++at;  // indices are visited in order
        return refs[at].var;
      },
      &note);
  return submit_var_rows(VarRef{refs[0].client, const_cast<Var*>(group)}, who, opcode, rows.data(),
                         total, rows_in, rows_out, options, std::move(note), out_request);
}

px_status submit_var_rows(const VarRef& ref, const std::string& who, Opcode opcode,
                          const int64_t* indices, uint64_t n, const void* rows_in, void* rows_out,
                          const px_op_options* options, std::string index_note,
                          px_request** out_request) {
  Client* c = ref.client.get();
  Var* var = ref.var;
  OpOptions op;
  px_status status = resolve_options(c, who, options, &op);
  if (status != PX_OK) return status;
  if (op.cuda && n > (1ull << 40) / (var->dim * sizeof(float) + sizeof(int64_t)))
    return fail(c, PX_ERR_INVALID, who + ": " + std::to_string(n) + " rows is too many");
  if (op.cuda)
    return submit_device_rows(ref, who, opcode, indices, n,
                              rows_out ? rows_out : const_cast<void*>(rows_in), op.device,
                              op.stream, op.priority, out_request);
  const void* rows = rows_out ? rows_out : rows_in;
  if (n > 0 && (!indices || !rows)) return fail(c, PX_ERR_INVALID, who + ": NULL buffer");
  if (n > (1ull << 40) / (var->dim * sizeof(float) + sizeof(int64_t)))
    return fail(c, PX_ERR_INVALID, who + ": " + std::to_string(n) + " rows is too many");
  if (n > 0 && ((status = check_host_pointer(c, who, indices)) != PX_OK ||
                (status = check_host_pointer(c, who, rows)) != PX_OK))
    return status;
  uint64_t index_bytes = n * sizeof(int64_t);
  uint64_t row_bytes = n * var->dim * sizeof(float);
  std::lock_guard<std::mutex> guard(c->mutex);
  if ((status = usable(c)) != PX_OK || (status = check_in_flight(c, who)) != PX_OK) return status;
  if (var->deferred_device_steps > 0)
    return fail(c, PX_ERR_INVALID,
                who + ": " + std::to_string(var->deferred_device_steps) +
                    " device steps of the variable are still queued on a CUDA stream; wait for "
                    "them before a step on host memory");
  std::vector<int64_t> pulled;  // prefetch: this pull's rows
  if (var->prefetch &&
      (status = check_prefetch_promise(c, var, who, opcode, indices, n, &pulled)) != PX_OK)
    return status;
  uint64_t index_offset = 0, row_offset = 0;
  bool index_in_arena = n == 0 || (arena_offset(c, indices, index_bytes, &index_offset) &&
                                   index_offset % alignof(int64_t) == 0);
  bool rows_in_arena =
      n == 0 || (arena_offset(c, rows, row_bytes, &row_offset) && row_offset % alignof(float) == 0);
  uint64_t staging_bytes =
      (index_in_arena ? 0 : align_up(index_bytes, 64)) + (rows_in_arena ? 0 : row_bytes);
  std::shared_ptr<Request> request;
  if ((status = new_request(c, who, staging_bytes, &request)) != PX_OK) return status;
  Request* r = request.get();
  r->daemon_writes_caller = rows_out && rows_in_arena && n > 0;
  r->index_note = std::move(index_note);
  if (staging_bytes > 0) {
    uint64_t at = r->staging_offset;
    if (!index_in_arena) {
      index_offset = at;
      std::memcpy(c->arena.base() + at, indices, index_bytes);
      at += align_up(index_bytes, 64);
    }
    if (!rows_in_arena) {
      row_offset = at;
      if (rows_in) {
        std::memcpy(c->arena.base() + at, rows_in, row_bytes);
      } else {
        r->copy_out_to = rows_out;
        r->copy_out_offset = at;
        r->bytes = row_bytes;
      }
    }
  }
  SubmitEntry entry{};
  entry.request_id = r->id;
  entry.var_id = var->id;
  entry.opcode = static_cast<uint16_t>(opcode);
  entry.priority = op.priority;
  switch (opcode) {
    case Opcode::kPullRows:
      entry.step = var->next_pull_step++;
      if (var->prefetch) remember_pull(var, entry.step, std::move(pulled));
      r->what = "pull";
      break;
    case Opcode::kPushRows:
      entry.step = var->next_push_step++;
      if (var->prefetch) forget_pulls_through(var, entry.step);
      r->what = "push";
      break;
    case Opcode::kLoadRows:
      r->what = "load";
      r->has_step = false;
      break;
    default:
      r->what = "read";
      r->has_step = false;
      break;
  }
  entry.in = host_buffer(index_offset, index_bytes);
  entry.out = host_buffer(row_offset, row_bytes);
  r->var = var;
  return submit_request(ref.client, entry, std::move(request), out_request);
}

// px_alltoall's counts: every one the variable's count (px_alltoallv with equal blocks).
const uint64_t kEveryCount[1] = {0};

// A dense operation as messages name it.
const char* dense_name(Opcode opcode) {
  switch (opcode) {
    case Opcode::kAllreduce:
      return "allreduce";
    case Opcode::kBroadcast:
      return "broadcast";
    case Opcode::kAllgather:
      return "allgather";
    case Opcode::kAllgatherv:
      return "allgatherv";
    case Opcode::kReduceScatter:
      return "reduce_scatter";
    case Opcode::kAlltoall:
      return "alltoall";
    default:
      return "operation";
  }
}

// The dense operations. Sizes: allreduce and broadcast read and write count elements;
// allgather reads count and writes world_size * count; allgatherv reads counts[rank] and
// writes their sum; reduce-scatter reads world_size * count and writes count; alltoall(v)
// reads the sum of counts (send counts) and writes the sum of recv_counts. Ordinary
// (non-arena) out memory is staged in the arena; ordinary input is copied to where the
// daemon reads it: into the output's place (allreduce, broadcast; the allgather's own slice),
// behind the counts it needs (allgatherv, alltoall), or a block of its own (reduce-scatter,
// whose input is larger than its output).
px_status submit_dense(px_var* handle, Opcode opcode, const char* fn, const void* in,
                       const uint64_t* counts, const uint64_t* recv_counts, void* out,
                       const px_op_options* options, px_request** out_request) {
  VarRef ref;
  std::string who;
  px_status status = find_operand(handle, fn, out_request, &ref, &who);
  if (status != PX_OK) return status;
  Client* c = ref.client.get();
  Var* var = ref.var;
  if (var->sparse)
    return fail(c, PX_ERR_INVALID, who + ": a sparse variable; use px_pull_rows and px_push_rows");
  OpOptions op;
  status = resolve_options(c, who, options, &op);
  if (status != PX_OK) return status;
  if (op.cuda) {
    if (opcode == Opcode::kBroadcast)
      return submit_device_broadcast(ref, who, in, out, op.root, op.device, op.stream, op.priority,
                                     out_request);
    if (opcode == Opcode::kAllgather)
      return submit_device_allgather(ref, who, in, out, op.device, op.stream, op.priority,
                                     out_request);
    if (opcode != Opcode::kAllreduce)
      return fail(c, PX_ERR_NOT_IMPLEMENTED,
                  who +
                      ": PX_MEMORY_CUDA is taken by px_allreduce_ex, px_broadcast_ex, "
                      "px_allgather_ex and sparse pull and push steps only so far (README, "
                      "Limits)");
    return submit_device_allreduce(ref, who, in, out, op.device, op.stream, op.priority,
                                   out_request);
  }
  const px_world_info& w = c->world;
  bool root = opcode == Opcode::kBroadcast && op.root == w.rank;
  if (opcode == Opcode::kBroadcast && (op.root < 0 || op.root >= w.world_size))
    return fail(c, PX_ERR_INVALID,
                who + ": root " + std::to_string(op.root) + " is not a rank of the job (0.." +
                    std::to_string(w.world_size - 1) + ")");
  bool reads_in = opcode != Opcode::kBroadcast || root;
  uint64_t elem = dtype_size(var->dtype);
  uint64_t in_bytes = var->bytes, out_bytes = var->bytes, header_bytes = 0;
  uint64_t world = static_cast<uint64_t>(w.world_size);
  if (opcode == Opcode::kAllgather) out_bytes = var->bytes * world;
  if (opcode == Opcode::kReduceScatter) in_bytes = var->bytes * world;
  std::vector<uint64_t> alltoall_header;  // send counts, then recv counts
  std::vector<uint64_t> every_count;
  if (opcode == Opcode::kAlltoall && counts == kEveryCount) {
    every_count.assign(world, var->count);
    counts = recv_counts = every_count.data();
  }
  if (opcode == Opcode::kAlltoall) {
    if (!counts || !recv_counts) return fail(c, PX_ERR_INVALID, who + ": counts are NULL");
    uint64_t sent = 0, received = 0;
    for (uint64_t k = 0; k < world; ++k) {
      if (counts[k] > var->count || recv_counts[k] > var->count)
        return fail(c, PX_ERR_INVALID,
                    who + ": " + (counts[k] > var->count ? "send_counts[" : "recv_counts[") +
                        std::to_string(k) +
                        "] = " + std::to_string(std::max(counts[k], recv_counts[k])) +
                        " is above the variable's count " + std::to_string(var->count));
      sent += counts[k];
      received += recv_counts[k];
    }
    alltoall_header.assign(counts, counts + world);
    alltoall_header.insert(alltoall_header.end(), recv_counts, recv_counts + world);
    in_bytes = sent * elem;
    out_bytes = received * elem;
    header_bytes = 2 * world * sizeof(uint64_t);
  }
  if (opcode == Opcode::kAllgatherv) {
    if (!counts) return fail(c, PX_ERR_INVALID, who + ": counts is NULL");
    uint64_t total = 0;
    for (uint64_t k = 0; k < world; ++k) {
      if (counts[k] > var->count)
        return fail(c, PX_ERR_INVALID,
                    who + ": counts[" + std::to_string(k) + "] = " + std::to_string(counts[k]) +
                        " is above the variable's count " + std::to_string(var->count));
      total += counts[k];
    }
    in_bytes = counts[w.rank] * elem;
    out_bytes = total * elem;
    header_bytes = world * sizeof(uint64_t);
  }
  if (!out || (reads_in && in_bytes > 0 && !in))
    return fail(c, PX_ERR_INVALID, who + ": NULL buffer");
  if (reads_in && in_bytes > 0 && (status = check_host_pointer(c, who, in)) != PX_OK) return status;
  if ((status = check_host_pointer(c, who, out)) != PX_OK) return status;
  const char* ip = static_cast<const char*>(in);
  const char* op_ = static_cast<const char*>(out);
  bool in_place_allowed = opcode == Opcode::kAllreduce || opcode == Opcode::kBroadcast;
  bool same = ip == op_ && in_place_allowed;
  if (reads_in && !same && ip < op_ + out_bytes && op_ < ip + in_bytes)
    return fail(c, PX_ERR_INVALID, who + ": in and out overlap without being equal");
  std::lock_guard<std::mutex> guard(c->mutex);
  if ((status = usable(c)) != PX_OK || (status = check_in_flight(c, who)) != PX_OK) return status;
  if (var->deferred_device_steps > 0)
    return fail(c, PX_ERR_INVALID,
                who + ": " + std::to_string(var->deferred_device_steps) +
                    " device steps of the variable are still queued on a CUDA stream; wait for "
                    "them before a step on host memory");
  uint64_t in_offset = 0, out_offset = 0;
  bool in_arena = reads_in && header_bytes == 0 && arena_offset(c, in, in_bytes, &in_offset);
  bool out_arena = arena_offset(c, out, out_bytes, &out_offset);
  // Staged apart from the output: behind its counts, or (reduce-scatter) too large for it.
  bool stage_apart = header_bytes > 0 || (opcode == Opcode::kReduceScatter && !in_arena);
  uint64_t staged_in = stage_apart ? align_up(header_bytes + in_bytes, 64) : 0;
  uint64_t staging_bytes = (out_arena ? 0 : out_bytes) + staged_in;
  std::shared_ptr<Request> request;
  if ((status = new_request(c, who, staging_bytes, &request)) != PX_OK) return status;
  Request* r = request.get();
  r->bytes = out_bytes;
  r->daemon_writes_caller = out_arena;
  if (staging_bytes > 0) {
    uint64_t at = r->staging_offset;
    if (staged_in > 0) {  // the counts (allgatherv, alltoall), then this worker's data
      const void* header = opcode == Opcode::kAlltoall
                               ? static_cast<const void*>(alltoall_header.data())
                               : static_cast<const void*>(counts);
      if (header_bytes > 0) std::memcpy(c->arena.base() + at, header, header_bytes);
      if (in_bytes > 0) std::memcpy(c->arena.base() + at + header_bytes, in, in_bytes);
      in_offset = at;
      in_arena = true;
      in_bytes += header_bytes;
      at += staged_in;
    }
    if (!out_arena) {
      out_offset = at;
      r->copy_out_offset = out_offset;
      r->copy_out_to = out;
    }
  }
  if (!reads_in) {
    in_offset = out_offset;  // not read: name the output, which is in the arena
    in_bytes = out_bytes;
  } else if (!in_arena) {
    // Ordinary input: copy it where the result goes and let the daemon work in place.
    uint64_t at = out_offset + (opcode == Opcode::kAllgather ? in_bytes * w.rank : 0);
    std::memcpy(c->arena.base() + at, in, in_bytes);
    in_offset = at;
  }
  SubmitEntry entry{};
  entry.request_id = r->id;
  entry.step = opcode == Opcode::kAllreduce ? var->next_step++ : var->next_steps[opcode]++;
  entry.var_id = var->id;
  entry.opcode = static_cast<uint16_t>(opcode);
  entry.priority = op.priority;
  entry.root = static_cast<uint32_t>(op.root);
  entry.in = host_buffer(in_offset, in_bytes);
  entry.out = host_buffer(out_offset, out_bytes);
  r->var = var;
  r->what = dense_name(opcode);
  return submit_request(ref.client, entry, std::move(request), out_request);
}

}  // namespace
}  // namespace px

extern "C" {

PX_API void px_op_options_init(px_op_options* options) {
  if (!options) return;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->memory_kind = PX_MEMORY_HOST;
  options->device = -1;
}

PX_API px_status px_allreduce_ex(px_var* var, const void* in, void* out,
                                 const px_op_options* options, px_request** out_request) {
  return px::submit_dense(var, px::Opcode::kAllreduce, "px_allreduce", in, nullptr, nullptr, out,
                          options, out_request);
}

PX_API px_status px_broadcast_ex(px_var* var, const void* in, void* out,
                                 const px_op_options* options, px_request** out_request) {
  return px::submit_dense(var, px::Opcode::kBroadcast, "px_broadcast", in, nullptr, nullptr, out,
                          options, out_request);
}

PX_API px_status px_broadcast(px_var* var, const void* in, void* out, px_request** out_request) {
  return px_broadcast_ex(var, in, out, nullptr, out_request);
}

PX_API px_status px_allgather_ex(px_var* var, const void* in, void* out,
                                 const px_op_options* options, px_request** out_request) {
  return px::submit_dense(var, px::Opcode::kAllgather, "px_allgather", in, nullptr, nullptr, out,
                          options, out_request);
}

PX_API px_status px_allgather(px_var* var, const void* in, void* out, px_request** out_request) {
  return px_allgather_ex(var, in, out, nullptr, out_request);
}

PX_API px_status px_allgatherv_ex(px_var* var, const void* in, const uint64_t* counts, void* out,
                                  const px_op_options* options, px_request** out_request) {
  return px::submit_dense(var, px::Opcode::kAllgatherv, "px_allgatherv", in, counts, nullptr, out,
                          options, out_request);
}

PX_API px_status px_allgatherv(px_var* var, const void* in, const uint64_t* counts, void* out,
                               px_request** out_request) {
  return px_allgatherv_ex(var, in, counts, out, nullptr, out_request);
}

PX_API px_status px_allreduce(px_var* var, const void* in, void* out, px_request** out_request) {
  return px_allreduce_ex(var, in, out, nullptr, out_request);
}

PX_API px_status px_reduce_scatter_ex(px_var* var, const void* in, void* out,
                                      const px_op_options* options, px_request** out_request) {
  return px::submit_dense(var, px::Opcode::kReduceScatter, "px_reduce_scatter", in, nullptr,
                          nullptr, out, options, out_request);
}

PX_API px_status px_reduce_scatter(px_var* var, const void* in, void* out,
                                   px_request** out_request) {
  return px_reduce_scatter_ex(var, in, out, nullptr, out_request);
}

PX_API px_status px_alltoallv_ex(px_var* var, const void* in, const uint64_t* send_counts,
                                 void* out, const uint64_t* recv_counts,
                                 const px_op_options* options, px_request** out_request) {
  return px::submit_dense(var, px::Opcode::kAlltoall, "px_alltoallv", in, send_counts, recv_counts,
                          out, options, out_request);
}

PX_API px_status px_alltoallv(px_var* var, const void* in, const uint64_t* send_counts, void* out,
                              const uint64_t* recv_counts, px_request** out_request) {
  return px_alltoallv_ex(var, in, send_counts, out, recv_counts, nullptr, out_request);
}

PX_API px_status px_alltoall_ex(px_var* var, const void* in, void* out,
                                const px_op_options* options, px_request** out_request) {
  return px::submit_dense(var, px::Opcode::kAlltoall, "px_alltoall", in, px::kEveryCount,
                          px::kEveryCount, out, options, out_request);
}

PX_API px_status px_alltoall(px_var* var, const void* in, void* out, px_request** out_request) {
  return px_alltoall_ex(var, in, out, nullptr, out_request);
}

#define PX_ROW_OP(fn, opcode, in_arg, out_arg, buffer_decl)                                    \
  PX_API px_status fn##_ex(px_var* var, const int64_t* indices, uint64_t n, buffer_decl,       \
                           const px_op_options* options, px_request** out_request) {           \
    return px::submit_rows(var, px::Opcode::opcode, #fn, indices, n, in_arg, out_arg, options, \
                           out_request);                                                       \
  }                                                                                            \
  PX_API px_status fn(px_var* var, const int64_t* indices, uint64_t n, buffer_decl,            \
                      px_request** out_request) {                                              \
    return fn##_ex(var, indices, n, buffer, nullptr, out_request);                             \
  }

PX_ROW_OP(px_pull_rows, kPullRows, nullptr, buffer, void* buffer)
PX_ROW_OP(px_push_rows, kPushRows, buffer, nullptr, const void* buffer)
PX_ROW_OP(px_load_rows, kLoadRows, buffer, nullptr, const void* buffer)
PX_ROW_OP(px_read_rows, kReadRows, nullptr, buffer, void* buffer)
#undef PX_ROW_OP

PX_API px_status px_prefetch_rows_ex(px_var* var, const int64_t* indices, uint64_t n,
                                     void* out_rows, const px_op_options* options,
                                     px_request** out_request) {
  px::VarRef ref;
  if (out_request && px::find_var(var, &ref) && ref.var->sparse && !ref.var->prefetch) {
    *out_request = nullptr;
    return px::fail(ref.client.get(), PX_ERR_INVALID,
                    "px_prefetch_rows('" + ref.var->name +
                        "'): the variable was registered without px_sparse_options.prefetch");
  }
  return px::submit_rows(var, px::Opcode::kPullRows, "px_prefetch_rows", indices, n, nullptr,
                         out_rows, options, out_request);
}

PX_API px_status px_prefetch_rows(px_var* var, const int64_t* indices, uint64_t n, void* out_rows,
                                  px_request** out_request) {
  return px_prefetch_rows_ex(var, indices, n, out_rows, nullptr, out_request);
}

PX_API px_status px_pull_rows_group(px_var* const* tables, uint64_t n, const uint64_t* counts,
                                    const int64_t* indices, void* out_rows,
                                    const px_op_options* options, px_request** out_request) {
  return px::submit_group_rows(tables, n, counts, px::Opcode::kPullRows, "px_pull_rows_group",
                               indices, nullptr, out_rows, options, out_request);
}

PX_API px_status px_prefetch_rows_group(px_var* const* tables, uint64_t n, const uint64_t* counts,
                                        const int64_t* indices, void* out_rows,
                                        const px_op_options* options, px_request** out_request) {
  return px::submit_group_rows(tables, n, counts, px::Opcode::kPullRows, "px_prefetch_rows_group",
                               indices, nullptr, out_rows, options, out_request, true);
}

PX_API px_status px_push_rows_group(px_var* const* tables, uint64_t n, const uint64_t* counts,
                                    const int64_t* indices, const void* grads,
                                    const px_op_options* options, px_request** out_request) {
  return px::submit_group_rows(tables, n, counts, px::Opcode::kPushRows, "px_push_rows_group",
                               indices, grads, nullptr, options, out_request);
}

}  // extern "C"
