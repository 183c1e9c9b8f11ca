// What operations.cc (submitting) and requests.cc (waiting) share. Every function here
// expects the caller to hold client->mutex unless it says otherwise.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "clients/c/client_internal.h"

namespace px {

void release_staging(Client* c, Request* r);
// Forgets r (its staging, its in-flight entry, the client's reference).
void destroy_request(Client* c, Request* r);
// r is done with status (and message); freed requests are forgotten.
void finish_request(Client* c, Request* r, px_status status, std::string message,
                    bool message_on_daemon = false);
// Waits until r is done; false on the deadline (-1: none), or when r was freed or its
// client closed (*why then says which).
bool wait_done(Client* c, std::unique_lock<std::mutex>& lock, Request* r, int64_t deadline_ns,
               px_status* why);
// Sleeps until completions may have arrived (the doorbell, or another waiter's news);
// false at the deadline (-1: none). Drains nothing itself.
bool wait_for_completions(Client* c, std::unique_lock<std::mutex>& lock, int64_t deadline_ns);
// The daemon went away: every outstanding request fails with why.
void mark_lost(Client* c, const std::string& why);
// Takes completions from the ring; from_progress: called by px_progress (does not ring the
// px_client_fd loop's bell). Returns how many requests completed.
size_t drain_completions(Client* c, bool from_progress);
// Pushes entry on the submission ring and records r as in flight.
px_status submit(Client* c, const SubmitEntry& entry, Request* r);
px_status wait_locked(Client* c, std::unique_lock<std::mutex>& lock, Request* r,
                      int64_t deadline_ns, int64_t timeout_ms);
int64_t deadline_after(int64_t timeout_ms);
// PX_OK if the client may take operations (not closed, daemon not lost).
px_status usable(Client* c);
// PX_ERR_BUSY once the ring's capacity of requests is held (in flight or deferred).
px_status check_in_flight(Client* c, const std::string& who);
// A new request with staging_bytes of arena room for ordinary memory (none if 0).
px_status new_request(Client* c, const std::string& who, uint64_t staging_bytes,
                      std::shared_ptr<Request>* out);
// Notices the daemon's end of the socket outside control calls.
void check_socket(Client* c);
// The px_client_fd epoll set (and user_bell); -1 with error set on failure.
int make_completion_epoll(Client* c, std::string* error);

}  // namespace px
