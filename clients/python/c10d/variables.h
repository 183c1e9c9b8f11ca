// The daemons' variables behind a process group's collectives. Every collective is a step
// of a registered dense variable, and every rank must make the same steps of the same
// variables, so variables are named by what every rank sees alike: the group, the kind of
// collective, and a slot, the order in which this rank first met the variable's signature
// (dtype, op, element count). Ranks that disagree on the dtype or size of a collective the
// first time they meet it register one slot with two signatures: the daemons refuse that at
// once (PX_ERR_MISMATCH, naming the variable), instead of two variables waiting for
// each other until a deadline.
//
// How many: all_to_all moves any blocks through one variable per group (the count of an
// alltoall variable only bounds a block); collectives that move data without reducing it
// (broadcast, all_gather, scatter, gather) round their size up to a size class (at most 1/8 more: 8
// classes per power of two), so a job whose object sizes grow (all_gather_object) registers a
// bounded number of them; reductions register one variable per distinct dtype, op and size, up to
// the group's limit (PARALLAX_C10D_MAX_VARIABLES, default 1024), past which the collective is
// refused with a message saying so (a reduction's size cannot be padded: min and max would see the
// padding).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "clients/python/c10d/px_library.h"

namespace pxc10d {

enum class Kind { kAllreduce, kBroadcast, kAllgather, kBarrier, kReduceScatter, kAlltoall };

const char* kind_name(Kind kind);

// The smallest size class holding count elements: count itself up to 16, else count
// rounded up to its 4 leading bits.
uint64_t size_class(uint64_t count);

class Variables {
 public:
  Variables(const PxLibrary& px, px_client* client, std::string prefix, size_t limit);

  // The variable of this signature, registered on first use (a round trip to the daemon,
  // and on a cluster to the coordinator). Throws std::runtime_error with the daemon's
  // message, or past the limit.
  px_var* get(Kind kind, px_dtype dtype, px_reduce_op op, uint64_t count);

  size_t registered() const;

 private:
  using Signature = std::tuple<int, int, int, uint64_t>;
  const PxLibrary& px_;
  px_client* client_;
  std::string prefix_;
  size_t limit_;
  mutable std::mutex mutex_;
  std::map<Signature, px_var*> vars_;
  std::map<int, int> next_slot_;  // per kind
};

}  // namespace pxc10d
