// The C ABI as the torch.distributed backend calls it: the functions of the libparallax.so.1
// the Python package loaded (parallax.library_path), looked up by dlopen/dlsym on that same
// file. The backend is a binding like the others: it links nothing of libparallax, so the
// package's search order (parallax/_lib.py) is the only one, and the px_client the package
// connected is valid here (one library instance in the process).
#pragma once

#include <string>

#include "parallax_c.h"

namespace pxc10d {

struct PxLibrary {
  std::string path;
  decltype(&px_abi_version) abi_version = nullptr;
  decltype(&px_status_name) status_name = nullptr;
  decltype(&px_last_error) last_error = nullptr;
  decltype(&px_world) world = nullptr;
  decltype(&px_client_fd) client_fd = nullptr;
  decltype(&px_progress) progress = nullptr;
  decltype(&px_register_dense) register_dense = nullptr;
  decltype(&px_alloc) alloc = nullptr;
  decltype(&px_free) free = nullptr;
  decltype(&px_op_options_init) op_options_init = nullptr;
  decltype(&px_allreduce_ex) allreduce_ex = nullptr;
  decltype(&px_broadcast_ex) broadcast_ex = nullptr;
  decltype(&px_allgather_ex) allgather_ex = nullptr;
  decltype(&px_reduce_scatter_ex) reduce_scatter_ex = nullptr;
  decltype(&px_alltoallv_ex) alltoallv_ex = nullptr;
  decltype(&px_test) test = nullptr;
  decltype(&px_request_free) request_free = nullptr;
  decltype(&px_request_error) request_error = nullptr;

  // The library at path (already loaded by the Python package); throws std::runtime_error
  // naming the path and what is missing.
  static const PxLibrary& open(const std::string& path);
};

}  // namespace pxc10d
