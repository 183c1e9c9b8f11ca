// Fuzz target: the inter-daemon protocol decoder, what a daemon does with bytes from
// another daemon's control connection (daemon/cluster): EnvelopeReader cuts the stream into
// Cap'n Proto envelopes and checks each one (length, parse, protocol version, cluster name,
// check_envelope), then the coordinator and the members read the body's fields, and the
// coordinator's Agreement takes the jobs and variables reported to it.
//
// Contract: no crash, no sanitizer report, no leak, and no exception escaping feed(); a
// refused stream comes with a reason; an envelope handed to the visitor carries our
// protocol version and cluster name (or is a Reject), and its node indices, local sizes and
// counts are within what the readers index with them: every node index below the node
// count, a JobWorld's local sizes one per node of its epoch (1 to the node count: the member
// checks its epoch's count), each in 1..kMaxWireLocalSize (so a job's world size fits an
// int), an Agreement verdict's local sizes one per node.
#include <string>
#include <vector>

#include "daemon/cluster/agreement.h"
#include "daemon/cluster/device_routes.h"
#include "fuzz_check.h"
#include "fuzz_inputs.h"
#include "transport/fabric/cluster_wire.h"

namespace px::fuzz {
namespace {

uint64_t text(capnp::Text::Reader t) {
  return touch(t.begin(), t.size()) + std::string(t.cStr()).size();
}

uint64_t bytes(capnp::Data::Reader d) {
  return touch(d.begin(), d.size());
}

uint64_t check_node(uint32_t node) {
  PX_FUZZ_CHECK(node < static_cast<uint32_t>(kClusterNodes));
  return node;
}

uint64_t check_local_size(uint32_t size) {
  PX_FUZZ_CHECK(size >= 1 && size <= kMaxWireLocalSize);
  return size;
}

// The world a member computes from a JobWorld (server.cc): ranks and sizes as ints.
uint64_t job_world(capnp::List<uint32_t>::Reader sizes) {
  PX_FUZZ_CHECK(sizes.size() >= 1 && sizes.size() <= static_cast<unsigned>(kClusterNodes));
  int world_size = 0;
  for (uint32_t s : sizes) world_size += static_cast<int>(check_local_size(s));
  return static_cast<uint64_t>(world_size);
}

uint64_t verdict(const std::optional<Agreement::Verdict>& v) {
  if (!v) return 0;
  if (v->kind == Agreement::Verdict::Kind::kJobWorld)
    PX_FUZZ_CHECK(v->local_sizes.size() == static_cast<size_t>(kClusterNodes));
  PX_FUZZ_CHECK(v->to == Agreement::Verdict::kEveryNode || (v->to >= 0 && v->to < kClusterNodes));
  return v->job.size() + v->var.size() + v->message.size() + v->id;
}

// Reads every field a daemon reads, feeding the coordinator's agreement as
// cluster_coordinator.cc does (a member's reports name the node they come from).
uint64_t visit(Envelope::Reader e, Agreement& agreement, DeviceRoutes& routes) {
  PX_FUZZ_CHECK(e.getProtocolVersion() == kClusterProtocolVersion);
  auto body = e.getBody();
  PX_FUZZ_CHECK(std::string(e.getCluster()) == kClusterName ||
                body.which() == Envelope::Body::REJECT);
  uint64_t sum = e.getEpoch();
  switch (body.which()) {
    case Envelope::Body::JOIN: {
      auto j = body.getJoin();
      return sum + j.getNodeIndex() + j.getNodeCount() + bytes(j.getFabricAddress()) +
             text(j.getFabricProvider()) + text(j.getHost()) + bytes(j.getNonce()) +
             bytes(j.getAuth());
    }
    case Envelope::Body::REJECT:
      return sum + text(body.getReject().getReason());
    case Envelope::Body::ADDRESS_TABLE: {
      auto t = body.getAddressTable();
      for (auto a : t.getFabricAddresses()) sum += bytes(a);
      for (auto h : t.getHosts()) sum += text(h);
      return sum;
    }
    case Envelope::Body::JOB_JOIN: {
      auto j = body.getJobJoin();
      int node = static_cast<int>(check_node(j.getNodeIndex()));
      return sum +
             verdict(agreement.job_joined(node, j.getJob(), check_local_size(j.getLocalSize())));
    }
    case Envelope::Body::JOB_WORLD: {
      auto w = body.getJobWorld();
      return sum + text(w.getJob()) + job_world(w.getLocalSizes()) + w.getBarrierId();
    }
    case Envelope::Body::REGISTER_VAR: {
      auto r = body.getRegisterVar();
      Fingerprint f;
      f.dtype = static_cast<DType>(r.getDtype());
      f.count = r.getCount();
      f.op = static_cast<ReduceOp>(r.getOp());
      f.sparse = r.getSparse();
      f.dim = r.getDim();
      f.options = r.getOptions();
      int node = static_cast<int>(check_node(r.getNodeIndex()));
      return sum + f.describe().size() +
             verdict(agreement.var_registered(node, r.getJob(), r.getName(), f));
    }
    case Envelope::Body::VAR_READY: {
      auto v = body.getVarReady();
      return sum + text(v.getJob()) + text(v.getName()) + v.getGlobalId();
    }
    case Envelope::Body::VAR_MISMATCH: {
      auto v = body.getVarMismatch();
      return sum + text(v.getJob()) + text(v.getName()) + text(v.getMessage());
    }
    case Envelope::Body::NODE_LOST:
      return sum + check_node(body.getNodeLost().getNodeIndex()) +
             text(body.getNodeLost().getReason());
    case Envelope::Body::JOB_BROKEN: {
      auto b = body.getJobBroken();
      return sum + text(b.getJob()) + b.getBarrierId() + check_node(b.getNodeIndex()) +
             text(b.getReason());
    }
    case Envelope::Body::HEARTBEAT:
      return sum + check_node(body.getHeartbeat().getNodeIndex());
    case Envelope::Body::JOB_LEFT: {
      auto l = body.getJobLeft();
      int node = static_cast<int>(check_node(l.getNodeIndex()));
      return sum + verdict(agreement.job_left(node, l.getJob(), l.getBarrierId()));
    }
    case Envelope::Body::JOB_END:
      return sum + text(body.getJobEnd().getJob()) + body.getJobEnd().getBarrierId();
    case Envelope::Body::CHALLENGE:
      return sum + bytes(body.getChallenge().getNonce());
    case Envelope::Body::AUTH_PROOF:
      return sum + bytes(body.getAuthProof().getAuth());
    case Envelope::Body::DEVICE_ROUTE_REPORT: {
      auto r = body.getDeviceRouteReport();
      int node = static_cast<int>(check_node(r.getNodeIndex()));
      NodeDevice part{r.getDevice(), r.getMachine(), r.getPciBusId(), r.getNccl()};
      auto route = routes.reported(node, r.getBarrierId(), r.getGlobalId(), part);
      if (route) PX_FUZZ_CHECK(route->nccl == route->why.empty());
      return sum + (route ? route->why.size() + route->comm : 0);
    }
    case Envelope::Body::DEVICE_ROUTE: {
      auto d = body.getDeviceRoute();
      size_t id = d.getUniqueId().size();
      PX_FUZZ_CHECK(id == 0 || id == kWireNcclIdBytes);
      return sum + d.getBarrierId() + d.getGlobalId() + d.getNccl() + d.getComm() + id +
             text(d.getReason());
    }
    case Envelope::Body::NCCL_READY: {
      auto r = body.getNcclReady();
      int node = static_cast<int>(check_node(r.getNodeIndex()));
      auto turn = routes.ready(node, r.getBarrierId(), r.getGlobalId(), r.getStep());
      return sum + (turn ? turn->turn + 1 : 0);
    }
    case Envelope::Body::NCCL_TURN: {
      auto t = body.getNcclTurn();
      return sum + t.getBarrierId() + t.getGlobalId() + t.getStep() + t.getTurn();
    }
  }
  return sum;  // a body newer than this schema: the daemon logs it as unexpected
}

}  // namespace
}  // namespace px::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace px::fuzz;
  if (size == 0) return 0;
  size_t split = split_point(data, size);
  const char* stream = reinterpret_cast<const char*>(data + 1);
  size_t n = size - 1;
  split = split > n ? n : split;
  px::EnvelopeReader reader(kClusterName, kClusterNodes);
  px::Agreement agreement(kClusterNodes, [](int node) { return "node " + std::to_string(node); });
  px::DeviceRoutes routes(
      kClusterNodes, [](int node) { return "node " + std::to_string(node); },
      [](std::string* id, std::string*) {
        id->assign(px::kWireNcclIdBytes, 'i');
        return true;
      });
  uint64_t sink = 0;
  auto on_envelope = [&](Envelope::Reader e) { sink += visit(e, agreement, routes); };
  std::string error;
  bool ok = reader.feed(stream, split, on_envelope, &error) &&
            reader.feed(stream + split, n - split, on_envelope, &error);
  if (!ok) PX_FUZZ_CHECK(!error.empty());
  px::fuzz::sink = px::fuzz::sink + sink;
  return 0;
}
