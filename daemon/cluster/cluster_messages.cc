// What every control message shares: an envelope of our version, epoch and cluster name,
// and the addresses at either end of a connection (cluster_internal.h). Apart from the
// Cluster class, so the fuzz seeds' writer builds the very envelopes without the rest.
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

#include "daemon/cluster/cluster_internal.h"

namespace px {

namespace cluster_detail {

bool resolve(const std::string& endpoint, sockaddr_storage* out, std::string* error) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    *error = "'" + endpoint + "' is not host:port";
    return false;
  }
  std::string host = endpoint.substr(0, colon), port = endpoint.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || !result) {
    *error = "cannot resolve '" + endpoint + "': " + gai_strerror(rc);
    return false;
  }
  std::memcpy(out, result->ai_addr, result->ai_addrlen);
  freeaddrinfo(result);
  return true;
}

std::unique_ptr<capnp::MallocMessageBuilder> build(const std::string& cluster, uint64_t epoch,
                                                   const Fill& fill) {
  auto message = std::make_unique<capnp::MallocMessageBuilder>();
  Envelope::Builder envelope = message->initRoot<Envelope>();
  envelope.setProtocolVersion(kClusterProtocolVersion);
  envelope.setEpoch(epoch);
  envelope.setCluster(cluster);
  fill(envelope.getBody());
  return message;
}

std::string peer_address(const uv_tcp_t* tcp) {
  sockaddr_storage addr{};
  int len = sizeof addr;
  if (uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return "an unknown address";
  char ip[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    uv_ip6_name(a, ip, sizeof ip);
    std::string out("[");  // appended, not "[" + string: a GCC 12 -Wrestrict false positive
    out += ip;
    out += "]:" + std::to_string(ntohs(a->sin6_port));
    return out;
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
  uv_ip4_name(a, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a->sin_port));
}

}  // namespace cluster_detail

}  // namespace px
