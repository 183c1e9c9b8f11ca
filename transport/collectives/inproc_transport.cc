#include "transport/collectives/inproc_transport.h"

#include <cstring>

namespace px {

class InProcGroup::Member : public CollectiveTransport {
 public:
  Member(InProcGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  // Sends are copied at once: nothing waits for a link, so priority orders nothing here.
  void post_send(int peer, uint64_t tag, const void* buffer, size_t bytes, uint8_t,
                 TransferCallback done) override {
    group_.send(rank_, peer, tag, buffer, bytes, std::move(done));
  }
  void recv(int peer, uint64_t tag, void* buffer, size_t bytes, TransferCallback done) override {
    MessageCallback sized = [done = std::move(done)](bool ok, size_t, const std::string& e) {
      done(ok, e);
    };
    group_.recv(rank_, peer, tag, {buffer, bytes, std::move(sized), true});
  }
  void recv_message(int peer, uint64_t tag, void* buffer, size_t capacity,
                    MessageCallback done) override {
    group_.recv(rank_, peer, tag, {buffer, capacity, std::move(done), false});
  }

 private:
  InProcGroup& group_;
  int rank_;
};

CollectiveTransport& InProcGroup::member(int rank) {
  return *members_[static_cast<size_t>(rank)];
}

InProcGroup::InProcGroup(int size) {
  for (int r = 0; r < size; ++r) members_.push_back(std::make_unique<Member>(*this, r));
  delivery_ = std::thread([this] { run_callbacks(); });
}

InProcGroup::~InProcGroup() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  delivery_.join();
}

void InProcGroup::deliver(std::vector<char>& data, PostedRecv& recv) {
  auto done = std::move(recv.done);
  size_t size = data.size();
  if (size > recv.bytes || (recv.exact && size != recv.bytes)) {
    std::string why = std::to_string(size) + " bytes arrived, " + std::to_string(recv.bytes) +
                      (recv.exact ? " expected" : " posted");
    callbacks_.push_back([done, why] { done(false, 0, why); });
    return;
  }
  if (size > 0) std::memcpy(recv.buffer, data.data(), size);
  callbacks_.push_back([done, size] { done(true, size, ""); });
}

void InProcGroup::send(int from, int to, uint64_t tag, const void* buffer, size_t bytes,
                       TransferCallback done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<char> data(static_cast<const char*>(buffer),
                           static_cast<const char*>(buffer) + bytes);
    Key key{to, from, tag};
    auto it = posted_.find(key);
    if (it != posted_.end() && !it->second.empty()) {
      deliver(data, it->second.front());
      it->second.pop_front();
    } else {
      unexpected_[key].push_back(std::move(data));
    }
    callbacks_.push_back([done] { done(true, ""); });
  }
  cv_.notify_one();
}

void InProcGroup::recv(int to, int from, uint64_t tag, PostedRecv posted) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Key key{to, from, tag};
    auto it = unexpected_.find(key);
    if (it != unexpected_.end() && !it->second.empty()) {
      deliver(it->second.front(), posted);
      it->second.pop_front();
    } else {
      posted_[key].push_back(std::move(posted));
    }
  }
  cv_.notify_one();
}

void InProcGroup::run_callbacks() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !callbacks_.empty(); });
    if (callbacks_.empty()) return;
    auto fn = std::move(callbacks_.front());
    callbacks_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace px
