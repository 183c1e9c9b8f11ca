// Priority with credits on each link (ByteScheduler / P3 style): the sends to one peer wait
// here, and only a window of bytes is handed to the provider at a time. When a send in the
// window finishes, its bytes come back as credit and the highest-priority waiting send goes
// next (equal priorities in the order they came). Collectives cut their tensors into chunks
// (chunk_bytes), so a large low-priority transfer already under way yields to an urgent one
// between two of its chunks: the urgent one waits for at most a window's bytes, not for the
// whole large transfer.
//
// Why this cannot deadlock: a receive matches a send by (peer, tag), never by arrival order,
// receives are not held here, and only eager sends (at most the provider's eager size, which
// the daemon's chunks are) wait in the window. An eager send completes once written, whether
// or not the peer has posted its receive, so the window always drains. A larger send
// (rendezvous) completes only when the peer posts the matching receive, which may wait for
// something queued behind it (another variable the peer's worker waits for first): holding
// credit while it waits could deadlock, so FabricEndpoint posts those at once, unordered, as
// before. Nodes need not agree on the order either: each orders only its own outgoing bytes.
//
// Pure logic, no locking (FabricEndpoint holds its mutex around it), so the order is tested
// without a fabric (tests/unit/test_send_window.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace px {

template <class Item>
class SendWindow {
 public:
  // window_bytes: the bytes each peer may have handed to the provider at once. A send larger
  // than the window still goes, alone, once nothing else is in flight to that peer.
  explicit SendWindow(size_t window_bytes = 1 << 20) : window_bytes_(window_bytes) {}

  void set_peers(size_t peers) { peers_.resize(peers); }
  size_t window_bytes() const { return window_bytes_; }

  void push(int peer, uint8_t priority, size_t bytes, Item item) {
    Peer& p = peers_[static_cast<size_t>(peer)];
    // Larger priority first: the key sorts ascending, so it holds 255 - priority.
    uint64_t seq = next_seq_++;
    p.waiting.emplace(Key{255u - priority, seq}, Waiting{bytes, std::move(item)});
    p.arrivals.insert(seq);
  }

  // The waiting sends to peer that now fit its window, in the order they go; their bytes count
  // as in flight until finished().
  void take_ready(int peer, std::vector<Item>* out) {
    Peer& p = peers_[static_cast<size_t>(peer)];
    while (!p.waiting.empty()) {
      auto first = p.waiting.begin();
      size_t bytes = first->second.bytes;
      if (p.in_flight_bytes > 0 && p.in_flight_bytes + bytes > window_bytes_) return;
      // Counted when a send goes ahead of one that came before it: what priority changed.
      uint64_t seq = first->first.second;
      if (seq != *p.arrivals.begin()) ++overtakes_;
      p.arrivals.erase(seq);
      p.in_flight_bytes += bytes;
      out->push_back(std::move(first->second.item));
      p.waiting.erase(first);
    }
  }

  // A send taken by take_ready finished (or failed): its bytes are credit again.
  void finished(int peer, size_t bytes) {
    Peer& p = peers_[static_cast<size_t>(peer)];
    p.in_flight_bytes = bytes > p.in_flight_bytes ? 0 : p.in_flight_bytes - bytes;
  }

  // The peer failed: nothing of it is in flight any more (its operations were abandoned).
  void reset(int peer) { peers_[static_cast<size_t>(peer)].in_flight_bytes = 0; }

  // Removes the waiting sends for which matches(item) holds, appending them to *dropped.
  template <class Matches>
  void drop_if(const Matches& matches, std::vector<Item>* dropped) {
    for (Peer& p : peers_) {
      for (auto it = p.waiting.begin(); it != p.waiting.end();) {
        if (matches(it->second.item)) {
          dropped->push_back(std::move(it->second.item));
          p.arrivals.erase(it->first.second);
          it = p.waiting.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  size_t in_flight_bytes(int peer) const {
    return peers_[static_cast<size_t>(peer)].in_flight_bytes;
  }
  size_t waiting(int peer) const { return peers_[static_cast<size_t>(peer)].waiting.size(); }
  // How many sends went ahead of a send that had come before them.
  uint64_t overtakes() const { return overtakes_; }

 private:
  using Key = std::pair<uint32_t, uint64_t>;  // (255 - priority, arrival)
  struct Waiting {
    size_t bytes;
    Item item;
  };
  struct Peer {
    std::map<Key, Waiting> waiting;
    std::set<uint64_t> arrivals;  // the waiting sends' arrival numbers: the oldest is first
    size_t in_flight_bytes = 0;
  };

  size_t window_bytes_;
  uint64_t next_seq_ = 0;
  uint64_t overtakes_ = 0;
  std::vector<Peer> peers_;
};

}  // namespace px
