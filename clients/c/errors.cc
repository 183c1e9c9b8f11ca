// Error messages: per thread (px_last_error), per client (px_client_last_error), and per
// request (requests.cc); status names and phrases.
#include <cstdio>
#include <cstring>
#include <string>

#include "clients/c/client_internal.h"

namespace {
thread_local std::string t_last_error;
}

namespace px {

px_status fail(px_status status, const std::string& message) {
  t_last_error = message;
  return status;
}

px_status fail(Client* client, px_status status, const std::string& message) {
  if (client) {
    std::lock_guard<std::mutex> lock(client->error_mutex);
    client->last_error = message;
  }
  return fail(status, message);
}

px_status succeed() {
  t_last_error.clear();
  return PX_OK;
}

px_status stale_handle(const char* fn, const char* kind, const void* handle) {
  if (!handle) return fail(PX_ERR_INVALID, std::string(fn) + ": the " + kind + " is NULL");
  char text[64];
  std::snprintf(text, sizeof text, "%p", handle);
  return fail(PX_ERR_NOT_FOUND, std::string(fn) + ": " + kind + " handle " + text +
                                    " is not live (freed, or its client was disconnected)");
}

}  // namespace px

extern "C" {

PX_API uint32_t px_abi_version(void) {
  return PX_ABI_VERSION;
}

PX_API const char* px_last_error(void) {
  return t_last_error.c_str();
}

PX_API px_status px_client_last_error(px_client* handle, char* buffer, uint64_t size,
                                      uint64_t* out_length) {
  px::ClientRef ref;
  if (!px::find_client(handle, &ref))
    return px::stale_handle("px_client_last_error", "client", handle);
  if (size > 0 && !buffer) return px::fail(PX_ERR_INVALID, "px_client_last_error: NULL buffer");
  std::string copy;
  {
    std::lock_guard<std::mutex> lock(ref.client->error_mutex);
    copy = ref.client->last_error;
  }
  if (out_length) *out_length = copy.size();
  if (size > 0) {
    size_t n = std::min<uint64_t>(copy.size(), size - 1);
    std::memcpy(buffer, copy.data(), n);
    buffer[n] = '\0';
  }
  return PX_OK;  // leaves the thread's message alone: it is read right after a failure
}

PX_API const char* px_strerror(px_status status) {
  switch (status) {
    case PX_OK:
      return "success";
    case PX_ERR_INVALID:
      return "invalid argument";
    case PX_ERR_VERSION:
      return "incompatible ABI versions";
    case PX_ERR_CONNECT:
      return "cannot connect to parallaxd";
    case PX_ERR_TIMEOUT:
      return "deadline exceeded";
    case PX_ERR_PEER_LOST:
      return "a peer worker or node was lost";
    case PX_ERR_MISMATCH:
      return "registrations do not match";
    case PX_ERR_NOT_FOUND:
      return "not found";
    case PX_ERR_NO_MEMORY:
      return "out of memory";
    case PX_ERR_BUSY:
      return "too many requests in flight";
    case PX_ERR_PROTOCOL:
      return "protocol error";
    case PX_ERR_INDEX:
      return "index out of range";
    case PX_ERR_NOT_IMPLEMENTED:
      return "not implemented";
    case PX_ERR_INTERNAL:
      return "internal error";
    case PX_ERR_PERMISSION:
      return "permission denied";
    case PX_ERR_CANCELLED:
      return "cancelled";
    case PX_ERR_MEMBERSHIP:
      return "the cluster's membership changed";
    case PX_STATUS_FORCE_32BIT:
      break;
  }
  return "unknown status";
}

PX_API const char* px_status_name(px_status status) {
  switch (status) {
#define PX_NAME(s) \
  case s:          \
    return #s;
    PX_NAME(PX_OK)
    PX_NAME(PX_ERR_INVALID)
    PX_NAME(PX_ERR_VERSION)
    PX_NAME(PX_ERR_CONNECT)
    PX_NAME(PX_ERR_TIMEOUT)
    PX_NAME(PX_ERR_PEER_LOST)
    PX_NAME(PX_ERR_MISMATCH)
    PX_NAME(PX_ERR_NOT_FOUND)
    PX_NAME(PX_ERR_NO_MEMORY)
    PX_NAME(PX_ERR_BUSY)
    PX_NAME(PX_ERR_PROTOCOL)
    PX_NAME(PX_ERR_INDEX)
    PX_NAME(PX_ERR_NOT_IMPLEMENTED)
    PX_NAME(PX_ERR_INTERNAL)
    PX_NAME(PX_ERR_PERMISSION)
    PX_NAME(PX_ERR_CANCELLED)
    PX_NAME(PX_ERR_MEMBERSHIP)
#undef PX_NAME
    case PX_STATUS_FORCE_32BIT:
      break;
  }
  return "PX_STATUS_UNKNOWN";
}

}  // extern "C"
