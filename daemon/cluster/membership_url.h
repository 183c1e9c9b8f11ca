// `membership = "etcd://HOST:PORT[,HOST:PORT...]/PREFIX"`: where a cluster's membership lives
// (etcd_membership.h). Parsed by the configuration (front/config.cc) and the membership.
#pragma once

#include <string>
#include <vector>

namespace px {

struct MembershipUrl {
  std::vector<std::string> endpoints;  // "host:port", in the order given
  std::string prefix;                  // "/parallax/prod": every key lives under it
};

// False with a message naming what is wrong ("etcd://" missing, no endpoint, an endpoint
// without a port, no prefix).
inline bool parse_membership_url(const std::string& url, MembershipUrl* out, std::string* error) {
  const std::string scheme = "etcd://";
  if (url.compare(0, scheme.size(), scheme) != 0) {
    *error = "'" + url + "' is not etcd://HOST:PORT[,HOST:PORT...]/PREFIX";
    return false;
  }
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  if (slash == std::string::npos || slash + 1 >= rest.size()) {
    *error = "'" + url + "' names no key prefix (etcd://HOST:PORT/PREFIX)";
    return false;
  }
  MembershipUrl parsed;
  parsed.prefix = rest.substr(slash);
  while (parsed.prefix.size() > 1 && parsed.prefix.back() == '/') parsed.prefix.pop_back();
  std::string hosts = rest.substr(0, slash);
  size_t start = 0;
  while (start <= hosts.size()) {
    size_t comma = hosts.find(',', start);
    std::string endpoint =
        hosts.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t colon = endpoint.rfind(':');
    if (endpoint.empty() || colon == std::string::npos || colon == 0 ||
        colon + 1 == endpoint.size() ||
        endpoint.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      *error = "'" + url + "': etcd endpoint '" + endpoint + "' is not HOST:PORT";
      return false;
    }
    parsed.endpoints.push_back(endpoint);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  *out = parsed;
  return true;
}

}  // namespace px
