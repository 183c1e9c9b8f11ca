// The control plane's part in device routes (device_routes.h): a node's reports of its part
// of a variable's first cross-node device allreduce and of its NCCL steps being ready go to
// the coordinator; the coordinator's routes and turns go to every node, itself included, in
// the order decided (each member's one connection keeps it).
#include "daemon/cluster/cluster_internal.h"
#include "daemon/common/log.h"

namespace px {

using cluster_detail::build;

namespace {

kj::ArrayPtr<const kj::byte> bytes_of(const std::string& s) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

}  // namespace

void Cluster::report_device_route(uint32_t barrier_id, uint32_t global_id, const NodeDevice& part) {
  report([&](Envelope::Body::Builder b) {
    auto r = b.initDeviceRouteReport();
    r.setBarrierId(barrier_id);
    r.setGlobalId(global_id);
    r.setNodeIndex(static_cast<uint32_t>(config_.node_index));
    r.setDevice(part.device);
    r.setMachine(part.machine);
    r.setPciBusId(part.pci_bus_id);
    r.setNccl(part.nccl);
  });
}

void Cluster::report_nccl_ready(uint32_t barrier_id, uint32_t global_id, uint64_t step) {
  report([&](Envelope::Body::Builder b) {
    auto r = b.initNcclReady();
    r.setBarrierId(barrier_id);
    r.setGlobalId(global_id);
    r.setStep(step);
    r.setNodeIndex(static_cast<uint32_t>(config_.node_index));
  });
}

// node: the reporter's node index (coordinator_handle checked it is in the epoch); the
// routes count nodes by rank.
void Cluster::coordinator_device_route(int node, Envelope::Reader envelope) {
  auto body = envelope.getBody();
  std::unique_ptr<capnp::MallocMessageBuilder> answer;
  if (body.which() == Envelope::Body::DEVICE_ROUTE_REPORT) {
    auto r = body.getDeviceRouteReport();
    if (r.getNodeIndex() != static_cast<uint32_t>(node)) {
      PX_LOG_WARN("cluster: %s reported another node's device route; ignored",
                  node_label(node).c_str());
      return;
    }
    NodeDevice part{r.getDevice(), r.getMachine(), r.getPciBusId(), r.getNccl()};
    auto route = device_routes_.reported(rank_of(node), r.getBarrierId(), r.getGlobalId(), part);
    if (!route) return;
    answer = build(config_.cluster, epoch_, [&](Envelope::Body::Builder b) {
      auto d = b.initDeviceRoute();
      d.setBarrierId(route->run);
      d.setGlobalId(route->var);
      d.setNccl(route->nccl);
      d.setComm(route->comm);
      d.setUniqueId(bytes_of(route->unique_id));
      d.setReason(route->why);
    });
  } else {
    auto r = body.getNcclReady();
    if (r.getNodeIndex() != static_cast<uint32_t>(node)) {
      PX_LOG_WARN("cluster: %s reported another node's NCCL step; ignored",
                  node_label(node).c_str());
      return;
    }
    auto turn = device_routes_.ready(rank_of(node), r.getBarrierId(), r.getGlobalId(), r.getStep());
    if (!turn) return;
    answer = build(config_.cluster, epoch_, [&](Envelope::Body::Builder b) {
      auto t = b.initNcclTurn();
      t.setBarrierId(turn->run);
      t.setGlobalId(turn->var);
      t.setStep(turn->step);
      t.setTurn(turn->turn);
    });
  }
  broadcast(frame_envelope(*answer));
  member_handle(answer->getRoot<Envelope>().asReader());
}

void Cluster::member_device_route(Envelope::Reader envelope) {
  auto body = envelope.getBody();
  if (body.which() == Envelope::Body::DEVICE_ROUTE) {
    auto d = body.getDeviceRoute();
    DeviceRoutes::Route route;
    route.run = d.getBarrierId();
    route.var = d.getGlobalId();
    route.nccl = d.getNccl();
    route.comm = d.getComm();
    auto id = d.getUniqueId();
    route.unique_id.assign(reinterpret_cast<const char*>(id.begin()), id.size());
    route.why = d.getReason();
    if (events_.device_route) events_.device_route(route);
    return;
  }
  auto t = body.getNcclTurn();
  DeviceRoutes::Turn turn{t.getBarrierId(), t.getGlobalId(), t.getStep(), t.getTurn()};
  if (events_.nccl_turn) events_.nccl_turn(turn);
}

}  // namespace px
