// How each target reads its input, shared by the targets and the seed generator
// (make_seeds.cc), so that generated seeds are laid out as the targets expect.
#pragma once

#include <cstddef>
#include <cstdint>

namespace px::fuzz {

// control, cluster: byte 0 says where the stream is cut into two reads (as a socket may
// deliver it, mid-frame), the rest is the stream.
inline size_t split_point(const uint8_t* data, size_t size) {
  return size > 1 ? data[0] % size : 0;
}

// cluster: the daemon's cluster name and node count that envelopes are checked against.
constexpr const char* kClusterName = "fuzz";
constexpr int kClusterNodes = 4;

// sparse_header: byte 0 is the peer the message came from (mod kSparseNodes), bytes 1-8 the
// variable's dim (little-endian; mod kSparseMaxDim, plus 1), the rest the request's first
// message as received.
constexpr int kSparseNodes = 4;
constexpr uint64_t kSparseMaxDim = 1ull << 38;  // rows x dim x 4 bytes <= 2^40: session.cc
constexpr size_t kSparsePrefix = 9;

// checkpoint: byte 0 even: the rest is a manifest file; odd: a shard file.
enum class CheckpointFile : uint8_t { kManifest = 0, kShard = 1 };

}  // namespace px::fuzz
