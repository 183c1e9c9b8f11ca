// Framing of control messages (length-prefixed FlatBuffers) on a Unix stream socket, with
// file descriptors passed alongside (SCM_RIGHTS).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "control_generated.h"

namespace px {

constexpr uint32_t kControlProtocolVersion = 1;
constexpr uint32_t kMaxControlFrameBytes = 64 * 1024;
constexpr int kMaxFdsPerFrame = 4;

// Finishes builder with a Message wrapping body and returns the framed bytes.
std::string finish_frame(flatbuffers::FlatBufferBuilder& builder, control::Body type,
                         flatbuffers::Offset<void> body);

// Verifies a frame payload; returns the message or nullptr (error says why).
const control::Message* parse_frame(const std::string& payload, std::string* error);

// Accumulates stream bytes and cuts them into frames.
class FrameDecoder {
 public:
  void append(const char* data, size_t n) { buffer_.append(data, n); }
  // 1: a frame was extracted; 0: need more bytes; -1: bad length prefix (error set).
  int next(std::string* payload, std::string* error);

 private:
  std::string buffer_;
};

// Blocking helpers for the client library. deadline_ns is CLOCK_MONOTONIC; all return false
// with error set on failure or when the deadline passes (*timed_out = true then).
bool send_frame_blocking(int fd, const std::string& frame, int64_t deadline_ns, std::string* error,
                         bool* timed_out);
bool recv_frame_blocking(int fd, FrameDecoder& decoder, std::string* payload, std::vector<int>* fds,
                         int64_t deadline_ns, std::string* error, bool* timed_out);

// Non-blocking send of a frame prefix with fds attached; returns bytes sent or -1 (errno).
ssize_t send_with_fds(int fd, const char* data, size_t n, const int* fds, int nfds);

int64_t monotonic_ns();

}  // namespace px
