// parallax._c10d: the "parallax" torch.distributed backend's native part. Python registers
// it (parallax/torch/backend.py); this module only constructs process groups.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>  // c10::intrusive_ptr as a pybind11 holder

#include "clients/python/c10d/process_group.h"

namespace py = pybind11;

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "The native part of the parallax torch.distributed backend (parallax.torch).";
  // torch's bindings of ProcessGroup and Store come first: ours derive from them.
  py::module_::import("torch.distributed");
  py::class_<pxc10d::ProcessGroupParallax, c10::intrusive_ptr<pxc10d::ProcessGroupParallax>,
             c10d::ProcessGroup>(m, "ProcessGroupParallax", py::dynamic_attr())
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_id,
                       std::vector<int64_t> global_ranks, uintptr_t client,
                       const std::string& library_path, size_t max_variables) {
             pxc10d::GroupOptions options;
             options.library_path = library_path;
             options.client = client;
             options.group_id = group_id;
             options.global_ranks = std::move(global_ranks);
             options.timeout = timeout;
             options.max_variables = max_variables;
             return c10::make_intrusive<pxc10d::ProcessGroupParallax>(store, rank, size, options);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("group_id"), py::arg("global_ranks"), py::arg("client"), py::arg("library_path"),
           py::arg("max_variables"),
           // The store exchange waits for every rank: without Python's lock.
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("daemon_ranks", &pxc10d::ProcessGroupParallax::daemon_ranks,
                             "The daemons' rank of each torch rank.")
      .def_property_readonly("variables_registered",
                             &pxc10d::ProcessGroupParallax::variables_registered,
                             "Variables this group registered with the daemons.");
}
