// Framing of daemon<->daemon control messages: uint32 length + capnp flat array.
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "protocol.capnp.h"

namespace px {

constexpr uint32_t kClusterProtocolVersion = 8;  // 2: sparse, 3: JobBroken, 4: partitions,
                                                 // 5: sparse header and rows in one message,
                                                 // 6: sparse requests per partition group,
                                                 // 7: Heartbeat (a version-6 daemon would
                                                 // drop a node that sends one),
                                                 // 8: JobLeft/JobEnd, JobBroken.clean,
                                                 // Challenge/AuthProof
constexpr uint64_t kClusterEpoch = 1;
constexpr uint32_t kMaxClusterFrameBytes = 16u << 20;

// Serialises a finished message with its length prefix.
std::string frame_envelope(capnp::MessageBuilder& message);

// Cuts a byte stream into envelopes and hands each to the visitor, after checking it
// parses, carries our protocol version, and names our cluster. Returns false (error set)
// on the first bad frame: the caller drops the connection.
class EnvelopeReader {
 public:
  explicit EnvelopeReader(std::string cluster) : cluster_(std::move(cluster)) {}
  bool feed(const char* data, size_t n, const std::function<void(Envelope::Reader)>& visit,
            std::string* error);

 private:
  std::string cluster_;
  std::string buffer_;
};

}  // namespace px
