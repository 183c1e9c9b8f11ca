#include "clients/python/c10d/variables.h"

#include <stdexcept>

namespace pxc10d {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAlltoall:
      return "alltoall";
  }
  return "?";
}

uint64_t size_class(uint64_t count) {
  if (count <= 16) return count;
  int bits = 64 - __builtin_clzll(count);  // count < 2^bits
  uint64_t unit = uint64_t{1} << (bits - 4);
  return (count + unit - 1) / unit * unit;
}

Variables::Variables(const PxLibrary& px, px_client* client, std::string prefix, size_t limit)
    : px_(px), client_(client), prefix_(std::move(prefix)), limit_(limit) {}

size_t Variables::registered() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return vars_.size();
}

px_var* Variables::get(Kind kind, px_dtype dtype, px_reduce_op op, uint64_t count) {
  Signature signature{static_cast<int>(kind), dtype, op, count};
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = vars_.find(signature);
  if (it != vars_.end()) return it->second;
  if (vars_.size() >= limit_)
    throw std::runtime_error(
        "this process group has registered " + std::to_string(vars_.size()) +
        " variables with the daemons, its limit (PARALLAX_C10D_MAX_VARIABLES): each distinct "
        "dtype, op and size of a reduction takes one; raise the limit if the job needs more");
  int slot = next_slot_[static_cast<int>(kind)];
  std::string name = prefix_ + "." + kind_name(kind) + "." + std::to_string(slot);
  px_var* var = nullptr;
  px_status status = px_.register_dense(client_, name.c_str(), dtype, count, op, &var);
  if (status != PX_OK)
    throw std::runtime_error(std::string("registering variable '") + name + "' (" +
                             std::to_string(count) + " elements) failed with " +
                             px_.status_name(status) + ": " + px_.last_error());
  next_slot_[static_cast<int>(kind)] = slot + 1;
  vars_.emplace(signature, var);
  return var;
}

}  // namespace pxc10d
