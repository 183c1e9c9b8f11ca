// FabricEndpoint::reset_peers when an epoch changes its nodes (membership on etcd: the
// survivors of a lost node, ranked anew): the group shrinks and a node moves to another
// rank, then grows again; messages go between the new ranks each time. Real endpoints over
// tcp;ofi_rxm on loopback.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/fabric/fabric_endpoint.h"

namespace {

std::unique_ptr<px::FabricEndpoint> open_endpoint() {
  px::FabricOptions options;
  options.provider = "tcp;ofi_rxm";
  options.address = "127.0.0.1";
  std::string error;
  auto ep = px::FabricEndpoint::open(options, &error);
  REQUIRE_MESSAGE(ep, error);
  return ep;
}

// from sends `value` to `to` (ranks in their current group) under tag; true once it arrived.
bool exchange(px::FabricEndpoint& from, px::FabricEndpoint& to, uint64_t tag, int value) {
  std::mutex mutex;
  std::condition_variable cv;
  int got = 0, done = 0, failures = 0;
  auto finished = [&](bool ok, const std::string&) {
    std::lock_guard<std::mutex> lock(mutex);
    ++done;
    failures += ok ? 0 : 1;
    cv.notify_all();
  };
  to.recv(from.rank(), tag, &got, sizeof got, finished);
  from.send(to.rank(), tag, &value, sizeof value, 0, finished);
  std::unique_lock<std::mutex> lock(mutex);
  bool all = cv.wait_for(lock, std::chrono::seconds(30), [&] { return done == 2; });
  return all && failures == 0 && got == value;
}

}  // namespace

TEST_CASE("fabric endpoint: an epoch of fewer nodes ranks them anew, and one of more again") {
  std::vector<std::unique_ptr<px::FabricEndpoint>> eps;
  std::vector<std::string> all;
  for (int r = 0; r < 3; ++r) {
    eps.push_back(open_endpoint());
    all.push_back(eps.back()->address());
  }
  std::string error;
  for (int r = 0; r < 3; ++r)
    REQUIRE_MESSAGE(eps[static_cast<size_t>(r)]->set_peers(all, r, &error), error);
  for (auto& ep : eps) ep->start();
  CHECK(exchange(*eps[2], *eps[0], 1, 21));

  // Node 1 lost: nodes 0 and 2 are ranks 0 and 1 of an epoch of two.
  std::vector<std::string> survivors = {all[0], all[2]};
  REQUIRE_MESSAGE(eps[0]->reset_peers(survivors, 0, &error), error);
  REQUIRE_MESSAGE(eps[2]->reset_peers(survivors, 1, &error), error);
  CHECK(eps[2]->rank() == 1);
  CHECK(eps[2]->size() == 2);
  CHECK(exchange(*eps[2], *eps[0], 2, 42));
  CHECK(exchange(*eps[0], *eps[2], 3, 43));

  // A node joins (a new endpoint, as a new daemon has): three ranks again.
  eps[1] = open_endpoint();
  all[1] = eps[1]->address();
  REQUIRE_MESSAGE(eps[1]->set_peers(all, 1, &error), error);
  eps[1]->start();
  REQUIRE_MESSAGE(eps[0]->reset_peers(all, 0, &error), error);
  REQUIRE_MESSAGE(eps[2]->reset_peers(all, 2, &error), error);
  CHECK(eps[2]->rank() == 2);
  CHECK(eps[2]->size() == 3);
  CHECK(exchange(*eps[1], *eps[2], 4, 84));
  CHECK(exchange(*eps[2], *eps[0], 5, 85));
  for (auto& ep : eps) ep->stop();
}
