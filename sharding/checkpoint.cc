#include "sharding/checkpoint.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "checkpoint.capnp.h"
#include "transport/kernels/huge_pages.h"

namespace px {
namespace {

constexpr uint64_t kShardMagic = 0x3144524148535850ull;        // "PXSHARD1": whole rows
constexpr uint64_t kColumnShardMagic = 0x3244524148535850ull;  // "PXSHARD2": a column slice

struct ShardHeader {
  uint64_t magic;
  uint64_t dim;
  uint64_t count;
  uint32_t slots;
  uint32_t reserved;
};
// PXSHARD2 files: the header, then this.
struct ColumnSliceHeader {
  uint64_t column_begin;
};

std::string os_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + strerror(errno);
}

bool write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::read(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Writes parts to path atomically: a temporary file, fsync, rename, fsync of the folder.
bool write_atomically(const std::string& path,
                      const std::vector<std::pair<const void*, size_t>>& parts,
                      std::string* error) {
  std::string temp = path + ".tmp." + std::to_string(getpid());
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) {
    *error = os_error("cannot create", temp);
    return false;
  }
  bool ok = true;
  for (auto& [data, bytes] : parts) ok = ok && write_all(fd, data, bytes);
  ok = ok && ::fsync(fd) == 0;
  if (!ok) *error = os_error("cannot write", temp);
  ::close(fd);
  if (ok && ::rename(temp.c_str(), path.c_str()) != 0) {
    *error = os_error("cannot rename to", path);
    ok = false;
  }
  if (!ok) {
    ::unlink(temp.c_str());
    return false;
  }
  std::string dir = path.substr(0, path.rfind('/') == std::string::npos ? 1 : path.rfind('/'));
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return true;
}

// The bytes a shard file with this header holds, 0 when the header is not one a writer makes:
// checked before anything is allocated, since a corrupted count made the resizes ask for up
// to terabytes (std::bad_alloc, the daemon gone), and bytes after the state went unnoticed
// (found by tests/unit/test_checkpoint.cc). count * dim < 2^40 and slots <= 8: no overflow.
uint64_t shard_bytes(const ShardHeader& h, bool column_slice, const ColumnSliceHeader& slice) {
  // A column slice of a node that holds no columns (dim < nodes) is empty.
  bool ok = (h.dim > 0 ? h.count < (1ull << 40) / h.dim : column_slice && h.count == 0) &&
            h.slots <= 8 && slice.column_begin < (1ull << 40);
  if (!ok) return 0;
  return sizeof h + (column_slice ? sizeof slice : 0) + h.count * sizeof(int64_t) +
         h.count * h.dim * (1 + h.slots) * sizeof(float);
}

// Reads a shard's header (and a column slice's second one) through read: true when it is a
// header a writer makes and total_bytes exactly what it describes.
template <typename Read>
bool read_shard_header(uint64_t total_bytes, Read& read, ShardHeader* h, ColumnSliceHeader* slice) {
  *slice = ColumnSliceHeader{0};
  if (!read(h, sizeof *h) || (h->magic != kShardMagic && h->magic != kColumnShardMagic))
    return false;
  bool column_slice = h->magic == kColumnShardMagic;
  if (column_slice && !read(slice, sizeof *slice)) return false;
  uint64_t bytes = shard_bytes(*h, column_slice, *slice);
  return bytes != 0 && bytes == total_bytes;
}

// The header through read_shard_header, then data sized for it and its rows, values and
// state read in.
template <typename Read>
bool read_shard(uint64_t total_bytes, ShardFileData* data, Read read) {
  ShardHeader h{};
  ColumnSliceHeader slice{0};
  if (!read_shard_header(total_bytes, read, &h, &slice)) return false;
  data->dim = h.dim;
  data->column_slice = h.magic == kColumnShardMagic;
  data->column_begin = slice.column_begin;
  data->slots = h.slots;
  resize_on_huge_pages(data->rows, h.count);
  resize_on_huge_pages(data->values, h.count * h.dim);
  resize_on_huge_pages(data->state, h.count * h.slots * h.dim);
  return read(data->rows.data(), data->rows.size() * sizeof(int64_t)) &&
         read(data->values.data(), data->values.size() * sizeof(float)) &&
         read(data->state.data(), data->state.size() * sizeof(float));
}

// The header a writer puts before data's rows.
ShardHeader header_of(const ShardFileData& data) {
  return {data.column_slice ? kColumnShardMagic : kShardMagic, data.dim, data.rows.size(),
          data.slots, 0};
}

std::vector<std::pair<const void*, size_t>> shard_parts(const ShardFileData& data,
                                                        const ShardHeader& h,
                                                        const ColumnSliceHeader& slice) {
  return {{&h, sizeof h},
          {&slice, data.column_slice ? sizeof slice : 0},
          {data.rows.data(), data.rows.size() * sizeof(int64_t)},
          {data.values.data(), data.values.size() * sizeof(float)},
          {data.state.data(), data.state.size() * sizeof(float)}};
}

}  // namespace

std::string safe_name(const std::string& name) {
  std::string out;
  for (char c : name)
    out += (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return out;
}

std::string checkpoint_stem(const std::string& dir, const std::string& job,
                            const std::string& variable) {
  return dir + "/" + safe_name(job) + "." + safe_name(variable);
}

bool write_shard_file(const std::string& path, const ShardFileData& data, std::string* error) {
  ShardHeader h = header_of(data);
  ColumnSliceHeader slice{data.column_begin};
  return write_atomically(path, shard_parts(data, h, slice), error);
}

bool read_shard_file(const std::string& path, ShardFileData* data, std::string* error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = os_error("cannot open", path);
    return false;
  }
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 &&
            read_shard(static_cast<uint64_t>(st.st_size), data,
                       [fd](void* to, size_t bytes) { return read_all(fd, to, bytes); });
  ::close(fd);
  if (!ok) *error = path + " is not a complete Parallax shard file";
  return ok;
}

ShardView view_of(const ShardFileData& data) {
  return {data.dim,         data.column_slice, data.column_begin,  data.slots,
          data.rows.size(), data.rows.data(),  data.values.data(), data.state.data()};
}

size_t shard_image_bytes(const ShardFileData& data) {
  ShardHeader h = header_of(data);
  ColumnSliceHeader slice{data.column_begin};
  size_t total = 0;
  for (auto& part : shard_parts(data, h, slice)) total += part.second;
  return total;
}

uint64_t max_shard_image_bytes(uint64_t rows, uint64_t dim, uint32_t slots) {
  // Whole rows with a column slice's header: more than any slice of them.
  return shard_bytes(ShardHeader{kColumnShardMagic, dim, rows, slots, 0}, true,
                     ColumnSliceHeader{0});
}

void encode_shard(const ShardFileData& data, char* out) {
  ShardHeader h = header_of(data);
  ColumnSliceHeader slice{data.column_begin};
  for (auto& [from, bytes] : shard_parts(data, h, slice)) {
    if (bytes) std::memcpy(out, from, bytes);
    out += bytes;
  }
}

bool view_shard(const char* bytes, size_t size, ShardView* view) {
  if (reinterpret_cast<uintptr_t>(bytes) % alignof(int64_t) != 0) return false;
  size_t at = 0;
  auto read = [&](void* to, size_t n) {
    if (size - at < n) return false;
    std::memcpy(to, bytes + at, n);
    at += n;
    return true;
  };
  ShardHeader h{};
  ColumnSliceHeader slice{0};
  if (!read_shard_header(size, read, &h, &slice)) return false;
  view->dim = h.dim;
  view->column_slice = h.magic == kColumnShardMagic;
  view->column_begin = slice.column_begin;
  view->slots = h.slots;
  view->count = h.count;
  view->rows = reinterpret_cast<const int64_t*>(bytes + at);
  view->values = reinterpret_cast<const float*>(bytes + at + h.count * sizeof(int64_t));
  view->state = view->values + h.count * h.dim;
  return true;
}

bool write_manifest(const std::string& path, const ManifestData& d, std::string* error) {
  capnp::MallocMessageBuilder message;
  auto m = message.initRoot<CheckpointManifest>();
  m.setFormatVersion(1);
  m.setJob(d.job);
  m.setVariable(d.variable);
  m.setRows(d.rows);
  m.setDim(d.dim);
  m.setOptions(d.options);
  m.setStateSlots(d.state_slots);
  m.setOptimizerSteps(d.optimizer_steps);
  m.setNodes(d.nodes);
  m.setPartitions(d.partitions);
  auto files = m.initShardFiles(static_cast<unsigned>(d.shard_files.size()));
  for (size_t i = 0; i < d.shard_files.size(); ++i)
    files.set(static_cast<unsigned>(i), d.shard_files[i]);
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return write_atomically(path, {{bytes.begin(), bytes.size()}}, error);
}

bool read_manifest(const std::string& path, ManifestData* d, std::string* error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = os_error("cannot open", path);
    return false;
  }
  try {
    capnp::StreamFdMessageReader reader(fd);
    auto m = reader.getRoot<CheckpointManifest>();
    if (m.getFormatVersion() != 1) throw std::runtime_error("unknown format version");
    d->job = m.getJob();
    d->variable = m.getVariable();
    d->rows = m.getRows();
    d->dim = m.getDim();
    d->options = m.getOptions();
    d->state_slots = m.getStateSlots();
    d->optimizer_steps = m.getOptimizerSteps();
    d->nodes = m.getNodes();
    d->partitions = m.getPartitions();
    d->shard_files.clear();
    for (auto f : m.getShardFiles()) {
      // The restore opens <dir>/<name>: a name that is empty, "." or "..", or holds '/' or a
      // NUL, reached outside the checkpoint's directory, or nowhere (found by
      // tests/fuzz/checkpoint_fuzz.cc; regressions/checkpoint).
      std::string name(f.begin(), f.size());
      if (name.empty() || name == "." || name == ".." ||
          name.find_first_of(std::string("/\0", 2)) != std::string::npos)
        throw std::runtime_error("shard file name '" + name + "' is not a plain file name");
      d->shard_files.push_back(name);
    }
    if (d->shard_files.size() != d->nodes)
      throw std::runtime_error(std::to_string(d->shard_files.size()) + " shard files for " +
                               std::to_string(d->nodes) + " nodes");
  } catch (const kj::Exception& e) {
    ::close(fd);
    *error = path + " is not a valid checkpoint manifest: " + e.getDescription().cStr();
    return false;
  } catch (const std::exception& e) {
    ::close(fd);
    *error = path + " is not a valid checkpoint manifest: " + e.what();
    return false;
  }
  ::close(fd);
  return true;
}

}  // namespace px
