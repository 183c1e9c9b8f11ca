#include "transport/fabric/cluster_wire.h"

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

namespace px {

std::string frame_envelope(capnp::MessageBuilder& message) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  uint32_t n = static_cast<uint32_t>(bytes.size());
  std::string frame(4 + bytes.size(), '\0');
  for (int i = 0; i < 4; ++i)
    frame[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(frame.data() + 4, bytes.begin(), bytes.size());
  return frame;
}

namespace {

bool check_node(const char* what, uint32_t node, int node_count, std::string* error) {
  if (node < static_cast<uint32_t>(node_count)) return true;
  *error = std::string(what) + " names node " + std::to_string(node) + " of a cluster of " +
           std::to_string(node_count);
  return false;
}

bool check_local_size(const char* what, uint32_t size, std::string* error) {
  if (size >= 1 && size <= kMaxWireLocalSize) return true;
  *error = std::string(what) + " has local size " + std::to_string(size) + ", not in 1.." +
           std::to_string(kMaxWireLocalSize);
  return false;
}

}  // namespace

bool check_envelope(Envelope::Reader envelope, int node_count, std::string* error) {
  auto body = envelope.getBody();
  switch (body.which()) {
    case Envelope::Body::JOB_JOIN:
      return check_node("JobJoin", body.getJobJoin().getNodeIndex(), node_count, error) &&
             check_local_size("JobJoin", body.getJobJoin().getLocalSize(), error);
    case Envelope::Body::JOB_WORLD: {
      // One per node of the epoch: every node, or (membership on etcd) the survivors of a
      // lost one; the member checks the epoch's count.
      auto sizes = body.getJobWorld().getLocalSizes();
      if (sizes.size() == 0 || sizes.size() > static_cast<unsigned>(node_count)) {
        *error = "JobWorld has " + std::to_string(sizes.size()) + " local sizes for at most " +
                 std::to_string(node_count) + " nodes";
        return false;
      }
      for (uint32_t size : sizes)
        if (!check_local_size("JobWorld", size, error)) return false;
      return true;
    }
    case Envelope::Body::REGISTER_VAR:
      return check_node("RegisterVar", body.getRegisterVar().getNodeIndex(), node_count, error);
    case Envelope::Body::NODE_LOST:
      return check_node("NodeLost", body.getNodeLost().getNodeIndex(), node_count, error);
    case Envelope::Body::JOB_BROKEN:
      return check_node("JobBroken", body.getJobBroken().getNodeIndex(), node_count, error);
    case Envelope::Body::HEARTBEAT:
      return check_node("Heartbeat", body.getHeartbeat().getNodeIndex(), node_count, error);
    case Envelope::Body::JOB_LEFT:
      return check_node("JobLeft", body.getJobLeft().getNodeIndex(), node_count, error);
    case Envelope::Body::DEVICE_ROUTE_REPORT:
      return check_node("DeviceRouteReport", body.getDeviceRouteReport().getNodeIndex(), node_count,
                        error);
    case Envelope::Body::NCCL_READY:
      return check_node("NcclReady", body.getNcclReady().getNodeIndex(), node_count, error);
    case Envelope::Body::DEVICE_ROUTE: {
      size_t id = body.getDeviceRoute().getUniqueId().size();
      if (id != 0 && id != kWireNcclIdBytes) {
        *error = "DeviceRoute carries an NCCL unique id of " + std::to_string(id) + " bytes, not " +
                 std::to_string(kWireNcclIdBytes);
        return false;
      }
      return true;
    }
    default:
      return true;
  }
}

bool EnvelopeReader::feed(const char* data, size_t n,
                          const std::function<void(Envelope::Reader)>& visit, std::string* error) {
  buffer_.append(data, n);
  while (buffer_.size() >= 4) {
    uint32_t len = 0;
    for (int i = 0; i < 4; ++i)
      len |= static_cast<uint32_t>(static_cast<uint8_t>(buffer_[static_cast<size_t>(i)]))
             << (8 * i);
    if (len == 0 || len % sizeof(capnp::word) != 0 || len > kMaxClusterFrameBytes) {
      *error = "bad frame length " + std::to_string(len);
      return false;
    }
    if (buffer_.size() < 4 + static_cast<size_t>(len)) return true;
    std::vector<capnp::word> words(len / sizeof(capnp::word));
    std::memcpy(words.data(), buffer_.data() + 4, len);
    buffer_.erase(0, 4 + static_cast<size_t>(len));
    try {
      capnp::ReaderOptions options;
      options.traversalLimitInWords = len / sizeof(capnp::word) * 4;
      capnp::FlatArrayMessageReader reader(
          kj::ArrayPtr<const capnp::word>(words.data(), words.size()), options);
      Envelope::Reader envelope = reader.getRoot<Envelope>();
      if (envelope.getProtocolVersion() != kClusterProtocolVersion) {
        *error = "protocol version " + std::to_string(envelope.getProtocolVersion()) +
                 ", this daemon speaks " + std::to_string(kClusterProtocolVersion);
        return false;
      }
      std::string cluster = envelope.getCluster();
      // A rejection is readable whatever cluster sent it: it says why we do not belong.
      if (cluster != cluster_ && envelope.getBody().which() != Envelope::Body::REJECT) {
        *error = "cluster name '" + cluster + "', this daemon's is '" + cluster_ + "'";
        return false;
      }
      std::string bad;
      if (!check_envelope(envelope, node_count_, &bad)) {
        *error = "malformed message: " + bad;
        return false;
      }
      visit(envelope);
    } catch (const kj::Exception& e) {
      *error = std::string("malformed message: ") + e.getDescription().cStr();
      return false;
    }
  }
  return true;
}

}  // namespace px
