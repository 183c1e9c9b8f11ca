#include "daemon/cluster/device_routes.h"

namespace px {

DeviceRoutes::DeviceRoutes(int node_count, std::function<std::string(int)> node_label,
                           MakeId make_id)
    : node_count_(node_count), node_label_(std::move(node_label)), make_id_(std::move(make_id)) {}

std::string DeviceRoutes::why_not_nccl(const std::vector<std::optional<NodeDevice>>& parts) const {
  for (int n = 0; n < node_count_; ++n)
    if (!parts[static_cast<size_t>(n)]->device) return node_label_(n) + " gave host memory";
  for (int n = 0; n < node_count_; ++n)
    if (parts[static_cast<size_t>(n)]->nccl.empty()) return node_label_(n) + " has no NCCL";
  const std::string& first = parts[0]->nccl;
  for (int n = 1; n < node_count_; ++n)
    if (parts[static_cast<size_t>(n)]->nccl != first)
      return "NCCL " + first + " on " + node_label_(0) + " but " +
             parts[static_cast<size_t>(n)]->nccl + " on " + node_label_(n);
  for (int a = 0; a < node_count_; ++a)
    for (int b = a + 1; b < node_count_; ++b) {
      const NodeDevice& x = *parts[static_cast<size_t>(a)];
      const NodeDevice& y = *parts[static_cast<size_t>(b)];
      if (x.machine == y.machine && x.pci_bus_id == y.pci_bus_id)
        return node_label_(a) + " and " + node_label_(b) + " reduce on one GPU (" + x.pci_bus_id +
               "), and NCCL takes one rank per GPU";
    }
  return "";
}

std::optional<DeviceRoutes::Route> DeviceRoutes::reported(int node, uint32_t run, uint32_t var,
                                                          const NodeDevice& part) {
  auto it = runs_.find(run);
  if (node < 0 || node >= node_count_ || it == runs_.end()) return std::nullopt;
  Run& r = it->second;
  if (r.routed.count(var)) return std::nullopt;
  auto& parts = r.reports[var];
  parts.resize(static_cast<size_t>(node_count_));
  if (parts[static_cast<size_t>(node)]) return std::nullopt;
  parts[static_cast<size_t>(node)] = part;
  for (const auto& p : parts)
    if (!p) return std::nullopt;
  Route route;
  route.run = run;
  route.var = var;
  route.why = why_not_nccl(parts);
  if (route.why.empty()) {
    std::vector<std::string> set;
    for (const auto& p : parts) set.push_back(p->machine + "/" + p->pci_bus_id);
    auto it = r.comms.find(set);
    if (it != r.comms.end()) {
      route.comm = it->second;
    } else if (make_id_(&route.unique_id, &route.why)) {
      route.comm = static_cast<uint32_t>(r.comms.size()) + 1;
      r.comms.emplace(set, route.comm);
    } else {
      route.why = "no NCCL unique id on " + node_label_(0) + ": " + route.why;
    }
  }
  route.nccl = route.why.empty();
  r.reports.erase(var);
  r.routed[var] = route.nccl;
  return route;
}

std::optional<DeviceRoutes::Turn> DeviceRoutes::ready(int node, uint32_t run, uint32_t var,
                                                      uint64_t step) {
  auto it = runs_.find(run);
  if (node < 0 || node >= node_count_ || it == runs_.end()) return std::nullopt;
  Run& r = it->second;
  auto routed = r.routed.find(var);
  if (routed == r.routed.end() || !routed->second) return std::nullopt;
  auto& nodes = r.ready[{var, step}];
  nodes.resize(static_cast<size_t>(node_count_));
  nodes[static_cast<size_t>(node)] = true;
  for (bool b : nodes)
    if (!b) return std::nullopt;
  r.ready.erase({var, step});
  return Turn{run, var, step, r.next_turn++};
}

}  // namespace px
