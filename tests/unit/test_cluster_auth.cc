// cluster_auth.h: the MACs of the daemons' challenge-response bind every part they cover.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "daemon/cluster/cluster_auth.h"

using namespace px;

TEST_CASE("cluster auth: a MAC changes with every part it covers, and nonces are fresh") {
  std::string a = auth_nonce(), b = auth_nonce();
  CHECK(a.size() == kAuthNonceBytes);
  CHECK(a != b);
  std::string secret = "0123456789abcdef";
  std::string base = auth_mac(secret, "join", "c", a, b, 1, 3);
  CHECK(base.size() == 32);  // SHA-256
  CHECK(auth_equal(base, auth_mac(secret, "join", "c", a, b, 1, 3)));
  std::set<std::string> macs = {
      base,
      auth_mac("0123456789abcdeF", "join", "c", a, b, 1, 3),
      auth_mac(secret, "coordinator", "c", a, b, 1, 3),
      auth_mac(secret, "join", "d", a, b, 1, 3),
      auth_mac(secret, "join", "c", b, a, 1, 3),
      auth_mac(secret, "join", "c", a, b, 2, 3),
      auth_mac(secret, "join", "c", a, b, 1, 4),
      // Length prefixes: moving bytes between parts changes the MAC.
      auth_mac(secret, "join", "c", a + b.substr(0, 1), b.substr(1), 1, 3),
  };
  CHECK(macs.size() == 8);
  CHECK(!auth_equal(base, base.substr(0, 31)));
  CHECK(!auth_equal(base, ""));
}
