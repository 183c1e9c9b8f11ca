// CollectiveTransport between threads of one process: the reference transport the
// collectives are tested on before they meet libfabric. Sends are buffered (they complete
// once copied); callbacks run on one delivery thread, as a progress thread would.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "transport/collectives/collective_transport.h"

namespace px {

class InProcGroup {
 public:
  explicit InProcGroup(int size);
  ~InProcGroup();
  InProcGroup(const InProcGroup&) = delete;
  InProcGroup& operator=(const InProcGroup&) = delete;

  CollectiveTransport& member(int rank);
  int size() const { return static_cast<int>(members_.size()); }

 private:
  class Member;
  struct PostedRecv {
    void* buffer;
    size_t bytes;
    MessageCallback done;
    bool exact;  // recv: any other length fails
  };
  using Key = std::tuple<int, int, uint64_t>;  // (to, from, tag)

  void send(int from, int to, uint64_t tag, const void* buffer, size_t bytes,
            TransferCallback done);
  void recv(int to, int from, uint64_t tag, PostedRecv posted);
  void deliver(std::vector<char>& data, PostedRecv& recv);  // caller holds mutex_
  void run_callbacks();

  std::vector<std::unique_ptr<Member>> members_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<Key, std::deque<std::vector<char>>> unexpected_;
  std::map<Key, std::deque<PostedRecv>> posted_;
  std::deque<std::function<void()>> callbacks_;
  bool stopping_ = false;
  std::thread delivery_;
};

}  // namespace px
