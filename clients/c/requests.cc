// libparallax: submitting operations and waiting for their completions.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "clients/c/client_internal.h"

using px::fail;
using px::succeed;

std::string px_request::describe() const {
  if (!var) return "barrier " + std::to_string(step);
  return std::string(what) + " of '" + var->name + "'" +
         (has_step ? " step " + std::to_string(step) : "");
}

namespace px {
namespace {

void release_staging(px_client* c, px_request* r) {
  if (r->has_staging) c->allocator.release(r->staging_offset);
  r->has_staging = false;
}

void destroy_request(px_client* c, px_request* r) {
  release_staging(c, r);
  c->in_flight.erase(r->id);
  c->requests.erase(r);
}

void finish_request(px_client* c, px_request* r, px_status status, std::string message) {
  r->done = true;
  r->status = status;
  r->message = std::move(message);
  c->in_flight.erase(r->id);
  if (r->orphaned) destroy_request(c, r);
}

// The daemon went away: every outstanding request fails with the same message.
void mark_lost(px_client* c, const std::string& why) {
  if (c->lost_status != PX_OK) return;
  c->lost_status = PX_ERR_PEER_LOST;
  c->lost_message = why;
  std::vector<px_request*> pending;
  for (auto& [id, r] : c->in_flight) pending.push_back(r);
  for (px_request* r : pending)
    finish_request(c, r, PX_ERR_PEER_LOST, why + " before " + r->describe() + " completed");
}

// Waits for the daemon to complete something (or the deadline). One thread polls the
// doorbell; the others sleep on the condition variable until it has drained.
// Returns false when the deadline passed.
bool wait_for_completions(px_client* c, std::unique_lock<std::mutex>& lock, int64_t deadline_ns) {
  if (deadline_ns >= 0 && monotonic_ns() >= deadline_ns) return false;
  if (c->poller_active) {
    if (deadline_ns < 0) {
      c->completions_changed.wait(lock);
    } else {
      auto left = std::chrono::nanoseconds(deadline_ns - monotonic_ns());
      c->completions_changed.wait_for(lock, left);
    }
    return true;
  }
  c->poller_active = true;
  if (c->completion_ring.arm_and_check_empty()) {
    lock.unlock();
    pollfd fds[2] = {{c->completion_bell.fd(), POLLIN, 0}, {c->socket_fd, POLLIN, 0}};
    int64_t left_ms = deadline_ns < 0
                          ? -1
                          : std::max<int64_t>(0, (deadline_ns - monotonic_ns() + 999999) / 1000000);
    int r = poll(fds, 2, static_cast<int>(std::min<int64_t>(left_ms, 0x7fffffff)));
    lock.lock();
    if (r > 0 && (fds[0].revents & POLLIN)) c->completion_bell.drain();
    if (r > 0 && fds[1].revents) {
      // The daemon sends nothing unsolicited: a readable socket outside a control call is
      // end-of-file, i.e. parallaxd exited or dropped us.
      char byte;
      ssize_t n = recv(c->socket_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        mark_lost(c, "parallaxd at " + c->socket_path + " closed the connection");
    }
  }
  c->poller_active = false;
  drain_completions(c);
  c->completions_changed.notify_all();
  return true;
}

px_status request_result(px_request* r) {
  if (r->status == PX_OK) return succeed();
  return fail(r->status, r->message);
}

// After completion: copy a staged result to the caller's ordinary memory (once).
px_status deliver(px_client* c, std::unique_lock<std::mutex>& lock, px_request* r) {
  if (r->status == PX_OK && r->copy_out_to && !r->copied_out) {
    r->copied_out = true;
    const char* src = c->arena.base() + r->copy_out_offset;
    lock.unlock();  // the staging buffer belongs to this request; nobody else touches it
    std::memcpy(r->copy_out_to, src, r->bytes);
    lock.lock();
  }
  return request_result(r);
}

px_status submit(px_client* c, const SubmitEntry& entry, px_request* r) {
  if (!c->submit_ring.try_push(entry))
    return fail(PX_ERR_INTERNAL, "submission ring unexpectedly full");
  if (c->submit_ring.consumer_needs_wakeup()) c->submit_bell.ring();
  c->in_flight[r->id] = r;
  return PX_OK;
}

BufferRef host_buffer(uint64_t offset, uint64_t bytes) {
  return BufferRef{offset, bytes, static_cast<uint32_t>(MemoryKind::kHostArena), -1};
}

// Hands a prepared request to the daemon; on success *out_request owns it.
px_status submit_request(px_client* c, const SubmitEntry& entry,
                         std::unique_ptr<px_request> request, px_request** out_request) {
  px_request* r = request.get();
  r->step = entry.step;
  c->requests[r] = std::move(request);
  px_status status = submit(c, entry, r);
  if (status != PX_OK) {
    destroy_request(c, r);
    return status;
  }
  *out_request = r;
  return succeed();
}

int64_t deadline_after(int64_t timeout_ms) {
  return timeout_ms < 0 ? -1 : monotonic_ns() + timeout_ms * 1000000;
}

px_status wait_locked(px_client* c, std::unique_lock<std::mutex>& lock, px_request* r,
                      int64_t deadline_ns, int64_t timeout_ms) {
  for (;;) {
    drain_completions(c);
    if (r->done) return deliver(c, lock, r);
    if (c->lost_status != PX_OK) mark_lost(c, c->lost_message);
    if (!wait_for_completions(c, lock, deadline_ns))
      return fail(PX_ERR_TIMEOUT, r->describe() + " did not complete within " +
                                      std::to_string(timeout_ms) + " ms (worker local rank " +
                                      std::to_string(c->world.local_rank) + " of job '" + c->job +
                                      "')");
  }
}

}  // namespace

void drain_completions(px_client* c) {
  CompletionEntry entry;
  while (c->completion_ring.try_pop(&entry)) {
    auto it = c->in_flight.find(entry.request_id);
    if (it == c->in_flight.end()) continue;  // not ours: ignore rather than trust it
    entry.message[kCompletionMessageBytes - 1] = '\0';
    finish_request(c, it->second, static_cast<px_status>(entry.status),
                   entry.status == PX_OK ? std::string() : std::string(entry.message));
  }
}

}  // namespace px

extern "C" {

PX_API px_status px_allreduce(px_var* var, const void* in, void* out, px_request** out_request) {
  using namespace px;
  if (!out_request) return fail(PX_ERR_INVALID, "px_allreduce: out_request is NULL");
  *out_request = nullptr;
  if (!var || !in || !out) return fail(PX_ERR_INVALID, "px_allreduce: NULL argument");
  if (var->sparse)
    return fail(PX_ERR_INVALID, "px_allreduce('" + var->name +
                                    "'): a sparse variable; use px_pull_rows and px_push_rows");
  px_client* c = var->client;
  uint64_t bytes = var->bytes;
  const char* ip = static_cast<const char*>(in);
  const char* op = static_cast<const char*>(out);
  if (ip != op && ip < op + bytes && op < ip + bytes)
    return fail(PX_ERR_INVALID,
                "px_allreduce('" + var->name + "'): in and out overlap without being equal");
  std::lock_guard<std::mutex> guard(c->mutex);
  if (c->lost_status != PX_OK) return fail(c->lost_status, c->lost_message);
  if (c->in_flight.size() >= c->submit_ring.capacity())
    return fail(PX_ERR_BUSY, "px_allreduce('" + var->name +
                                 "'): " + std::to_string(c->in_flight.size()) +
                                 " requests in flight, the most parallaxd allows; wait some first");
  auto request = std::make_unique<px_request>();
  px_request* r = request.get();
  r->client = c;
  r->id = c->next_request_id++;
  r->bytes = bytes;
  uint64_t in_offset = 0, out_offset = 0;
  bool in_arena = arena_offset(c, in, bytes, &in_offset);
  bool out_arena = arena_offset(c, out, bytes, &out_offset);
  if (!out_arena) {
    auto staging = c->allocator.allocate(bytes);
    if (!staging)
      return fail(PX_ERR_NO_MEMORY,
                  "px_allreduce('" + var->name + "'): no room in the arena to stage " +
                      std::to_string(bytes) + " bytes of ordinary memory (largest free block " +
                      std::to_string(c->allocator.largest_free_block()) +
                      "); use px_alloc buffers or a larger arena");
    r->has_staging = true;
    r->staging_offset = out_offset = *staging;
    r->copy_out_offset = out_offset;
    r->copy_out_to = out;
  }
  if (!in_arena) {
    // Ordinary input: copy it straight into the (arena) output and reduce in place.
    std::memcpy(c->arena.base() + out_offset, in, bytes);
    in_offset = out_offset;
  }
  SubmitEntry entry{};
  entry.request_id = r->id;
  entry.step = var->next_step++;
  entry.var_id = var->id;
  entry.opcode = static_cast<uint16_t>(Opcode::kAllreduce);
  entry.in = host_buffer(in_offset, bytes);
  entry.out = host_buffer(out_offset, bytes);
  r->var = var;
  return submit_request(c, entry, std::move(request), out_request);
}

PX_API px_status px_wait(px_request* request, int64_t timeout_ms) {
  using namespace px;
  if (!request) return fail(PX_ERR_INVALID, "px_wait: NULL request");
  px_client* c = request->client;
  std::unique_lock<std::mutex> lock(c->mutex);
  return wait_locked(c, lock, request, deadline_after(timeout_ms), timeout_ms);
}

PX_API px_status px_test(px_request* request, int32_t* out_done) {
  using namespace px;
  if (!request || !out_done) return fail(PX_ERR_INVALID, "px_test: NULL argument");
  px_client* c = request->client;
  std::unique_lock<std::mutex> lock(c->mutex);
  drain_completions(c);
  *out_done = request->done ? 1 : 0;
  if (!request->done) return succeed();
  return deliver(c, lock, request);
}

PX_API px_status px_wait_all(px_request* const* requests, uint64_t n, int64_t timeout_ms) {
  using namespace px;
  if (n > 0 && !requests) return fail(PX_ERR_INVALID, "px_wait_all: NULL requests");
  int64_t deadline = deadline_after(timeout_ms);
  px_status first = PX_OK;
  std::string first_message;
  for (uint64_t i = 0; i < n; ++i) {
    if (!requests[i])
      return fail(PX_ERR_INVALID, "px_wait_all: request " + std::to_string(i) + " is NULL");
    px_client* c = requests[i]->client;
    std::unique_lock<std::mutex> lock(c->mutex);
    px_status s = wait_locked(c, lock, requests[i], deadline, timeout_ms);
    if (s != PX_OK && first == PX_OK) {
      first = s;
      first_message = px_last_error();
    }
  }
  return first == PX_OK ? succeed() : fail(first, first_message);
}

PX_API px_status px_request_free(px_request* request) {
  if (!request) return succeed();
  px_client* c = request->client;
  std::lock_guard<std::mutex> lock(c->mutex);
  if (request->done) {
    px::destroy_request(c, request);
  } else {
    request->orphaned = true;  // destroyed when its completion arrives
  }
  return succeed();
}

PX_API px_status px_barrier(px_client* client, int64_t timeout_ms) {
  using namespace px;
  if (!client) return fail(PX_ERR_INVALID, "px_barrier: NULL client");
  std::unique_lock<std::mutex> lock(client->mutex);
  if (client->lost_status != PX_OK) return fail(client->lost_status, client->lost_message);
  if (client->in_flight.size() >= client->submit_ring.capacity())
    return fail(PX_ERR_BUSY, "px_barrier: too many requests in flight");
  auto request = std::make_unique<px_request>();
  px_request* r = request.get();
  r->client = client;
  r->id = client->next_request_id++;
  SubmitEntry entry{};
  entry.request_id = r->id;
  entry.step = client->barrier_step++;
  entry.var_id = 0;
  entry.opcode = static_cast<uint16_t>(Opcode::kBarrier);
  entry.in.device = entry.out.device = -1;
  r->step = entry.step;
  client->requests[r] = std::move(request);
  px_status status = submit(client, entry, r);
  if (status == PX_OK)
    status = wait_locked(client, lock, r, deadline_after(timeout_ms), timeout_ms);
  std::string message = px_last_error();
  if (r->done) {
    destroy_request(client, r);
  } else {
    r->orphaned = true;
  }
  return status == PX_OK ? succeed() : fail(status, message);
}

}  // extern "C"

namespace px {
namespace {

// Submits a sparse operation. rows is read (push, load) or written (pull, read). Buffers
// outside the arena, or misaligned, are staged through one arena block.
px_status submit_rows(px_var* var, Opcode opcode, const char* fn, const int64_t* indices,
                      uint64_t n, const void* rows_in, void* rows_out, px_request** out_request) {
  if (!out_request) return fail(PX_ERR_INVALID, std::string(fn) + ": out_request is NULL");
  *out_request = nullptr;
  if (!var) return fail(PX_ERR_INVALID, std::string(fn) + ": var is NULL");
  std::string who = std::string(fn) + "('" + var->name + "')";
  if (!var->sparse) return fail(PX_ERR_INVALID, who + ": not a sparse variable");
  const void* rows = rows_out ? rows_out : rows_in;
  if (n > 0 && (!indices || !rows)) return fail(PX_ERR_INVALID, who + ": NULL buffer");
  if (n > (1ull << 40) / (var->dim * sizeof(float) + sizeof(int64_t)))
    return fail(PX_ERR_INVALID, who + ": " + std::to_string(n) + " rows is too many");
  uint64_t index_bytes = n * sizeof(int64_t);
  uint64_t row_bytes = n * var->dim * sizeof(float);
  px_client* c = var->client;
  std::lock_guard<std::mutex> guard(c->mutex);
  if (c->lost_status != PX_OK) return fail(c->lost_status, c->lost_message);
  if (c->in_flight.size() >= c->submit_ring.capacity())
    return fail(PX_ERR_BUSY, who + ": " + std::to_string(c->in_flight.size()) +
                                 " requests in flight, the most parallaxd allows; wait some first");
  uint64_t index_offset = 0, row_offset = 0;
  bool index_in_arena = n == 0 || (arena_offset(c, indices, index_bytes, &index_offset) &&
                                   index_offset % alignof(int64_t) == 0);
  bool rows_in_arena =
      n == 0 || (arena_offset(c, rows, row_bytes, &row_offset) && row_offset % alignof(float) == 0);
  auto request = std::make_unique<px_request>();
  px_request* r = request.get();
  r->client = c;
  r->id = c->next_request_id++;
  uint64_t staging_bytes =
      (index_in_arena ? 0 : align_up(index_bytes, 64)) + (rows_in_arena ? 0 : row_bytes);
  if (staging_bytes > 0) {
    auto staging = c->allocator.allocate(staging_bytes);
    if (!staging)
      return fail(PX_ERR_NO_MEMORY, who + ": no room in the arena to stage " +
                                        std::to_string(staging_bytes) +
                                        " bytes of ordinary memory (largest free block " +
                                        std::to_string(c->allocator.largest_free_block()) +
                                        "); use px_alloc buffers or a larger arena");
    r->has_staging = true;
    r->staging_offset = *staging;
    uint64_t at = *staging;
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
  switch (opcode) {
    case Opcode::kPullRows:
      entry.step = var->next_pull_step++;
      r->what = "pull";
      break;
    case Opcode::kPushRows:
      entry.step = var->next_push_step++;
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
  return submit_request(c, entry, std::move(request), out_request);
}

}  // namespace
}  // namespace px

extern "C" {

PX_API px_status px_pull_rows(px_var* var, const int64_t* indices, uint64_t n, void* out_rows,
                              px_request** out_request) {
  return px::submit_rows(var, px::Opcode::kPullRows, "px_pull_rows", indices, n, nullptr, out_rows,
                         out_request);
}

PX_API px_status px_push_rows(px_var* var, const int64_t* indices, uint64_t n, const void* grads,
                              px_request** out_request) {
  return px::submit_rows(var, px::Opcode::kPushRows, "px_push_rows", indices, n, grads, nullptr,
                         out_request);
}

PX_API px_status px_load_rows(px_var* var, const int64_t* indices, uint64_t n, const void* rows,
                              px_request** out_request) {
  return px::submit_rows(var, px::Opcode::kLoadRows, "px_load_rows", indices, n, rows, nullptr,
                         out_request);
}

PX_API px_status px_read_rows(px_var* var, const int64_t* indices, uint64_t n, void* out_rows,
                              px_request** out_request) {
  return px::submit_rows(var, px::Opcode::kReadRows, "px_read_rows", indices, n, nullptr, out_rows,
                         out_request);
}

}  // extern "C"
