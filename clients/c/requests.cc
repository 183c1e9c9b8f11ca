// libparallax: waiting for completions, and the life of a request (wait, test, cancel,
// free, its message). Submitting operations is in operations.cc.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "clients/c/client_internal.h"
#include "clients/c/requests_internal.h"

using px::fail;
using px::succeed;

std::string px::Request::describe() const {
  if (!var) return "barrier " + std::to_string(step);
  return std::string(what) + " of '" + var->name + "'" +
         (has_step ? " step " + std::to_string(step) : "");
}

namespace px {

void release_staging(Client* c, Request* r) {
  if (r->has_staging) c->allocator.release(r->staging_offset);
  r->has_staging = false;
}

void destroy_request(Client* c, Request* r) {
  release_staging(c, r);
  c->in_flight.erase(r->id);
  c->requests.erase(r);  // may destroy r: last
}

void finish_request(Client* c, Request* r, px_status status, std::string message,
                    bool message_on_daemon) {
  r->daemon_done = true;
  r->done = !r->copy_back_pending;  // else copy_back_done() ends it (device_operations.cc)
  c->in_flight.erase(r->id);
  if (!r->copy_back_error.empty() && status == PX_OK) {
    status = PX_ERR_INTERNAL;
    message = r->copy_back_error;
  }
  if (!r->cancelled) {  // a cancelled request keeps the status px_request_cancel gave it
    r->status = status;
    r->message = std::move(message);
    r->message_on_daemon = message_on_daemon;
  }
  if (r->freed && r->done) destroy_request(c, r);
}

namespace {

// Completions for a px_client_fd loop that another thread consumed: ring the loop's bell.
void tell_loop(Client* c, size_t completed, bool from_progress) {
  if (completed > 0 && c->epoll_fd >= 0 && !from_progress) c->user_bell.ring();
}

}  // namespace

// The daemon went away: every outstanding request fails with the same message.
void mark_lost(Client* c, const std::string& why) {
  if (c->lost_status != PX_OK) return;
  c->lost_status = PX_ERR_PEER_LOST;
  c->lost_message = why;
  std::vector<Request*> pending;
  for (auto& [id, r] : c->in_flight) pending.push_back(r);
  for (Request* r : pending)
    finish_request(c, r, PX_ERR_PEER_LOST, why + " before " + r->describe() + " completed", false);
  tell_loop(c, pending.size(), false);
  c->changed.notify_all();
}

size_t drain_completions(Client* c, bool from_progress) {
  CompletionEntry entry;
  size_t completed = 0;
  while (c->completion_ring.try_pop(&entry)) {
    auto it = c->in_flight.find(entry.request_id);
    if (it == c->in_flight.end()) continue;  // not ours: ignore rather than trust it
    entry.message[kCompletionMessageBytes - 1] = '\0';
    bool failed = entry.status != PX_OK;
    std::string message = failed ? std::string(entry.message) : std::string();
    if (failed && message.empty())  // parallaxd always names what failed
      message = it->second->describe() + " failed with " +
                px_status_name(static_cast<px_status>(entry.status)) +
                " and no message: this process may have overwritten its shared arena's "
                "completion ring";
    finish_request(c, it->second, static_cast<px_status>(entry.status), std::move(message),
                   failed && (entry.flags & kCompletionMessageOnDaemon) != 0);
    ++completed;
  }
  tell_loop(c, completed, from_progress);
  return completed;
}

void drain_completions(Client* c) {
  drain_completions(c, false);
}

// Notices a closed daemon connection on a readable socket outside a control call (the
// daemon sends nothing unsolicited). Caller holds client->mutex.
void check_socket(Client* c) {
  if (c->control_active || c->closed) return;
  char byte;
  ssize_t n = recv(c->socket_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    mark_lost(c, "parallaxd at " + c->socket_path + " closed the connection");
}

// Waits for the daemon to complete something (or the deadline). One thread polls the
// doorbell; the others sleep on the condition variable until it has drained.
// Returns false when the deadline passed.
bool wait_for_completions(Client* c, std::unique_lock<std::mutex>& lock, int64_t deadline_ns) {
  if (deadline_ns >= 0 && monotonic_ns() >= deadline_ns) return false;
  if (c->poller_active) {
    if (deadline_ns < 0) {
      c->changed.wait(lock);
    } else {
      auto left = std::chrono::nanoseconds(deadline_ns - monotonic_ns());
      c->changed.wait_for(lock, left);
    }
    return true;
  }
  c->poller_active = true;
  if (c->completion_ring.arm_and_check_empty() && !c->closed) {
    // The socket is watched for the daemon's exit, unless a control call owns its bytes
    // (that call notices the exit itself and rings the doorbell).
    bool watch_socket = !c->control_active;
    lock.unlock();
    pollfd fds[2] = {{c->completion_bell.fd(), POLLIN, 0}, {c->socket_fd, POLLIN, 0}};
    int64_t left_ms = deadline_ns < 0
                          ? -1
                          : std::max<int64_t>(0, (deadline_ns - monotonic_ns() + 999999) / 1000000);
    int r =
        poll(fds, watch_socket ? 2 : 1, static_cast<int>(std::min<int64_t>(left_ms, 0x7fffffff)));
    lock.lock();
    if (r > 0 && (fds[0].revents & POLLIN)) c->completion_bell.drain();
    if (r > 0 && watch_socket && fds[1].revents) check_socket(c);
  }
  c->poller_active = false;
  drain_completions(c);
  c->changed.notify_all();
  return true;
}

namespace {

// The daemon's whole message for a completion that only carried its start.
void fetch_message(Client* c, std::unique_lock<std::mutex>& lock, Request* r) {
  r->message_on_daemon = false;
  uint64_t id = r->id;
  lock.unlock();
  flatbuffers::FlatBufferBuilder b;
  auto body = control::CreateErrorText(b, id);
  std::string payload;
  const control::Message* message = nullptr;
  px_status status = control_call(c, finish_frame(b, control::Body::ErrorText, body.Union()),
                                  control::Body::ErrorTextReply, &payload, &message);
  std::string text;
  bool found = false;
  if (status == PX_OK) {
    const control::ErrorTextReply* reply = message->body_as_ErrorTextReply();
    found = reply->found() && reply->message();
    if (found) text = reply->message()->str();
  }
  lock.lock();
  if (found) {
    r->message = std::move(text);
  } else {
    r->message += " [the rest of this message is no longer available from parallaxd]";
  }
}

// A group step's bad index: the daemon named the group's row (-1), the note names the table.
void add_index_note(Request* r) {
  if (r->status != PX_ERR_INDEX || r->index_note.empty() || r->message_on_daemon) return;
  r->message += " (" + r->index_note + ")";
  r->index_note.clear();
}

}  // namespace

// After completion: copy a staged result to the caller's ordinary memory (once), fetch a
// long message, and return the result.
px_status deliver(Client* c, std::unique_lock<std::mutex>& lock, Request* r) {
  if (r->message_on_daemon) fetch_message(c, lock, r);
  add_index_note(r);
  if (r->status == PX_OK && r->copy_out_to && !r->cancelled && !r->freed) {
    void* to = r->copy_out_to;
    r->copy_out_to = nullptr;  // once; and px_request_free leaves the staging to us
    const char* src = c->arena.base() + r->copy_out_offset;
    r->copying = true;  // px_request_free and px_request_cancel wait for the copy
    lock.unlock();      // the staging buffer belongs to this request; nobody else touches it
    std::memcpy(to, src, r->bytes);
    lock.lock();
    r->copying = false;
    c->changed.notify_all();
    if (r->freed && r->done) destroy_request(c, r);
  }
  r->delivered = true;
  if (r->freed) return fail(c, PX_ERR_CANCELLED, r->describe() + " was freed while waited on");
  if (r->status == PX_OK) return succeed();
  return fail(c, r->status, r->message);
}

// Waits until r is done; false on the deadline, or when r was freed or its client closed
// (*why then says which).
bool wait_done(Client* c, std::unique_lock<std::mutex>& lock, Request* r, int64_t deadline_ns,
               px_status* why) {
  for (;;) {
    drain_completions(c);
    if (r->done || r->cancelled) return true;
    if (r->freed || c->closed) {
      *why = PX_ERR_CANCELLED;
      return false;
    }
    if (c->lost_status != PX_OK) {
      mark_lost(c, c->lost_message);
      continue;
    }
    if (!wait_for_completions(c, lock, deadline_ns)) {
      *why = PX_ERR_TIMEOUT;
      return false;
    }
  }
}

px_status wait_locked(Client* c, std::unique_lock<std::mutex>& lock, Request* r,
                      int64_t deadline_ns, int64_t timeout_ms) {
  px_status why = PX_OK;
  if (wait_done(c, lock, r, deadline_ns, &why)) return deliver(c, lock, r);
  if (why == PX_ERR_CANCELLED)
    return fail(
        c, PX_ERR_CANCELLED,
        r->describe() + (c->closed ? ": px_disconnect was called while it was waited on"
                                   : ": px_request_free was called while it was waited on"));
  return fail(c, PX_ERR_TIMEOUT,
              r->describe() + " did not complete within " + std::to_string(timeout_ms) + " ms (" +
                  c->worker_label() + ")");
}

int64_t deadline_after(int64_t timeout_ms) {
  return timeout_ms < 0 ? -1 : monotonic_ns() + timeout_ms * 1000000;
}

// Asks the daemon to withdraw r (pending steps only); true if it did. Caller holds no lock.
bool withdraw(Client* c, uint64_t request_id, const std::string& reason) {
  flatbuffers::FlatBufferBuilder b;
  auto text = b.CreateString(reason);
  auto body = control::CreateCancel(b, request_id, text);
  std::string payload;
  const control::Message* message = nullptr;
  if (control_call(c, finish_frame(b, control::Body::Cancel, body.Union()),
                   control::Body::CancelReply, &payload, &message) != PX_OK)
    return false;
  return message->body_as_CancelReply()->withdrawn();
}

}  // namespace px

extern "C" {

PX_API px_status px_wait(px_request* handle, int64_t timeout_ms) {
  using namespace px;
  RequestRef ref;
  if (!find_request(handle, &ref)) return stale_handle("px_wait", "request", handle);
  Client* c = ref.client.get();
  std::unique_lock<std::mutex> lock(c->mutex);
  return wait_locked(c, lock, ref.request.get(), deadline_after(timeout_ms), timeout_ms);
}

PX_API px_status px_test(px_request* handle, int32_t* out_done) {
  using namespace px;
  if (!out_done) return fail(PX_ERR_INVALID, "px_test: out_done is NULL");
  *out_done = 0;
  RequestRef ref;
  if (!find_request(handle, &ref)) return stale_handle("px_test", "request", handle);
  Client* c = ref.client.get();
  std::unique_lock<std::mutex> lock(c->mutex);
  drain_completions(c);
  if (!ref.request->done && c->lost_status != PX_OK) mark_lost(c, c->lost_message);
  if (!ref.request->done) return succeed();
  *out_done = 1;
  return deliver(c, lock, ref.request.get());
}

PX_API px_status px_wait_all(px_request* const* requests, uint64_t n, int64_t timeout_ms) {
  using namespace px;
  if (n > 0 && !requests) return fail(PX_ERR_INVALID, "px_wait_all: NULL requests");
  int64_t deadline = deadline_after(timeout_ms);
  px_status first = PX_OK;
  std::string first_message;
  for (uint64_t i = 0; i < n; ++i) {
    RequestRef ref;
    if (!find_request(requests[i], &ref))
      return stale_handle(("px_wait_all (request " + std::to_string(i) + ")").c_str(), "request",
                          requests[i]);
    Client* c = ref.client.get();
    std::unique_lock<std::mutex> lock(c->mutex);
    px_status s = wait_locked(c, lock, ref.request.get(), deadline, timeout_ms);
    if (s != PX_OK && first == PX_OK) {
      first = s;
      first_message = px_last_error();
    }
  }
  return first == PX_OK ? succeed() : fail(first, first_message);
}

PX_API px_status px_request_free(px_request* handle) {
  using namespace px;
  if (!handle) return succeed();
  RequestRef ref;
  if (!find_request(handle, &ref)) return stale_handle("px_request_free", "request", handle);
  remove_request_handle(ref.request->handle);
  Client* c = ref.client.get();
  std::lock_guard<std::mutex> lock(c->mutex);
  Request* r = ref.request.get();
  r->freed = true;
  // Else destroyed when its completion arrives, or when a copy-out in progress ends.
  if (r->done && !r->copying) destroy_request(c, r);
  c->changed.notify_all();  // a wait on it returns PX_ERR_CANCELLED
  if (c->poller_active) c->completion_bell.ring();
  return succeed();
}

PX_API const char* px_request_error(px_request* handle) {
  using namespace px;
  RequestRef ref;
  if (!find_request(handle, &ref))
    return "px_request_error: the request handle is not live (freed, or its client was "
           "disconnected)";
  Client* c = ref.client.get();
  std::unique_lock<std::mutex> lock(c->mutex);
  Request* r = ref.request.get();
  if (!r->done || r->status == PX_OK) return "";
  if (r->message_on_daemon) fetch_message(c, lock, r);
  add_index_note(r);
  return r->message.c_str();  // lives as long as the request
}

PX_API px_status px_request_cancel(px_request* handle) {
  using namespace px;
  RequestRef ref;
  if (!find_request(handle, &ref)) return stale_handle("px_request_cancel", "request", handle);
  Client* c = ref.client.get();
  Request* r = ref.request.get();
  std::unique_lock<std::mutex> lock(c->mutex);
  c->changed.wait(lock, [r] { return !r->copying; });
  if (r->delivered) return succeed();  // its result was returned; nothing writes any more
  if (r->device && !r->done)
    return fail(c, PX_ERR_NOT_IMPLEMENTED,
                "px_request_cancel: " + r->describe() +
                    " is on device memory, ordered on a CUDA stream: it cannot be withdrawn");
  if (!r->done) {
    uint64_t id = r->id;
    lock.unlock();
    withdraw(c, id, "px_request_cancel");
    lock.lock();
    // Staged results are never copied out once cancelled; an arena out buffer is the
    // daemon's to write until the operation completes, so wait for that.
    if (r->daemon_writes_caller && !r->done) {
      px_status why = PX_OK;
      int64_t deadline = deadline_after(c->control_timeout_ms);
      if (!wait_done(c, lock, r, deadline, &why) && why == PX_ERR_TIMEOUT)
        return fail(c, PX_ERR_TIMEOUT,
                    "px_request_cancel: " + r->describe() +
                        " is running and did not finish within " +
                        std::to_string(c->control_timeout_ms) +
                        " ms; parallaxd may still write its out buffer");
    }
  }
  c->changed.wait(lock, [r] { return !r->copying; });
  if (r->delivered) return succeed();  // another thread's wait took the result meanwhile
  r->cancelled = true;                 // no copy-out to the caller's memory from now on
  if (r->status != PX_ERR_CANCELLED) {
    r->status = PX_ERR_CANCELLED;
    r->message = r->describe() + " was cancelled (px_request_cancel)";
    r->message_on_daemon = false;
  }
  c->changed.notify_all();
  return succeed();
}

PX_API px_status px_barrier(px_client* handle, int64_t timeout_ms) {
  using namespace px;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_barrier", "client", handle);
  Client* c = ref.client.get();
  std::unique_lock<std::mutex> lock(c->mutex);
  if (c->closed) return fail(c, PX_ERR_CANCELLED, "px_barrier: the client was disconnected");
  if (c->lost_status != PX_OK) return fail(c, c->lost_status, c->lost_message);
  if (c->in_flight.size() + c->deferred_submits >= c->submit_ring.capacity())
    return fail(c, PX_ERR_BUSY, "px_barrier: too many requests in flight");
  auto request = std::make_shared<Request>();
  Request* r = request.get();
  r->client = c;
  r->id = c->next_request_id++;
  SubmitEntry entry{};
  entry.request_id = r->id;
  entry.step = c->barrier_step++;
  entry.var_id = 0;
  entry.opcode = static_cast<uint16_t>(Opcode::kBarrier);
  entry.in.region = entry.out.region = 0;
  r->step = entry.step;
  c->requests[r] = request;
  px_status status = submit(c, entry, r);
  if (status == PX_OK) status = wait_locked(c, lock, r, deadline_after(timeout_ms), timeout_ms);
  std::string message = px_last_error();
  if (status == PX_ERR_TIMEOUT && !r->done) {
    // Withdrawn, it cannot count as entered: the others' barrier fails instead of passing.
    uint64_t id = r->id;
    lock.unlock();
    withdraw(c, id, "its px_barrier timed out after " + std::to_string(timeout_ms) + " ms");
    lock.lock();
  }
  r->freed = true;
  if (r->done) destroy_request(c, r);
  return status == PX_OK ? succeed() : fail(c, status, message);
}

PX_API px_status px_client_fd(px_client* handle, int* out_fd) {
  using namespace px;
  if (!out_fd) return fail(PX_ERR_INVALID, "px_client_fd: out_fd is NULL");
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_client_fd", "client", handle);
  Client* c = ref.client.get();
  std::lock_guard<std::mutex> lock(c->mutex);
  if (c->epoll_fd < 0) {
    std::string error;
    int ep = make_completion_epoll(c, &error);
    if (ep < 0) return fail(c, PX_ERR_INTERNAL, "px_client_fd: " + error);
    c->epoll_fd = ep;
    c->completion_ring.arm_and_check_empty();  // so the daemon rings for the next one
  }
  *out_fd = c->epoll_fd;
  return succeed();
}

PX_API px_status px_progress(px_client* handle) {
  using namespace px;
  ClientRef ref;
  if (!find_client(handle, &ref)) return stale_handle("px_progress", "client", handle);
  Client* c = ref.client.get();
  std::lock_guard<std::mutex> lock(c->mutex);
  if (c->closed) return fail(c, PX_ERR_CANCELLED, "px_progress: the client was disconnected");
  // A thread asleep in poll() on the doorbell owns it; draining it here could leave that
  // thread asleep with its completion taken.
  if (!c->poller_active) {
    c->completion_bell.drain();
    do {
      drain_completions(c, true);
    } while (!c->completion_ring.arm_and_check_empty());
  } else {
    drain_completions(c, true);
  }
  c->user_bell.drain();
  check_socket(c);
  c->changed.notify_all();
  if (c->lost_status != PX_OK) return fail(c, c->lost_status, c->lost_message);
  return succeed();
}

}  // extern "C"
