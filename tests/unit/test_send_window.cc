// Priority with credits on the link (transport/fabric/send_window.h): first the order logic
// alone, then two real FabricEndpoints over tcp;ofi_rxm on loopback, where a small urgent
// send must overtake a large transfer waiting for the link, and keeps FIFO at equal priority.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/fabric/fabric_endpoint.h"
#include "transport/fabric/send_window.h"

namespace {

using px::SendWindow;

std::vector<int> take(SendWindow<int>& w, int peer) {
  std::vector<int> out;
  w.take_ready(peer, &out);
  return out;
}

}  // namespace

TEST_CASE("send window: equal priorities go in the order they came, a window of bytes at a time") {
  SendWindow<int> w(100);
  w.set_peers(2);
  for (int i = 0; i < 5; ++i) w.push(1, 0, 40, i);
  CHECK(take(w, 1) == std::vector<int>{0, 1});  // 80 bytes; a third would make 120
  CHECK(w.in_flight_bytes(1) == 80);
  CHECK(take(w, 0).empty());  // peers have their own windows
  w.finished(1, 40);
  CHECK(take(w, 1) == std::vector<int>{2});
  w.finished(1, 40);
  w.finished(1, 40);
  CHECK(take(w, 1) == std::vector<int>{3, 4});
  CHECK(w.overtakes() == 0);
}

TEST_CASE("send window: a larger priority overtakes what waits, never what is in flight") {
  SendWindow<int> w(100);
  w.set_peers(1);
  for (int i = 0; i < 4; ++i) w.push(0, 0, 50, i);  // a large low-priority transfer in chunks
  CHECK(take(w, 0) == std::vector<int>{0, 1});
  w.push(0, 200, 10, 100);  // a small urgent one: waits only for credit
  w.push(0, 7, 10, 50);
  CHECK(take(w, 0).empty());  // the window is full
  w.finished(0, 50);
  CHECK(take(w, 0) == std::vector<int>{100, 50});  // 50 + 10 + 10 bytes now in flight
  CHECK(w.overtakes() == 2);
  w.finished(0, 10);
  w.finished(0, 10);
  CHECK(take(w, 0) == std::vector<int>{2});
  w.finished(0, 50);
  w.finished(0, 50);
  CHECK(take(w, 0) == std::vector<int>{3});
}

TEST_CASE("send window: a send larger than the window goes alone, dropped sends and reset peers") {
  SendWindow<int> w(100);
  w.set_peers(2);
  w.push(0, 0, 10, 1);
  w.push(0, 0, 500, 2);
  w.push(1, 0, 10, 3);
  CHECK(take(w, 0) == std::vector<int>{1});
  w.finished(0, 10);
  CHECK(take(w, 0) == std::vector<int>{2});  // nothing else in flight: it goes
  w.push(0, 9, 10, 4);
  CHECK(take(w, 0).empty());
  std::vector<int> dropped;
  w.drop_if([](int item) { return item == 3 || item == 4; }, &dropped);
  CHECK(dropped == std::vector<int>{4, 3});  // by peer, then order
  CHECK(w.waiting(0) == 0);
  CHECK(w.waiting(1) == 0);
  w.reset(0);
  CHECK(w.in_flight_bytes(0) == 0);
}

namespace {

// Two endpoints, rank 0 sending to rank 1 over a window of two 8 KiB eager chunks. Rank 1
// posts every receive first (so they complete in the order the messages arrive); rank 0
// queues a 16-chunk transfer, then one small send at small_priority, and only then starts
// its progress thread, which returns the window's credit: until then the first two chunks
// hold it and everything else waits, whatever the machine's load. Returns the small
// message's place in rank 1's completion order.
size_t small_place(uint8_t small_priority) {
  constexpr size_t kChunk = 8192, kChunks = 16, kSmall = 1024;
  std::vector<std::unique_ptr<px::FabricEndpoint>> eps;
  std::vector<std::string> addresses;
  for (int r = 0; r < 2; ++r) {
    px::FabricOptions options;
    options.provider = "tcp;ofi_rxm";
    options.address = "127.0.0.1";
    options.eager_bytes = kChunk;
    options.send_window_bytes = 2 * kChunk;
    std::string error;
    auto ep = px::FabricEndpoint::open(options, &error);
    REQUIRE_MESSAGE(ep, error);
    REQUIRE(ep->eager_limit() >= kChunk);  // the chunks are eager: they wait in the window
    addresses.push_back(ep->address());
    eps.push_back(std::move(ep));
  }
  for (int r = 0; r < 2; ++r) {
    std::string error;
    REQUIRE_MESSAGE(eps[static_cast<size_t>(r)]->set_peers(addresses, r, &error), error);
  }
  eps[1]->start();
  std::vector<char> large(kChunks * kChunk, 1), small(kSmall, 2);
  std::vector<char> large_in(large.size()), small_in(kSmall);
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<uint64_t> order;  // tags, in rank 1's completion order
  size_t sends_done = 0, failures = 0;
  auto received = [&](uint64_t tag) {
    return [&, tag](bool ok, const std::string&) {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(tag);
      failures += ok ? 0 : 1;
      cv.notify_all();
    };
  };
  eps[1]->recv(0, 1000, small_in.data(), kSmall, received(1000));
  for (size_t c = 0; c < kChunks; ++c)
    eps[1]->recv(0, c, large_in.data() + c * kChunk, kChunk, received(c));
  auto sent = [&](bool ok, const std::string&) {
    std::lock_guard<std::mutex> lock(mutex);
    ++sends_done;
    failures += ok ? 0 : 1;
    cv.notify_all();
  };
  for (size_t c = 0; c < kChunks; ++c)
    eps[0]->send(1, c, large.data() + c * kChunk, kChunk, 0, sent);
  eps[0]->send(1, 1000, small.data(), kSmall, small_priority, sent);
  eps[0]->start();
  std::unique_lock<std::mutex> lock(mutex);
  bool all = cv.wait_for(lock, std::chrono::seconds(60),
                         [&] { return order.size() == kChunks + 1 && sends_done == kChunks + 1; });
  REQUIRE_MESSAGE(all, "transfers still outstanding after 60 s: " << order.size() << " received, "
                                                                  << sends_done << " sent");
  CHECK(failures == 0);
  CHECK(large_in == large);
  CHECK(small_in == small);
  if (small_priority > 0) CHECK(eps[0]->priority_overtakes() > 0);
  return static_cast<size_t>(std::find(order.begin(), order.end(), 1000) - order.begin());
}

}  // namespace

TEST_CASE("fabric endpoint: an urgent small send overtakes a large transfer waiting for the link") {
  // Only the window's two chunks went before it; the 14 others waited behind it.
  size_t place = small_place(255);
  INFO("the small message arrived after " << place << " of the 16 large chunks");
  CHECK(place <= 2);
}

TEST_CASE(
    "fabric endpoint: at equal priority the small send keeps its place behind the large one") {
  size_t place = small_place(0);
  INFO("the small message arrived after " << place << " of the 16 large chunks");
  CHECK(place == 16);
}

TEST_CASE("fabric endpoint: sends larger than the eager size are not held by the window") {
  // A rendezvous send completes only once the peer posts its receive; held in the window it
  // could block an eager send the peer needs first. Rank 1 receives the small message
  // before posting the large one's receive: with the large one holding the window this
  // would never finish.
  std::vector<std::unique_ptr<px::FabricEndpoint>> eps;
  std::vector<std::string> addresses;
  for (int r = 0; r < 2; ++r) {
    px::FabricOptions options;
    options.provider = "tcp;ofi_rxm";
    options.address = "127.0.0.1";
    options.send_window_bytes = 4096;
    std::string error;
    auto ep = px::FabricEndpoint::open(options, &error);
    REQUIRE_MESSAGE(ep, error);
    addresses.push_back(ep->address());
    eps.push_back(std::move(ep));
  }
  for (int r = 0; r < 2; ++r) {
    std::string error;
    REQUIRE_MESSAGE(eps[static_cast<size_t>(r)]->set_peers(addresses, r, &error), error);
    eps[static_cast<size_t>(r)]->start();
  }
  size_t big_bytes = std::max<size_t>(eps[0]->eager_limit() * 4, 1 << 20);
  std::vector<char> big(big_bytes, 3), big_in(big_bytes), small(64, 4), small_in(64);
  std::mutex mutex;
  std::condition_variable cv;
  int done = 0, failures = 0;
  auto count = [&](bool ok, const std::string&) {
    std::lock_guard<std::mutex> lock(mutex);
    ++done;
    failures += ok ? 0 : 1;
    cv.notify_all();
  };
  eps[0]->send(1, 1, big.data(), big_bytes, 0, count);
  eps[0]->send(1, 2, small.data(), small.size(), 0, count);
  eps[1]->recv(0, 2, small_in.data(), small_in.size(), [&](bool ok, const std::string& e) {
    eps[1]->recv(0, 1, big_in.data(), big_bytes, count);  // only now
    count(ok, e);
  });
  std::unique_lock<std::mutex> lock(mutex);
  REQUIRE_MESSAGE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == 4; }),
                  "the small message waited behind an unmatched rendezvous send");
  CHECK(failures == 0);
  CHECK(big_in == big);
  CHECK(small_in == small);
}
