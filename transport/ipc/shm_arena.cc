#include "transport/ipc/shm_arena.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

namespace px {

SharedArena::~SharedArena() {
  reset();
}

SharedArena::SharedArena(SharedArena&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

SharedArena& SharedArena::operator=(SharedArena&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SharedArena::reset() {
  if (base_) munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

void SharedArena::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool SharedArena::create(uint64_t heap_bytes, uint32_t ring_capacity, SharedArena* out,
                         std::string* error) {
  ArenaLayout layout = compute_arena_layout(heap_bytes, ring_capacity);
  int fd = memfd_create("parallax-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *error = std::string("memfd_create: ") + strerror(errno);
    return false;
  }
  SharedArena arena;
  arena.fd_ = fd;
  if (ftruncate(fd, static_cast<off_t>(layout.arena_bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    *error = std::string("sizing the arena: ") + strerror(errno);
    return false;
  }
  void* base = mmap(nullptr, layout.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *error = std::string("mmap arena: ") + strerror(errno);
    return false;
  }
  arena.base_ = static_cast<char*>(base);
  arena.size_ = layout.arena_bytes;
  auto* h = new (base) ArenaHeader();
  h->magic = kArenaMagic;
  h->layout_version = kArenaLayoutVersion;
  h->ring_capacity = ring_capacity;
  h->arena_bytes = layout.arena_bytes;
  h->submit_ring_offset = layout.submit_ring_offset;
  h->completion_ring_offset = layout.completion_ring_offset;
  h->heap_offset = layout.heap_offset;
  h->heap_bytes = layout.heap_bytes;
  SpscRing<SubmitEntry>::format(arena.base_ + layout.submit_ring_offset);
  SpscRing<CompletionEntry>::format(arena.base_ + layout.completion_ring_offset);
  *out = std::move(arena);
  return true;
}

bool SharedArena::attach(int fd, SharedArena* out, std::string* error) {
  SharedArena arena;
  arena.fd_ = fd;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(ArenaHeader))) {
    *error = "the arena fd from the daemon is not a usable memory file";
    return false;
  }
  void* base =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *error = std::string("mmap arena: ") + strerror(errno);
    return false;
  }
  arena.base_ = static_cast<char*>(base);
  arena.size_ = static_cast<uint64_t>(st.st_size);
  if (!arena_header_valid(arena.header(), arena.size_)) {
    *error =
        "the arena from the daemon has an unknown layout (daemon and library versions differ?)";
    return false;
  }
  *out = std::move(arena);
  return true;
}

SpscRing<SubmitEntry> SharedArena::submit_ring() const {
  return SpscRing<SubmitEntry>(base_ + header().submit_ring_offset, header().ring_capacity);
}

SpscRing<CompletionEntry> SharedArena::completion_ring() const {
  return SpscRing<CompletionEntry>(base_ + header().completion_ring_offset, header().ring_capacity);
}

bool SharedArena::heap_contains(uint64_t offset, uint64_t bytes) const {
  const ArenaHeader& h = header();
  if (offset < h.heap_offset) return false;
  uint64_t end = h.heap_offset + h.heap_bytes;
  return offset <= end && bytes <= end - offset;
}

Doorbell::~Doorbell() {
  if (fd_ >= 0) ::close(fd_);
}

Doorbell& Doorbell::operator=(Doorbell&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

bool Doorbell::create(Doorbell* out, std::string* error) {
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) {
    *error = std::string("eventfd: ") + strerror(errno);
    return false;
  }
  *out = Doorbell(fd);
  return true;
}

void Doorbell::ring() const {
  uint64_t one = 1;
  // EAGAIN means the counter is saturated: the peer is already signalled.
  ssize_t n = ::write(fd_, &one, sizeof one);
  (void)n;
}

void Doorbell::drain() const {
  uint64_t value;
  ssize_t n = ::read(fd_, &value, sizeof value);
  (void)n;
}

}  // namespace px
