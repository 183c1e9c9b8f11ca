// Framing of daemon<->daemon control messages: uint32 length + capnp flat array.
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "protocol.capnp.h"

namespace px {

constexpr uint32_t kClusterProtocolVersion = 10;  // 2: sparse, 3: JobBroken, 4: partitions,
                                                  // 5: sparse header and rows in one message,
                                                  // 6: sparse requests per partition group,
                                                  // 7: Heartbeat (a version-6 daemon would
                                                  // drop a node that sends one),
                                                  // 8: JobLeft/JobEnd, JobBroken.clean,
                                                  // Challenge/AuthProof,
                                                  // 9: epochs (a cluster re-forms),
                                                  // 10: device routes, NCCL turns
// An NCCL unique id (ncclUniqueId) in a DeviceRoute: empty or exactly this long.
constexpr size_t kWireNcclIdBytes = 128;
constexpr uint32_t kMaxClusterFrameBytes = 16u << 20;
// Workers of one job on one node (the session refuses more): a JobJoin's or JobWorld's local
// size beyond it is refused on the wire, so a job's world size cannot overflow an int.
constexpr uint32_t kMaxWireLocalSize = 4096;

// The checks on an envelope's fields that capnp cannot make and the code reading it relies
// on: a node index (other than a Join's, which the coordinator checks and answers) below
// node_count, a JobWorld's local sizes one per node, every local size in
// 1..kMaxWireLocalSize. False with error naming the message and the field. (The contract
// tests/fuzz/cluster_fuzz.cc checks: before it, node indices and a JobWorld's local sizes
// were taken unchecked, so a JobWorld with fewer sizes than nodes left a job's node_sizes
// short; regressions/cluster.)
bool check_envelope(Envelope::Reader envelope, int node_count, std::string* error);

// Serialises a finished message with its length prefix.
std::string frame_envelope(capnp::MessageBuilder& message);

// Cuts a byte stream into envelopes and hands each to the visitor, after checking it
// parses, carries our protocol version, names our cluster and passes check_envelope for a
// cluster of node_count nodes. Returns false (error set) on the first bad frame: the
// caller drops the connection.
class EnvelopeReader {
 public:
  EnvelopeReader(std::string cluster, int node_count)
      : cluster_(std::move(cluster)), node_count_(node_count) {}
  bool feed(const char* data, size_t n, const std::function<void(Envelope::Reader)>& visit,
            std::string* error);

 private:
  std::string cluster_;
  int node_count_;
  std::string buffer_;
};

}  // namespace px
