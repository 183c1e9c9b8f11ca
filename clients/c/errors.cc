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

px_status succeed() {
  t_last_error.clear();
  return PX_OK;
}

}  // namespace px

extern "C" {

PX_API uint32_t px_abi_version(void) {
  return PX_ABI_VERSION;
}

PX_API const char* px_last_error(void) {
  return t_last_error.c_str();
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
  }
  return "unknown status";
}

}  // extern "C"
