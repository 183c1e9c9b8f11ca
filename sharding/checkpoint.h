// Checkpoint files of sparse variables: one shard file per node (its rows, values and
// optimizer state, rows named by their global number) and a Cap'n Proto manifest
// (checkpoint.capnp). Every file is written to a temporary name, fsynced and renamed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace px {

struct ShardFileData {
  uint64_t dim = 0;  // values per row in the file: the table's dim, or a column slice's width
  // A column slice (the column-wise alltoall route) holds the table's columns
  // [column_begin, column_begin + dim) of its rows; such files have a second header version.
  bool column_slice = false;
  uint64_t column_begin = 0;
  uint32_t slots = 0;
  std::vector<int64_t> rows;
  std::vector<float> values;  // rows.size() x dim
  std::vector<float> state;   // rows.size() x slots x dim
};

struct ManifestData {
  std::string job, variable, options;
  uint64_t rows = 0, dim = 0, optimizer_steps = 0;
  uint32_t state_slots = 0, nodes = 0, partitions = 0;
  std::vector<std::string> shard_files;
};

// name with '/' and every byte other than letters, digits, '-' and '_' replaced by '_'.
std::string safe_name(const std::string& name);
// "<dir>/<job>.<variable>": job and variable with '/' and other unsafe bytes replaced.
std::string checkpoint_stem(const std::string& dir, const std::string& job,
                            const std::string& variable);

bool write_shard_file(const std::string& path, const ShardFileData& data, std::string* error);
bool read_shard_file(const std::string& path, ShardFileData* data, std::string* error);

// A shard's arrays where they lie: a ShardFileData's, or a shard image's in place.
struct ShardView {
  uint64_t dim = 0;
  bool column_slice = false;
  uint64_t column_begin = 0;
  uint32_t slots = 0;
  size_t count = 0;  // rows
  const int64_t* rows = nullptr;
  const float* values = nullptr;  // count x dim
  const float* state = nullptr;   // count x slots x dim
};
ShardView view_of(const ShardFileData& data);

// A shard file's bytes in memory, a shard image (a table moving between routes exchanges
// its rows so: daemon/sparse/route_move.cc): shard_image_bytes of them written to out.
size_t shard_image_bytes(const ShardFileData& data);
// The most bytes an image of rows x dim rows with slots state values per cell can take
// (every row, whole): what a received image's announced size is checked against. 0 when
// rows x dim is beyond what a shard can hold (2^40 cells).
uint64_t max_shard_image_bytes(uint64_t rows, uint64_t dim, uint32_t slots);
void encode_shard(const ShardFileData& data, char* out);
// The image's arrays in place, no copies: false for anything read_shard_file would refuse,
// and for bytes not 8-byte aligned (the rows are int64).
bool view_shard(const char* bytes, size_t size, ShardView* view);
bool write_manifest(const std::string& path, const ManifestData& data, std::string* error);
bool read_manifest(const std::string& path, ManifestData* data, std::string* error);

}  // namespace px
