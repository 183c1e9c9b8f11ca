// What operations.cc (submitting) and requests.cc (waiting) share. Every function here
// expects the caller to hold client->mutex unless it says otherwise.
#pragma once

#include <mutex>
#include <string>

#include "clients/c/client_internal.h"

namespace px {

void release_staging(Client* c, Request* r);
// Forgets r (its staging, its in-flight entry, the client's reference).
void destroy_request(Client* c, Request* r);
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
// Notices the daemon's end of the socket outside control calls.
void check_socket(Client* c);
// The px_client_fd epoll set (and user_bell); -1 with error set on failure.
int make_completion_epoll(Client* c, std::string* error);

}  // namespace px
