#include "transport/ipc/control_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace px {

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string finish_frame(flatbuffers::FlatBufferBuilder& builder, control::Body type,
                         flatbuffers::Offset<void> body) {
  auto message = control::CreateMessage(builder, kControlProtocolVersion, type, body);
  builder.Finish(message);
  uint32_t n = builder.GetSize();
  std::string frame(4 + n, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(frame.data() + 4, builder.GetBufferPointer(), n);
  return frame;
}

const control::Message* parse_frame(const std::string& payload, std::string* error) {
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  if (!control::VerifyMessageBuffer(verifier)) {
    *error = "control frame is not a valid message";
    return nullptr;
  }
  const auto* message = control::GetMessage(payload.data());
  if (message->protocol_version() != kControlProtocolVersion) {
    *error = "control protocol version " + std::to_string(message->protocol_version()) +
             " (expected " + std::to_string(kControlProtocolVersion) + ")";
    return nullptr;
  }
  // The verifier accepts a union whose type is set and whose value is absent, and every
  // handler (the daemon's and the client's) dereferences body_as_X() unchecked: a frame
  // naming a body type without a body crashed parallaxd (found by
  // tests/fuzz/control_fuzz.cc; regressions/control/stats-request-without-body).
  if (message->body_type() == control::Body::NONE || !message->body()) {
    *error = "control message has no body";
    return nullptr;
  }
  return message;
}

int FrameDecoder::next(std::string* payload, std::string* error) {
  if (buffer_.size() < 4) return 0;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<uint8_t>(buffer_[i])) << (8 * i);
  if (n == 0 || n > kMaxControlFrameBytes) {
    *error = "control frame length " + std::to_string(n) + " out of range";
    return -1;
  }
  if (buffer_.size() < 4 + static_cast<size_t>(n)) return 0;
  payload->assign(buffer_, 4, n);
  buffer_.erase(0, 4 + static_cast<size_t>(n));
  return 1;
}

namespace {

// Waits for events on fd until deadline; 1 ready, 0 deadline, -1 error.
int wait_fd(int fd, short events, int64_t deadline_ns) {
  for (;;) {
    int64_t left_ms = deadline_ns < 0 ? -1 : (deadline_ns - monotonic_ns() + 999999) / 1000000;
    if (deadline_ns >= 0 && left_ms <= 0) return 0;
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, static_cast<int>(left_ms > 0x7fffffff ? 0x7fffffff : left_ms));
    if (r > 0) return 1;
    if (r < 0 && errno != EINTR) return -1;
  }
}

}  // namespace

ssize_t send_with_fds(int fd, const char* data, size_t n, const int* fds, int nfds) {
  // More fds than `control` below holds would be copied past its end (found by
  // tests/unit/test_control_channel.cc): refuse them.
  if (nfds < 0 || nfds > kMaxFdsPerFrame) {
    errno = EINVAL;
    return -1;
  }
  iovec iov{const_cast<char*>(data), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  ssize_t r;
  do {
    r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (r < 0 && errno == EINTR);
  return r;
}

bool send_frame_blocking(int fd, const std::string& frame, int64_t deadline_ns, std::string* error,
                         bool* timed_out) {
  *timed_out = false;
  size_t sent = 0;
  while (sent < frame.size()) {
    ssize_t r = send_with_fds(fd, frame.data() + sent, frame.size() - sent, nullptr, 0);
    if (r > 0) {
      sent += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int w = wait_fd(fd, POLLOUT, deadline_ns);
      if (w == 0) {
        *timed_out = true;
        *error = "timed out sending to parallaxd";
        return false;
      }
      if (w > 0) continue;
    }
    *error = std::string("sending to parallaxd: ") + strerror(errno);
    return false;
  }
  return true;
}

bool recv_frame_blocking(int fd, FrameDecoder& decoder, std::string* payload, std::vector<int>* fds,
                         int64_t deadline_ns, std::string* error, bool* timed_out) {
  *timed_out = false;
  for (;;) {
    int got = decoder.next(payload, error);
    if (got == 1) return true;
    if (got < 0) return false;
    int w = wait_fd(fd, POLLIN, deadline_ns);
    if (w == 0) {
      *timed_out = true;
      *error = "timed out waiting for parallaxd";
      return false;
    }
    if (w < 0) {
      *error = std::string("poll: ") + strerror(errno);
      return false;
    }
    char buf[4096];
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) {
      *error = r == 0 ? "parallaxd closed the connection" : std::string("recv: ") + strerror(errno);
      return false;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fds) {
          fds->push_back(received);
        } else {
          ::close(received);
        }
      }
    }
    decoder.append(buf, static_cast<size_t>(r));
  }
}

}  // namespace px
