// The ABI's layout pinned: a change to any public struct's size or field offsets, or to an
// enum's values, fails to compile here first. Bindings (Python ctypes, Rust, Julia) declare
// the same layouts; this is the list they are checked against.
#include <doctest/doctest.h>

#include <cstddef>

#include "parallax_c.h"
#include "transport/ipc/shm_layout.h"
#include "transport/kernels/dtype.h"

namespace {

static_assert(PX_ABI_VERSION == ((1u << 16) | 16u), "ABI 1.16");

// Enums are 32 bits wide whatever the compiler would choose (each has a 0x7fffffff member).
static_assert(sizeof(px_status) == 4 && sizeof(px_dtype) == 4 && sizeof(px_reduce_op) == 4 &&
              sizeof(px_memory_kind) == 4 && sizeof(px_optimizer) == 4 &&
              sizeof(px_initializer) == 4 && sizeof(px_consistency) == 4 && sizeof(px_route) == 4 &&
              sizeof(px_nonfinite) == 4 && sizeof(px_split) == 4);

// Public enums and the internal ones the daemon switches on agree value for value.
static_assert(static_cast<uint32_t>(PX_F32) == static_cast<uint32_t>(px::DType::kF32));
static_assert(static_cast<uint32_t>(PX_F64) == static_cast<uint32_t>(px::DType::kF64));
static_assert(static_cast<uint32_t>(PX_F16) == static_cast<uint32_t>(px::DType::kF16));
static_assert(static_cast<uint32_t>(PX_BF16) == static_cast<uint32_t>(px::DType::kBF16));
static_assert(static_cast<uint32_t>(PX_I32) == static_cast<uint32_t>(px::DType::kI32));
static_assert(static_cast<uint32_t>(PX_I64) == static_cast<uint32_t>(px::DType::kI64));
static_assert(px::kDTypeCount == 6);
static_assert(static_cast<uint32_t>(PX_SUM) == static_cast<uint32_t>(px::ReduceOp::kSum));
static_assert(static_cast<uint32_t>(PX_MEAN) == static_cast<uint32_t>(px::ReduceOp::kMean));
static_assert(static_cast<uint32_t>(PX_MIN) == static_cast<uint32_t>(px::ReduceOp::kMin));
static_assert(static_cast<uint32_t>(PX_MAX) == static_cast<uint32_t>(px::ReduceOp::kMax));
static_assert(static_cast<uint32_t>(PX_PROD) == static_cast<uint32_t>(px::ReduceOp::kProd));
static_assert(px::kReduceOpCount == 5);
static_assert(static_cast<uint32_t>(PX_MEMORY_HOST) ==
              static_cast<uint32_t>(px::MemoryKind::kHostArena));
static_assert(static_cast<uint32_t>(PX_MEMORY_CUDA) ==
              static_cast<uint32_t>(px::MemoryKind::kCudaDevice));

// Status values are part of the ABI: never renumbered.
static_assert(PX_OK == 0 && PX_ERR_INVALID == 1 && PX_ERR_VERSION == 2 && PX_ERR_CONNECT == 3 &&
              PX_ERR_TIMEOUT == 4 && PX_ERR_PEER_LOST == 5 && PX_ERR_MISMATCH == 6 &&
              PX_ERR_NOT_FOUND == 7 && PX_ERR_NO_MEMORY == 8 && PX_ERR_BUSY == 9 &&
              PX_ERR_PROTOCOL == 10 && PX_ERR_INDEX == 11 && PX_ERR_NOT_IMPLEMENTED == 12 &&
              PX_ERR_INTERNAL == 13 && PX_ERR_PERMISSION == 14 && PX_ERR_CANCELLED == 15 &&
              PX_ERR_MEMBERSHIP == 16);

static_assert(sizeof(px_connect_options) == 56);
static_assert(offsetof(px_connect_options, abi_version) == 4);
static_assert(offsetof(px_connect_options, socket_path) == 8);
static_assert(offsetof(px_connect_options, job_name) == 16);
static_assert(offsetof(px_connect_options, local_rank) == 24);
static_assert(offsetof(px_connect_options, local_size) == 28);
static_assert(offsetof(px_connect_options, timeout_ms) == 32);
static_assert(offsetof(px_connect_options, arena_bytes) == 40);
static_assert(offsetof(px_connect_options, wait_for_daemon) == 48);  // 1.3; 1.2 ended at 48

static_assert(sizeof(px_launch_info) == 40);  // 1.10
static_assert(offsetof(px_launch_info, local_rank) == 4);
static_assert(offsetof(px_launch_info, local_size) == 8);
static_assert(offsetof(px_launch_info, rank) == 12);
static_assert(offsetof(px_launch_info, launcher) == 16);
static_assert(offsetof(px_launch_info, job_name) == 24);
static_assert(offsetof(px_launch_info, socket_path) == 32);

static_assert(sizeof(px_alloc_options) == 16);
static_assert(offsetof(px_alloc_options, memory_kind) == 4);
static_assert(offsetof(px_alloc_options, device) == 8);
static_assert(sizeof(px_op_options) == 32);
static_assert(offsetof(px_op_options, memory_kind) == 4);
static_assert(offsetof(px_op_options, device) == 8);
static_assert(offsetof(px_op_options, priority) == 12);
static_assert(offsetof(px_op_options, stream) == 16);
static_assert(offsetof(px_op_options, root) == 24);

static_assert(sizeof(px_world_info) == 28);
static_assert(offsetof(px_world_info, node_index) == 4);
static_assert(offsetof(px_world_info, rank) == 12);
static_assert(offsetof(px_world_info, local_size) == 24);

static_assert(sizeof(px_var_stats) == 168);
static_assert(offsetof(px_var_stats, cache_hits) == 128);  // (1.14)
static_assert(offsetof(px_var_stats, cache_rows_flushed) == 160);
static_assert(offsetof(px_var_stats, ops) == 8);
static_assert(offsetof(px_var_stats, pull_steps) == 40);
static_assert(offsetof(px_var_stats, bytes_received) == 88);
static_assert(offsetof(px_var_stats, request_partitions) == 96);
static_assert(offsetof(px_var_stats, search_steps_left) == 104);
static_assert(offsetof(px_var_stats, restored_steps) == 112);

static_assert(sizeof(px_sparse_options) == 144);
static_assert(offsetof(px_sparse_options, optimizer) == 4);
static_assert(offsetof(px_sparse_options, learning_rate) == 8);
static_assert(offsetof(px_sparse_options, initializer) == 48);
static_assert(offsetof(px_sparse_options, init_seed) == 56);
static_assert(offsetof(px_sparse_options, init_std) == 80);
static_assert(offsetof(px_sparse_options, aggregation) == 88);
static_assert(offsetof(px_sparse_options, partitions) == 100);
static_assert(offsetof(px_sparse_options, route) == 104);
static_assert(offsetof(px_sparse_options, nonfinite) == 108);
static_assert(offsetof(px_sparse_options, alltoall_split) == 112);  // (1.5)
static_assert(offsetof(px_sparse_options, wire_dtype) == 116);
static_assert(offsetof(px_sparse_options, prefetch) == 120);    // (1.6)
static_assert(offsetof(px_sparse_options, cache_rows) == 128);  // (1.14)
static_assert(offsetof(px_sparse_options, cache_staleness) == 132);
static_assert(offsetof(px_sparse_options, replicas) == 136);  // (1.16)
static_assert(sizeof(px_dense_options) == 8);                 // (1.13)
static_assert(offsetof(px_dense_options, wire_dtype) == 4);

// The shared-memory entries libparallax and parallaxd exchange.
static_assert(sizeof(px::SubmitEntry) == 80 && sizeof(px::CompletionEntry) == 256);
static_assert(offsetof(px::CompletionEntry, flags) == 12);

}  // namespace

// The function callers built before 1.15 call (the header's macro of that name replaces it).
extern "C" void(px_connect_options_init)(px_connect_options* options);

TEST_CASE("abi layout: the *_init functions fill struct_size and the documented defaults") {
  px_connect_options c;
  px_connect_options_init(&c);  // the macro: this header's version
  CHECK(c.struct_size == sizeof c);
  CHECK(c.abi_version == PX_ABI_VERSION);
  CHECK(c.local_rank == -1);
  CHECK(c.wait_for_daemon == -1);
  // The function of that name, which callers built before 1.15 call: a 1.14 caller.
  px_connect_options legacy;
  (px_connect_options_init)(&legacy);
  CHECK(legacy.abi_version == ((1u << 16) | 14u));
  CHECK(legacy.struct_size == sizeof legacy);
  px_op_options o;
  px_op_options_init(&o);
  CHECK(o.struct_size == sizeof o);
  CHECK(o.memory_kind == PX_MEMORY_HOST);
  CHECK(o.device == -1);
  CHECK(o.priority == 0);
  CHECK(o.stream == nullptr);
  CHECK(o.root == 0);
  px_sparse_options s;
  px_sparse_options_init(&s);
  CHECK(s.struct_size == sizeof s);
  CHECK(s.replicas == 1);  // (1.16) no copies
  CHECK(s.reserved2 == 0);
  CHECK(px_abi_version() == PX_ABI_VERSION);
  for (int s = 0; s <= PX_ERR_MEMBERSHIP; ++s) {
    std::string name = px_status_name(static_cast<px_status>(s));
    CHECK(name.rfind("PX_", 0) == 0);
    CHECK(name != "PX_STATUS_UNKNOWN");
    CHECK(std::string(px_strerror(static_cast<px_status>(s))) != "unknown status");
  }
}
