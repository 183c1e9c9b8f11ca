// SparseChannel's receiving side against a peer that sends malformed messages, over real
// libfabric endpoints: a short first message or a part of the wrong size is refused, never
// served from stale buffer bytes, and receives report the length that arrived.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "daemon/common/thread_pool.h"
#include "daemon/sparse/sparse_channel.h"
#include "tests/unit/collective_test_util.h"
#include "transport/collectives/inproc_transport.h"

namespace pxt {
namespace {

constexpr uint32_t kVarId = 7;

// The event loop's stand-in: posted work runs on the test thread.
struct Loop {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::function<void()>> work;
  void post(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex);
    work.push_back(std::move(fn));
    cv.notify_all();
  }
  // Runs posted work until done() holds or ms pass; returns done().
  bool run_until(const std::function<bool()>& done, int ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    std::unique_lock<std::mutex> lock(mutex);
    while (!done()) {
      if (work.empty() && !cv.wait_until(lock, deadline, [&] { return !work.empty(); }))
        return done();
      auto fn = std::move(work.front());
      work.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
    return true;
  }
};

std::vector<char> request(SparseOp op, uint64_t count, uint64_t payload, uint32_t partition,
                          const std::vector<int64_t>& inline_rows) {
  SparseRequestHeader h{};
  h.op = static_cast<uint16_t>(op);
  h.from_node = 1;
  h.count = count;
  h.payload_bytes = payload;
  h.partition = partition;
  std::vector<char> m(sizeof h + inline_rows.size() * sizeof(int64_t));
  std::memcpy(m.data(), &h, sizeof h);
  if (!inline_rows.empty())
    std::memcpy(m.data() + sizeof h, inline_rows.data(), inline_rows.size() * sizeof(int64_t));
  return m;
}

uint64_t request_tag(uint64_t seq, uint64_t part) {
  return make_tag(TagKind::kSparseRequest, kVarId, seq) | part;
}

}  // namespace

TEST_CASE("receives fail on a message of another length, recv_message reports the length") {
  InProcGroup group(2);
  auto eps = open_endpoints(2);
  for (CollectiveTransport* pair : {&group.member(0), static_cast<CollectiveTransport*>(nullptr)}) {
    CollectiveTransport& a = pair ? *pair : *eps[0];
    CollectiveTransport& b = pair ? group.member(1) : *eps[1];
    char data[16] = "0123456789abcde", got[16] = {}, any[64] = {};
    Completion sends, exact;
    std::mutex mutex;
    std::condition_variable cv;
    size_t arrived = 0;
    bool message_done = false;
    b.recv(0, 1, got, 16, exact.callback());
    b.recv_message(0, 2, any, sizeof any, [&](bool ok, size_t bytes, const std::string&) {
      std::lock_guard<std::mutex> lock(mutex);
      message_done = ok;
      arrived = bytes;
      cv.notify_all();
    });
    a.send(1, 1, data, 10, sends.callback());
    a.send(1, 2, data, 12, sends.callback());
    REQUIRE(exact.wait_for(1, 10));
    REQUIRE(exact.errors.size() == 1);
    CHECK(exact.errors[0].find("10 bytes arrived, 16 expected") != std::string::npos);
    std::unique_lock<std::mutex> lock(mutex);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return message_done; }));
    CHECK(arrived == 12);
    CHECK(std::memcmp(any, data, 12) == 0);
    sends.wait_for(2, 10);
  }
}

TEST_CASE("a sparse owner refuses malformed requests from a peer and serves well-formed ones") {
  ThreadPool pool(1);
  Loop loop;
  auto post = [&loop](std::function<void()> fn) { loop.post(std::move(fn)); };
  auto eps = open_endpoints(2);
  SparseOptions options;
  PartitionMap map(40, 4, 2);  // node 0 holds partitions 0 and 2
  auto owner = std::make_shared<ShardOwner>("test", map, 0, 2, options, 2, pool, post);
  auto channel = std::make_shared<SparseChannel>(eps[0].get(), 0, 2, std::vector<size_t>{2, 2},
                                                 256 * 1024, owner, post,
                                                 [](int n) { return "node " + std::to_string(n); });
  channel->start(kVarId);
  FabricEndpoint& peer = *eps[1];

  // The reply to request `seq` of `rows` rows: status, then the rows.
  struct Reply {
    std::vector<char> bytes;
    Completion done;
    int32_t status() const {
      int32_t s;
      std::memcpy(&s, bytes.data(), 4);
      return s;
    }
  };
  auto expect_reply = [&](uint64_t seq, size_t rows) {
    auto r = std::make_shared<Reply>();
    r->bytes.assign(sizeof(SparseReplyHeader) + rows * 2 * sizeof(float), 'x');
    // Completes on the peer's progress thread; the empty post wakes the loop to see it.
    auto done = r->done.callback();
    peer.recv(0, make_tag(TagKind::kSparseReply, kVarId, seq), r->bytes.data(), r->bytes.size(),
              [&loop, done](bool ok, const std::string& error) {
                done(ok, error);
                loop.post([] {});
              });
    return r;
  };
  Completion sent;
  std::vector<std::vector<char>> keep;  // send buffers live until the test ends
  auto send = [&](uint64_t tag, std::vector<char> m) {
    keep.push_back(std::move(m));
    peer.send(0, tag, keep.back().data(), keep.back().size(), sent.callback());
  };
  auto replied = [&](const std::shared_ptr<Reply>& r, int ms) {
    return loop.run_until([&] { return r->done.count() > 0; }, ms);
  };

  // 0: a well-formed pull of rows 0 and 4 (partition 0): served, zeros.
  auto r0 = expect_reply(0, 2);
  send(request_tag(0, 0), request(SparseOp::kPull, 2, 16, 0, {0, 4}));
  REQUIRE(replied(r0, 10000));
  CHECK(r0->done.errors.empty());
  CHECK(r0->status() == PX_OK);
  std::vector<float> zeros(4, 0.0f);
  CHECK(std::memcmp(r0->bytes.data() + 8, zeros.data(), 16) == 0);

  // 1: a load of row 0 whose values part is 4 bytes instead of 8: refused, nothing loaded.
  auto r1 = expect_reply(1, 0);
  send(request_tag(1, 0), request(SparseOp::kLoad, 1, 16, kAllPartitions, {0}));
  float half[1] = {5.0f};
  std::vector<char> short_values(4);
  std::memcpy(short_values.data(), half, 4);
  send(request_tag(1, 2), short_values);
  REQUIRE(replied(r1, 10000));
  CHECK(r1->status() == PX_ERR_PROTOCOL);

  // 2: row 0 is still zero.
  auto r2 = expect_reply(2, 1);
  send(request_tag(2, 0), request(SparseOp::kPull, 1, 8, 0, {0}));
  REQUIRE(replied(r2, 10000));
  CHECK(r2->status() == PX_OK);
  CHECK(std::memcmp(r2->bytes.data() + 8, zeros.data(), 8) == 0);

  // 3: a pull whose header claims two inline rows but whose message carries one: the
  // receive buffer still holds request 0's second row after it, so serving it would answer
  // for a row this request never named. It is refused, and the peer's later requests are no longer
  // read.
  auto r3 = expect_reply(3, 2);
  send(request_tag(3, 0), request(SparseOp::kPull, 2, 16, 0, {4}));
  CHECK_FALSE(replied(r3, 500));
  auto r4 = expect_reply(4, 1);
  send(request_tag(4, 0), request(SparseOp::kPull, 1, 8, 0, {0}));
  CHECK_FALSE(replied(r4, 300));
  eps[1]->fail_all("test over");
  eps[0]->fail_all("test over");
  loop.run_until([] { return false; }, 100);
}

}  // namespace pxt
