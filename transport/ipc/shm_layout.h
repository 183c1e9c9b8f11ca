// The byte layout of a client's shared-memory arena, shared by libparallax and parallaxd.
//
//   [ ArenaHeader | submission ring (client -> daemon) | completion ring (daemon -> client) | heap
//   ]
//
// The daemon creates the memfd, formats it, seals its size and passes it to the client, so a
// client can never shrink the mapping under the daemon. Buffers are named by offsets from
// the arena's start, never by pointers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/ipc/spsc_ring.h"

namespace px {

constexpr uint64_t kArenaMagic = 0x50584152454e4131ull;  // "PXARENA1"
constexpr uint32_t kArenaLayoutVersion = 1;
constexpr uint64_t kArenaHeapAlign = 4096;

// Where a buffer lives. Host memory is an arena offset; device memory an offset in one of
// the worker's px_alloc_ex regions (registered with RegisterDeviceMemory).
enum class MemoryKind : uint32_t { kHostArena = 0, kCudaDevice = 1 };
// A kCudaDevice region's IPC handle as the worker registers it (control
// RegisterDeviceMemory): cudaIpcMemHandle_t, CUDA_IPC_HANDLE_SIZE bytes.
constexpr size_t kIpcHandleBytes = 64;

struct BufferRef {
  uint64_t offset;  // from the arena's start (kHostArena), or the region's (kCudaDevice)
  uint64_t bytes;
  uint32_t memory_kind;  // MemoryKind
  uint32_t region;       // kCudaDevice: the region (its device is the region's); host: ignored
};

// Sparse operations: in holds int64 row indices; out holds the rows (pull, read: written by
// the daemon; push: gradients; load: values, both read by the daemon).
enum class Opcode : uint16_t {
  kAllreduce = 1,
  kBarrier = 2,
  kPullRows = 3,
  kPushRows = 4,
  kLoadRows = 5,
  kReadRows = 6,
  kBroadcast = 7,       // in: the root's data (root workers), out: every worker's result
  kAllgather = 8,       // in: count elements, out: world_size * count
  kAllgatherv = 9,      // in: uint64 counts[world_size] then this worker's block; out: the sum
  kReduceScatter = 10,  // in: world_size * count elements, out: count (this rank's block)
  // in: uint64 send_counts[world_size], uint64 recv_counts[world_size], then the blocks for
  // each rank in rank order; out: the blocks from each rank (px_alltoall and px_alltoallv)
  kAlltoall = 11,
};

// One submitted operation. The n-th operation a worker submits on a variable is its step n.
struct SubmitEntry {
  uint64_t request_id;  // chosen by the client, echoed in the completion
  uint64_t step;
  uint32_t var_id;   // from registration; 0 is the job's barrier
  uint16_t opcode;   // Opcode
  uint8_t priority;  // larger goes first when transfers queue (used by the cluster routes)
  uint8_t reserved0;
  uint32_t root;  // kBroadcast: the root's global rank
  BufferRef in;
  BufferRef out;
};
static_assert(sizeof(SubmitEntry) == 80);

constexpr size_t kCompletionMessageBytes = 232;

// CompletionEntry::flags
// The message did not fit: message holds its start, and the daemon keeps the whole text
// until the client fetches it (control::ErrorText) by request id.
constexpr uint32_t kCompletionMessageOnDaemon = 1;

struct CompletionEntry {
  uint64_t request_id;
  int32_t status;  // px_status
  uint32_t flags;  // kCompletion*
  uint64_t reserved1;
  char message[kCompletionMessageBytes];  // NUL-terminated; set when status != PX_OK
};
static_assert(sizeof(CompletionEntry) == 256);

struct alignas(64) ArenaHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t ring_capacity;
  uint64_t arena_bytes;
  uint64_t submit_ring_offset;
  uint64_t completion_ring_offset;
  uint64_t heap_offset;
  uint64_t heap_bytes;
};

struct ArenaLayout {
  uint32_t ring_capacity;
  uint64_t arena_bytes;
  uint64_t submit_ring_offset;
  uint64_t completion_ring_offset;
  uint64_t heap_offset;
  uint64_t heap_bytes;
};

inline uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// Lays out an arena of (at least) heap_bytes usable heap. ring_capacity must be a power of 2.
inline ArenaLayout compute_arena_layout(uint64_t heap_bytes, uint32_t ring_capacity) {
  ArenaLayout l{};
  l.ring_capacity = ring_capacity;
  l.submit_ring_offset = align_up(sizeof(ArenaHeader), 64);
  l.completion_ring_offset =
      align_up(l.submit_ring_offset + SpscRing<SubmitEntry>::bytes_for(ring_capacity), 64);
  l.heap_offset =
      align_up(l.completion_ring_offset + SpscRing<CompletionEntry>::bytes_for(ring_capacity),
               kArenaHeapAlign);
  l.heap_bytes = align_up(heap_bytes, kArenaHeapAlign);
  l.arena_bytes = l.heap_offset + l.heap_bytes;
  return l;
}

// Checks a header read from shared memory (the client validates what the daemon sent).
inline bool arena_header_valid(const ArenaHeader& h, uint64_t mapped_bytes) {
  if (h.magic != kArenaMagic || h.layout_version != kArenaLayoutVersion) return false;
  if (h.ring_capacity == 0 || (h.ring_capacity & (h.ring_capacity - 1)) != 0) return false;
  ArenaLayout want = compute_arena_layout(h.heap_bytes, h.ring_capacity);
  return want.arena_bytes == h.arena_bytes && h.arena_bytes <= mapped_bytes &&
         want.submit_ring_offset == h.submit_ring_offset &&
         want.completion_ring_offset == h.completion_ring_offset &&
         want.heap_offset == h.heap_offset;
}

}  // namespace px
