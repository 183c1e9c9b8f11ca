// A client's shared-memory arena: a sealed memfd, mapped by both the daemon and the client.
#pragma once

#include <cstdint>
#include <string>

#include "transport/ipc/shm_layout.h"
#include "transport/ipc/spsc_ring.h"

namespace px {

class SharedArena {
 public:
  SharedArena() = default;
  ~SharedArena();
  SharedArena(SharedArena&& other) noexcept;
  SharedArena& operator=(SharedArena&& other) noexcept;
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  // Daemon side: a new memfd with heap_bytes of heap, formatted and size-sealed.
  static bool create(uint64_t heap_bytes, uint32_t ring_capacity, SharedArena* out,
                     std::string* error);
  // Client side: maps an arena received from the daemon and validates its header.
  // Takes ownership of fd.
  static bool attach(int fd, SharedArena* out, std::string* error);

  int fd() const { return fd_; }
  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  const ArenaHeader& header() const { return *reinterpret_cast<const ArenaHeader*>(base_); }
  SpscRing<SubmitEntry> submit_ring() const;
  SpscRing<CompletionEntry> completion_ring() const;

  // True if [offset, offset + bytes) lies inside the heap (what the daemon checks before
  // touching any buffer a client names).
  bool heap_contains(uint64_t offset, uint64_t bytes) const;

  // Closes the fd but keeps the mapping (the daemon closes it once the client has it).
  void close_fd();

 private:
  void reset();
  int fd_ = -1;
  char* base_ = nullptr;
  uint64_t size_ = 0;
};

// An eventfd used as a doorbell between processes.
class Doorbell {
 public:
  Doorbell() = default;
  explicit Doorbell(int fd) : fd_(fd) {}
  ~Doorbell();
  Doorbell(Doorbell&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Doorbell& operator=(Doorbell&& o) noexcept;
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  static bool create(Doorbell* out, std::string* error);
  int fd() const { return fd_; }
  void ring() const;
  // Consumes pending rings; never blocks (the fd is non-blocking).
  void drain() const;

 private:
  int fd_ = -1;
};

}  // namespace px
