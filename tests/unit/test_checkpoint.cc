// Checkpoint files of sparse variables (sharding/checkpoint.h): shard files and the Cap'n
// Proto manifest round trip, damaged files are refused with an error naming them, and a
// file appears under its final name only whole.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint.capnp.h"
#include "sharding/checkpoint.h"
#include "tests/integration/text_util.h"
#include "tests/unit/temp_dir.h"

using namespace px;
using px::test::read_text;
using px::test::TempDir;
using px::test::write_text;

namespace {

ShardFileData sample_shard(uint64_t dim, uint32_t slots, size_t rows, float base) {
  ShardFileData d;
  d.dim = dim;
  d.slots = slots;
  for (size_t r = 0; r < rows; ++r) d.rows.push_back(static_cast<int64_t>(r * 7919 + 3));
  for (size_t i = 0; i < rows * dim; ++i) d.values.push_back(base + static_cast<float>(i) * 0.5f);
  for (size_t i = 0; i < rows * dim * slots; ++i)
    d.state.push_back(-base - static_cast<float>(i) * 0.25f);
  return d;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

ManifestData sample_manifest() {
  ManifestData m;
  m.job = "train/ä";
  m.variable = "embeddings";
  m.options = "optimizer=adam lr=0.001";
  m.rows = 1ull << 35;
  m.dim = 64;
  m.optimizer_steps = 12345;
  m.state_slots = 2;
  m.nodes = 3;
  m.partitions = 24;
  m.shard_files = {"train__.embeddings.node0.shard", "train__.embeddings.node1.shard",
                   "train__.embeddings.node2.shard"};
  return m;
}

using pxt::contains;

void expect_no_temp_files(const TempDir& dir) {
  for (const std::string& name : dir.list()) {
    CAPTURE(name);
    CHECK(name.find(".tmp.") == std::string::npos);
  }
}

}  // namespace

TEST_CASE("checkpoint: a shard file reads back bit for bit") {
  TempDir dir;
  std::string path = dir.file("v.node0.shard");
  std::string error;
  for (uint32_t slots : {0u, 1u, 2u, 8u}) {
    CAPTURE(slots);
    ShardFileData data = sample_shard(5, slots, 37, 1.5f);
    data.rows[3] = -1;  // rows are stored as given
    data.values[4] = std::numeric_limits<float>::quiet_NaN();
    data.values[5] = -0.0f;
    REQUIRE_MESSAGE(write_shard_file(path, data, &error), error);
    ShardFileData back;
    REQUIRE_MESSAGE(read_shard_file(path, &back, &error), error);
    CHECK(back.dim == data.dim);
    CHECK(back.slots == data.slots);
    CHECK(back.rows == data.rows);
    CHECK(same_bits(back.values, data.values));
    CHECK(same_bits(back.state, data.state));
    // In memory (a table moving between routes sends these bytes): the file's bytes, read
    // in place.
    std::vector<int64_t> aligned((shard_image_bytes(data) + 7) / 8);
    char* bytes = reinterpret_cast<char*>(aligned.data());
    encode_shard(data, bytes);
    CHECK(std::string(bytes, shard_image_bytes(data)) == read_text(path));
    ShardView view;
    REQUIRE(view_shard(bytes, shard_image_bytes(data), &view));
    CHECK(view.dim == data.dim);
    CHECK(view.slots == data.slots);
    CHECK(std::vector<int64_t>(view.rows, view.rows + view.count) == data.rows);
    CHECK(same_bits(std::vector<float>(view.values, view.values + view.count * view.dim),
                    data.values));
    CHECK(same_bits(std::vector<float>(view.state, view.state + data.state.size()), data.state));
    CHECK_FALSE(view_shard(bytes + 4, shard_image_bytes(data) - 4, &view));  // unaligned
    // The bound a move checks announced sizes against: these rows, whole, with a column
    // slice's header; fewer rows fit under it, a larger count does not.
    CHECK(max_shard_image_bytes(37, data.dim, slots) == shard_image_bytes(data) + 8);
    CHECK(max_shard_image_bytes(36, data.dim, slots) < shard_image_bytes(data));
    CHECK(max_shard_image_bytes(1ull << 40, data.dim, slots) == 0);
  }
  SUBCASE("a node that owns no rows") {
    ShardFileData empty = sample_shard(16, 1, 0, 0.0f);
    REQUIRE_MESSAGE(write_shard_file(path, empty, &error), error);
    ShardFileData back = sample_shard(2, 2, 3, 9.0f);  // whatever was there is replaced
    REQUIRE_MESSAGE(read_shard_file(path, &back, &error), error);
    CHECK(back.dim == 16);
    CHECK(back.slots == 1);
    CHECK(back.rows.empty());
    CHECK(back.values.empty());
    CHECK(back.state.empty());
  }
  expect_no_temp_files(dir);
}

TEST_CASE("checkpoint: a column-slice shard file keeps its first column, an empty slice too") {
  TempDir dir;
  std::string path = dir.file("v.node1.shard");
  std::string error;
  ShardFileData data = sample_shard(3, 2, 11, 4.0f);
  data.column_slice = true;
  data.column_begin = 5;
  REQUIRE_MESSAGE(write_shard_file(path, data, &error), error);
  ShardFileData back;
  REQUIRE_MESSAGE(read_shard_file(path, &back, &error), error);
  CHECK(back.column_slice);
  CHECK(back.column_begin == 5);
  CHECK(back.dim == 3);
  CHECK(back.rows == data.rows);
  CHECK(same_bits(back.values, data.values));
  CHECK(same_bits(back.state, data.state));
  // A whole-row file reads back as no slice.
  REQUIRE_MESSAGE(write_shard_file(path, sample_shard(3, 0, 2, 1.0f), &error), error);
  REQUIRE_MESSAGE(read_shard_file(path, &back, &error), error);
  CHECK_FALSE(back.column_slice);
  CHECK(back.column_begin == 0);
  // A node past dim holds no columns: dim 0 with no rows reads back; dim 0 with rows not.
  ShardFileData empty;
  empty.column_slice = true;
  empty.column_begin = 2;
  REQUIRE_MESSAGE(write_shard_file(path, empty, &error), error);
  REQUIRE_MESSAGE(read_shard_file(path, &back, &error), error);
  CHECK(back.dim == 0);
  CHECK(back.rows.empty());
  ShardFileData rows_without_columns = empty;
  rows_without_columns.rows = {1, 2};
  REQUIRE_MESSAGE(write_shard_file(path, rows_without_columns, &error), error);
  CHECK_FALSE(read_shard_file(path, &back, &error));
  CHECK(contains(error, path));
}

TEST_CASE("checkpoint: a manifest reads back field for field") {
  TempDir dir;
  std::string path = dir.file("job.var.manifest");
  std::string error;
  ManifestData m = sample_manifest();
  REQUIRE_MESSAGE(write_manifest(path, m, &error), error);
  ManifestData back;
  back.shard_files = {"stale"};  // replaced, not appended to
  REQUIRE_MESSAGE(read_manifest(path, &back, &error), error);
  CHECK(back.job == m.job);
  CHECK(back.variable == m.variable);
  CHECK(back.options == m.options);
  CHECK(back.rows == m.rows);
  CHECK(back.dim == m.dim);
  CHECK(back.optimizer_steps == m.optimizer_steps);
  CHECK(back.state_slots == m.state_slots);
  CHECK(back.nodes == m.nodes);
  CHECK(back.partitions == m.partitions);
  CHECK(back.shard_files == m.shard_files);
  expect_no_temp_files(dir);
}

TEST_CASE("checkpoint: stems keep only safe bytes of the job and variable names") {
  CHECK(checkpoint_stem("/ckpt", "train", "emb") == "/ckpt/train.emb");
  CHECK(checkpoint_stem("/ckpt", "../etc", "a/b c") == "/ckpt/___etc.a_b_c");
  CHECK(checkpoint_stem("d", "job-1_x", "v.2") == "d/job-1_x.v_2");
  CHECK(checkpoint_stem("d", "", "") == "d/.");
}

TEST_CASE("checkpoint: a truncated shard file is refused with an error naming it") {
  TempDir dir;
  std::string path = dir.file("v.shard");
  std::string error;
  REQUIRE(write_shard_file(path, sample_shard(3, 2, 10, 2.0f), &error));
  std::string whole = read_text(path);
  REQUIRE(whole.size() == 32 + 10 * 8 + 10 * 3 * 3 * 4);
  std::string cut = dir.file("cut.shard");
  for (size_t n = 0; n < whole.size(); ++n) {
    CAPTURE(n);
    write_text(cut, whole.substr(0, n));
    ShardFileData back;
    error.clear();
    CHECK_FALSE(read_shard_file(cut, &back, &error));
    CHECK(error == cut + " is not a complete Parallax shard file");
  }
}

TEST_CASE("checkpoint: a corrupted shard file is refused, whatever the header says") {
  TempDir dir;
  std::string path = dir.file("v.shard");
  std::string error;
  REQUIRE(write_shard_file(path, sample_shard(4, 1, 6, 3.0f), &error));
  const std::string whole = read_text(path);
  std::string bad_path = dir.file("bad.shard");
  auto refused = [&](std::string bytes) {
    write_text(bad_path, bytes);
    ShardFileData back;
    error.clear();
    bool ok = read_shard_file(bad_path, &back, &error);
    // The same bytes as a moving table's nodes exchange them (8-byte aligned).
    std::vector<int64_t> aligned(bytes.size() / 8 + 1);
    std::memcpy(aligned.data(), bytes.data(), bytes.size());
    ShardView view;
    CHECK(view_shard(reinterpret_cast<const char*>(aligned.data()), bytes.size(), &view) == ok);
    return !ok && error == bad_path + " is not a complete Parallax shard file";
  };
  auto with_u64 = [&](size_t offset, uint64_t v) {
    std::string bytes = whole;
    std::memcpy(&bytes[offset], &v, sizeof v);
    return bytes;
  };
  auto with_u32 = [&](size_t offset, uint32_t v) {
    std::string bytes = whole;
    std::memcpy(&bytes[offset], &v, sizeof v);
    return bytes;
  };
  // Header: magic, dim, count (u64 each), slots (u32), reserved (u32).
  CHECK(refused(with_u64(0, 0x3244524148535850ull)));  // "PXSHARD2"
  CHECK(refused(with_u64(8, 0)));                      // dim 0
  CHECK(refused(with_u64(8, 5)));                      // dim that does not match the size
  CHECK(refused(with_u64(16, 7)));                     // one row more than the file holds
  CHECK(refused(with_u64(16, 5)));                     // one row less
  CHECK(refused(with_u32(24, 9)));                     // more state slots than any optimizer
  CHECK(refused(with_u32(24, 2)));                     // slots that do not match the size
  // A count just under the sanity bound asked for terabytes before the size was checked.
  CHECK(refused(with_u64(16, (1ull << 40) / 4 - 1)));
  CHECK(refused(with_u64(16, ~0ull)));
  CHECK(refused(whole + std::string(4, '\0')));  // bytes after the state
  CHECK(refused(std::string(whole.size(), 'x')));
  CHECK(refused(""));           // an empty file
  CHECK_FALSE(refused(whole));  // and the unchanged bytes still read

  ShardFileData back;
  CHECK_FALSE(read_shard_file(dir.file("missing.shard"), &back, &error));
  CHECK(contains(error, "cannot open " + dir.file("missing.shard")));
}

TEST_CASE("checkpoint: a truncated or corrupted manifest is refused with an error naming it") {
  TempDir dir;
  std::string path = dir.file("v.manifest");
  std::string error;
  REQUIRE(write_manifest(path, sample_manifest(), &error));
  const std::string whole = read_text(path);
  std::string bad = dir.file("bad.manifest");
  const std::string prefix = bad + " is not a valid checkpoint manifest: ";
  ManifestData back;

  SUBCASE("every truncation") {
    for (size_t n = 0; n < whole.size(); ++n) {
      CAPTURE(n);
      write_text(bad, whole.substr(0, n));
      error.clear();
      CHECK_FALSE(read_manifest(bad, &back, &error));
      CHECK(error.find(prefix) == 0);
    }
  }
  SUBCASE("a segment table claiming more than the file holds") {
    std::string bytes = whole;
    uint32_t words = 1u << 20;
    std::memcpy(&bytes[4], &words, sizeof words);
    write_text(bad, bytes);
    CHECK_FALSE(read_manifest(bad, &back, &error));
    CHECK(error.find(prefix) == 0);
  }
  SUBCASE("a root pointer out of the segment") {
    std::string bytes = whole;
    uint64_t pointer = 0x0001000100fffff0ull;  // struct pointer, far offset
    std::memcpy(&bytes[8], &pointer, sizeof pointer);
    write_text(bad, bytes);
    CHECK_FALSE(read_manifest(bad, &back, &error));
    CHECK(error.find(prefix) == 0);
  }
  SUBCASE("a shard file or text instead of a manifest") {
    std::string shard = dir.file("v.shard");
    REQUIRE(write_shard_file(shard, sample_shard(2, 0, 4, 1.0f), &error));
    CHECK_FALSE(read_manifest(shard, &back, &error));
    CHECK(error.find(shard + " is not a valid checkpoint manifest: ") == 0);
    write_text(bad, std::string(4096, '\xff'));
    CHECK_FALSE(read_manifest(bad, &back, &error));
    CHECK(error.find(prefix) == 0);
  }
  SUBCASE("another format version") {
    capnp::MallocMessageBuilder message;
    auto m = message.initRoot<CheckpointManifest>();
    m.setFormatVersion(2);
    m.setJob("j");
    auto words = capnp::messageToFlatArray(message);
    auto bytes = words.asBytes();
    write_text(bad, std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
    CHECK_FALSE(read_manifest(bad, &back, &error));
    CHECK(error == prefix + "unknown format version");
  }
  SUBCASE("a missing manifest") {
    CHECK_FALSE(read_manifest(dir.file("none.manifest"), &back, &error));
    CHECK(contains(error, "cannot open " + dir.file("none.manifest")));
  }
}

TEST_CASE("checkpoint: files are replaced atomically, a failed write leaves the old one") {
  TempDir dir;
  std::string path = dir.file("v.node0.shard");
  std::string error;
  ShardFileData old_data = sample_shard(8, 2, 100, 1.0f);
  REQUIRE(write_shard_file(path, old_data, &error));

  SUBCASE("a newer version replaces the old one, and no temporary file stays") {
    ShardFileData newer = sample_shard(8, 2, 50, 2.0f);
    REQUIRE(write_shard_file(path, newer, &error));
    ShardFileData back;
    REQUIRE(read_shard_file(path, &back, &error));
    CHECK(back.rows == newer.rows);
    CHECK(dir.list() == std::vector<std::string>{"v.node0.shard"});
  }

  SUBCASE("a write that fails half way (file size limit) leaves the old file whole") {
    // In a child, so the limit and the ignored SIGXFSZ stay there. The new file is larger
    // than the limit; the old one is smaller.
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      signal(SIGXFSZ, SIG_IGN);
      rlimit limit{64 * 1024, 64 * 1024};
      if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(3);
      std::string child_error;
      bool ok = write_shard_file(path, sample_shard(8, 2, 5000, 7.0f), &child_error);
      _exit(ok ? 1 : contains(child_error, "cannot write") ? 0 : 2);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);  // the write failed, with "cannot write"
    ShardFileData back;
    REQUIRE_MESSAGE(read_shard_file(path, &back, &error), error);
    CHECK(back.rows == old_data.rows);
    CHECK(same_bits(back.values, old_data.values));
    CHECK(dir.list() == std::vector<std::string>{"v.node0.shard"});  // the temporary is gone
  }

  SUBCASE("a rename that fails (a directory under the final name) leaves nothing behind") {
    std::string blocked = dir.file("blocked.manifest");
    REQUIRE(mkdir(blocked.c_str(), 0700) == 0);
    CHECK_FALSE(write_manifest(blocked, sample_manifest(), &error));
    CHECK(contains(error, "cannot rename to " + blocked));
    CHECK(dir.list() == std::vector<std::string>{"blocked.manifest", "v.node0.shard"});
  }

  SUBCASE("a missing directory") {
    std::string nowhere = dir.file("no/such/dir/v.shard");
    CHECK_FALSE(write_shard_file(nowhere, old_data, &error));
    CHECK(contains(error, "cannot create " + nowhere + ".tmp."));
  }

  SUBCASE("a reader racing the writer only ever sees whole versions") {
    // Each version's values are all equal to its number; every read must succeed (the name
    // always holds a whole file) and be consistent.
    auto version_data = [](int version) {
      ShardFileData d = sample_shard(16, 1, 4000 + static_cast<size_t>(version) * 10, 0.0f);
      std::fill(d.values.begin(), d.values.end(), static_cast<float>(version));
      return d;
    };
    REQUIRE(write_shard_file(path, version_data(0), &error));
    std::atomic<bool> done{false};
    std::atomic<int> reads{0}, bad_reads{0};
    std::string reader_error;
    std::thread reader([&] {
      while (!done.load()) {
        ShardFileData back;
        std::string e;
        bool ok = read_shard_file(path, &back, &e);
        bool consistent = ok && back.values.size() == back.rows.size() * back.dim;
        for (size_t i = 1; consistent && i < back.values.size(); ++i)
          consistent = back.values[i] == back.values[0];
        if (!consistent) {
          if (bad_reads++ == 0) reader_error = ok ? "inconsistent values" : e;
        }
        ++reads;
      }
    });
    for (int version = 1; version <= 40; ++version)
      REQUIRE_MESSAGE(write_shard_file(path, version_data(version), &error), error);
    done = true;
    reader.join();
    CHECK_MESSAGE(bad_reads.load() == 0, reader_error);
    CHECK(reads.load() > 0);
    expect_no_temp_files(dir);
  }
}
