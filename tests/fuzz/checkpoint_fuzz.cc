// Fuzz target: the checkpoint readers (sharding/checkpoint.cc), what a daemon started with
// --restore reads before any row goes into its tables (daemon/sparse/sparse_tables.cc,
// shard_owner.cc): read_manifest (the Cap'n Proto manifest) and read_shard_file; and
// view_shard, which reads the same format from the bytes a moving table's nodes exchange
// (daemon/sparse/route_move.cc).
//
// Contract: no crash, no sanitizer report, no leak; a refusal names the file. A manifest it
// accepts has format version 1 and lists one shard file per node, each a plain file name
// (the restore opens <dir>/<name>: no '/', no "..", no NUL, not empty); a shard file it
// accepts has dim > 0 (or is an empty column slice), at most 8 state slots, and exactly
// rows x dim values and rows x slots x dim state values, which the restore copies row by
// row; view_shard accepts exactly what read_shard_file accepts and reads the same.
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "fuzz_inputs.h"
#include "sharding/checkpoint.h"

namespace px::fuzz {
namespace {

void manifest(const MemFile& file) {
  ManifestData m;
  std::string error;
  if (!read_manifest(file.path(), &m, &error)) {
    PX_FUZZ_CHECK(error.find(file.path()) != std::string::npos);
    return;
  }
  PX_FUZZ_CHECK(m.shard_files.size() == m.nodes);
  for (const std::string& name : m.shard_files) {
    PX_FUZZ_CHECK(!name.empty() && name != "." && name != "..");
    PX_FUZZ_CHECK(name.find('/') == std::string::npos);
    PX_FUZZ_CHECK(name.find('\0') == std::string::npos);
  }
  touch(m.job.data(), m.job.size());
  touch(m.variable.data(), m.variable.size());
  touch(m.options.data(), m.options.size());
}

// A shard file and the same bytes in memory (a table moving between routes exchanges
// them: view_shard) are accepted alike and read alike.
void shard(const MemFile& file, const uint8_t* bytes, size_t size) {
  ShardFileData d;
  std::string error;
  std::vector<int64_t> aligned(size / 8 + 1);
  if (size) std::memcpy(aligned.data(), bytes, size);
  ShardView view;
  bool viewed = view_shard(reinterpret_cast<const char*>(aligned.data()), size, &view);
  if (!read_shard_file(file.path(), &d, &error)) {
    PX_FUZZ_CHECK(error.find(file.path()) != std::string::npos);
    PX_FUZZ_CHECK(!viewed);
    return;
  }
  PX_FUZZ_CHECK(viewed);
  PX_FUZZ_CHECK(d.dim > 0 || (d.column_slice && d.rows.empty()));
  PX_FUZZ_CHECK(d.slots <= 8);
  PX_FUZZ_CHECK(d.values.size() == d.rows.size() * d.dim);
  PX_FUZZ_CHECK(d.state.size() == d.rows.size() * d.slots * d.dim);
  PX_FUZZ_CHECK(view.dim == d.dim && view.slots == d.slots && view.column_slice == d.column_slice &&
                view.column_begin == d.column_begin && view.count == d.rows.size());
  auto same = [](const void* a, const void* b, size_t bytes) {
    return bytes == 0 || std::memcmp(a, b, bytes) == 0;  // an empty vector's data() is null
  };
  PX_FUZZ_CHECK(same(view.rows, d.rows.data(), d.rows.size() * sizeof(int64_t)));
  PX_FUZZ_CHECK(same(view.values, d.values.data(), d.values.size() * sizeof(float)));
  PX_FUZZ_CHECK(same(view.state, d.state.data(), d.state.size() * sizeof(float)));
  PX_FUZZ_CHECK(shard_image_bytes(d) == size);
  touch(d.rows.data(), d.rows.size() * sizeof(int64_t));
  touch(d.values.data(), d.values.size() * sizeof(float));
  touch(d.state.data(), d.state.size() * sizeof(float));
}

}  // namespace
}  // namespace px::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace px::fuzz;
  if (size == 0) return 0;
  MemFile file(data + 1, size - 1);
  if ((data[0] & 1) == static_cast<uint8_t>(CheckpointFile::kManifest)) {
    manifest(file);
  } else {
    shard(file, data + 1, size - 1);
  }
  return 0;
}
