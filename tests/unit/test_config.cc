// parallaxd's settings: the TOML file (load_config_file), the command line
// (parse_command_line, which exits on bad usage, so those cases run in a child process) and
// the cross-field checks (finalize_config).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "daemon/cluster/membership_url.h"
#include "daemon/front/config.h"
#include "tests/integration/text_util.h"
#include "tests/unit/temp_dir.h"

using namespace px;
using px::test::TempDir;
using px::test::write_text;

namespace {

// PARALLAX_SOCKET changes the default socket: unset for the test, restored afterwards.
class SocketEnv {
 public:
  explicit SocketEnv(const char* value = nullptr) {
    if (const char* old = getenv("PARALLAX_SOCKET")) saved_ = old;
    if (value)
      setenv("PARALLAX_SOCKET", value, 1);
    else
      unsetenv("PARALLAX_SOCKET");
  }
  ~SocketEnv() {
    if (saved_)
      setenv("PARALLAX_SOCKET", saved_->c_str(), 1);
    else
      unsetenv("PARALLAX_SOCKET");
  }

 private:
  std::optional<std::string> saved_;
};

struct Argv {
  explicit Argv(std::vector<std::string> args) : strings(std::move(args)) {
    strings.insert(strings.begin(), "parallaxd");
    for (auto& s : strings) pointers.push_back(s.data());
    pointers.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(strings.size()); }
  char** argv() { return pointers.data(); }
  std::vector<std::string> strings;
  std::vector<char*> pointers;
};

DaemonConfig parse(std::vector<std::string> args) {
  Argv a(std::move(args));
  return parse_command_line(a.argc(), a.argv());
}

std::string drain(int fd) {
  std::string text;
  char buffer[4096];
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

struct Outcome {
  int exit_code = -1;  // -1: did not exit normally
  std::string out, err;
};

// Runs parse_command_line in a child (it exits on bad usage, --help and --version);
// a child whose parse succeeds exits 0 with nothing printed.
Outcome parse_in_child(std::vector<std::string> args) {
  Argv a(std::move(args));
  int out[2], err[2];
  REQUIRE(pipe(out) == 0);
  REQUIRE(pipe(err) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    close(out[0]);
    close(err[0]);
    close(out[1]);
    close(err[1]);
    parse_command_line(a.argc(), a.argv());
    _exit(0);
  }
  close(out[1]);
  close(err[1]);
  Outcome o;
  o.out = drain(out[0]);  // both stay far below a pipe's buffer: no deadlock
  o.err = drain(err[0]);
  close(out[0]);
  close(err[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
  return o;
}

using pxt::contains;

}  // namespace

TEST_CASE("config: no flags gives the documented defaults") {
  SocketEnv env;
  DaemonConfig c = parse({});
  CHECK(c.socket_path == "/run/parallax/parallaxd.sock");
  CHECK(c.group.empty());
  CHECK_FALSE(c.foreground);
  CHECK(c.threads == 0);
  CHECK(c.default_arena_bytes == 256ull << 20);
  CHECK(c.max_arena_bytes == 16ull << 30);
  CHECK(c.restore_dir.empty());
  CHECK(c.ring_capacity == 1024);
  CHECK(c.log_level == LogLevel::kInfo);
  CHECK(c.cluster == "parallax");
  CHECK(c.node_index == 0);
  CHECK(c.node_count == 1);
  CHECK(c.nodes.empty());
  CHECK(c.coordinator.empty());
  CHECK(c.listen.empty());
  CHECK(c.fabric_provider == "tcp;ofi_rxm");
  CHECK(c.fabric_address == "127.0.0.1");  // derived by finalize_config
  CHECK(c.fabric_port == 0);
  CHECK(c.chunk_bytes == 256ull << 10);
  CHECK(c.startup_timeout_ms == 60000);
  CHECK(c.peer_silence_ms == 10000);
  CHECK(c.job_limits.variables == 0);  // per-job limits: none unless configured
  CHECK(c.job_limits.requests_in_flight == 0);
  CHECK(c.job_limits.arena_bytes == 0);
  CHECK(c.job_limits.sparse_table_bytes == 0);
}

TEST_CASE("config: the per-job limits, from flags and from the [limits] table") {
  SocketEnv env;
  DaemonConfig c =
      parse({"--job-variables", "100", "--job-requests-in-flight", "64", "--job-arena-bytes",
             "1073741824", "--job-sparse-table-bytes", "8589934592"});
  CHECK(c.job_limits.variables == 100);
  CHECK(c.job_limits.requests_in_flight == 64);
  CHECK(c.job_limits.arena_bytes == 1ull << 30);
  CHECK(c.job_limits.sparse_table_bytes == 8ull << 30);
  TempDir dir;
  std::string path = dir.file("limits.toml");
  write_text(path,
             "[limits]\njob_variables = 7\njob_requests_in_flight = 8\n"
             "job_arena_bytes = 9\njob_sparse_table_bytes = 10\n");
  DaemonConfig f;
  std::string error;
  REQUIRE(load_config_file(path, &f, &error));
  CHECK(f.job_limits.variables == 7);
  CHECK(f.job_limits.requests_in_flight == 8);
  CHECK(f.job_limits.arena_bytes == 9);
  CHECK(f.job_limits.sparse_table_bytes == 10);
}

TEST_CASE("config: the sparse routes' estimate period and pinned moves, flags and [routes]") {
  SocketEnv env;
  DaemonConfig c =
      parse({"--route-estimate-steps", "4", "--route-auto-sequence", "alltoall-columns,ps"});
  CHECK(c.route_estimate_steps == 4);
  CHECK(c.route_auto_sequence == std::vector<std::string>{"alltoall-columns", "ps"});
  CHECK(DaemonConfig{}.route_estimate_steps == 32);
  TempDir dir;
  std::string path = dir.file("routes.toml");
  write_text(path, "[routes]\nestimate_steps = 8\nauto_sequence = [\"allreduce\", \"ps\"]\n");
  DaemonConfig f;
  std::string error;
  REQUIRE_MESSAGE(load_config_file(path, &f, &error), error);
  CHECK(f.route_estimate_steps == 8);
  CHECK(f.route_auto_sequence == std::vector<std::string>{"allreduce", "ps"});
  // A route the router does not know, and a period of 0, are named.
  write_text(path, "[routes]\nauto_sequence = [\"hybrid\"]\n");
  DaemonConfig g;
  CHECK_FALSE(load_config_file(path, &g, &error));
  CHECK(error.find("routes.auto_sequence: 'hybrid' is not ps,") != std::string::npos);
  write_text(path, "[routes]\nestimate_steps = 0\n");
  DaemonConfig h;
  CHECK_FALSE(load_config_file(path, &h, &error));
  CHECK(error.find("routes.estimate_steps") != std::string::npos);
}

TEST_CASE("config: the GPU backend's mode and path, flags and [gpu]") {
  SocketEnv env;
  DaemonConfig d = parse({});
  CHECK(d.gpu_mode == gpu::GpuMode::kAuto);
  CHECK(d.gpu_backend.empty());
  DaemonConfig c = parse({"--gpu", "required", "--gpu-backend", "/opt/px/libparallax_gpu.so"});
  CHECK(c.gpu_mode == gpu::GpuMode::kRequired);
  CHECK(c.gpu_backend == "/opt/px/libparallax_gpu.so");
  CHECK(parse({"--gpu", "off"}).gpu_mode == gpu::GpuMode::kOff);
  TempDir dir;
  std::string path = dir.file("gpu.toml");
  write_text(path, "[gpu]\nmode = \"off\"\nbackend = \"/x.so\"\n");
  DaemonConfig f;
  std::string error;
  REQUIRE_MESSAGE(load_config_file(path, &f, &error), error);
  CHECK(f.gpu_mode == gpu::GpuMode::kOff);
  CHECK(f.gpu_backend == "/x.so");
  write_text(path, "[gpu]\nmode = \"maybe\"\n");
  DaemonConfig g;
  CHECK_FALSE(load_config_file(path, &g, &error));
  CHECK(contains(error, "gpu.mode: 'maybe' is not auto, off or required"));
  Outcome o = parse_in_child({"--gpu", "on"});
  CHECK(o.exit_code == 2);
  CHECK(contains(o.err, "parallaxd: --gpu: gpu.mode: 'on' is not auto, off or required"));
}

TEST_CASE("config: device allreduces across nodes, gpu.cross_node and gpu.nccl_timeout_ms") {
  SocketEnv env;
  DaemonConfig d = parse({});
  CHECK(d.gpu_nccl);
  CHECK(d.nccl_timeout_ms == 60000);
  DaemonConfig c = parse({"--gpu-cross-node", "host-ring", "--nccl-timeout-ms", "5000"});
  CHECK_FALSE(c.gpu_nccl);
  CHECK(c.nccl_timeout_ms == 5000);
  CHECK(parse({"--gpu-cross-node", "auto"}).gpu_nccl);
  TempDir dir;
  std::string path = dir.file("gpu.toml");
  write_text(path, "[gpu]\ncross_node = \"host-ring\"\nnccl_timeout_ms = 250\n");
  DaemonConfig f;
  std::string error;
  REQUIRE_MESSAGE(load_config_file(path, &f, &error), error);
  CHECK_FALSE(f.gpu_nccl);
  CHECK(f.nccl_timeout_ms == 250);
  write_text(path, "[gpu]\ncross_node = \"nccl\"\n");
  DaemonConfig g;
  CHECK_FALSE(load_config_file(path, &g, &error));
  CHECK(contains(error, "gpu.cross_node: 'nccl' is not auto or host-ring"));
  write_text(path, "[gpu]\nnccl_timeout_ms = 10\n");
  DaemonConfig h;
  CHECK_FALSE(load_config_file(path, &h, &error));
  CHECK(contains(error, "gpu.nccl_timeout_ms"));
  Outcome o = parse_in_child({"--gpu-cross-node", "ring"});
  CHECK(o.exit_code == 2);
  CHECK(contains(o.err,
                 "parallaxd: --gpu-cross-node: gpu.cross_node: 'ring' is not auto or host-ring"));
}

TEST_CASE("config: every flag is parsed") {
  SocketEnv env;
  DaemonConfig c = parse({"--socket",
                          "/tmp/px.sock",
                          "--group",
                          "trainers",
                          "--foreground",
                          "--threads",
                          "3",
                          "--arena-bytes",
                          "2097152",
                          "--max-arena-bytes",
                          "4194304",
                          "--ring-capacity",
                          "64",
                          "--log-level",
                          "debug",
                          "--restore",
                          "/ckpt",
                          "--cluster",
                          "train-a",
                          "--node-index",
                          "1",
                          "--nodes",
                          "10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070",
                          "--listen",
                          "0.0.0.0:7070",
                          "--fabric-provider",
                          "verbs;ofi_rxm",
                          "--fabric-address",
                          "10.1.0.2",
                          "--fabric-port",
                          "7071",
                          "--chunk-bytes",
                          "65536",
                          "--startup-timeout-ms",
                          "5000",
                          "--peer-silence-ms",
                          "4000"});
  CHECK(c.socket_path == "/tmp/px.sock");
  CHECK(c.group == "trainers");
  CHECK(c.foreground);
  CHECK(c.threads == 3);
  CHECK(c.default_arena_bytes == 2097152);
  CHECK(c.max_arena_bytes == 4194304);
  CHECK(c.ring_capacity == 64);
  CHECK(c.log_level == LogLevel::kDebug);
  CHECK(c.restore_dir == "/ckpt");
  CHECK(c.cluster == "train-a");
  CHECK(c.node_index == 1);
  CHECK(c.nodes == std::vector<std::string>{"10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"});
  CHECK(c.node_count == 3);  // from nodes
  CHECK(c.listen == "0.0.0.0:7070");
  CHECK(c.fabric_provider == "verbs;ofi_rxm");
  CHECK(c.fabric_address == "10.1.0.2");
  CHECK(c.fabric_port == 7071);
  CHECK(c.chunk_bytes == 65536);
  CHECK(c.startup_timeout_ms == 5000);
  CHECK(c.peer_silence_ms == 4000);

  SUBCASE("coordinator and node count instead of nodes") {
    DaemonConfig d = parse({"--coordinator", "10.0.0.1:7070", "--node-count", "4", "--node-index",
                            "3", "--log-level", "warn"});
    CHECK(d.coordinator == "10.0.0.1:7070");
    CHECK(d.node_count == 4);
    CHECK(d.node_index == 3);
    CHECK(d.nodes.empty());
    CHECK(d.log_level == LogLevel::kWarn);
    CHECK(d.fabric_address == "127.0.0.1");  // a non-coordinator does not know its host
  }
  SUBCASE("log levels") {
    CHECK(parse({"--log-level", "error"}).log_level == LogLevel::kError);
    CHECK(parse({"--log-level", "info"}).log_level == LogLevel::kInfo);
  }
}

TEST_CASE("config: every key of a TOML file is read") {
  TempDir dir;
  std::string path = dir.file("parallaxd.toml");
  write_text(path, R"(
cluster = "train-a"
node_index = 2
nodes = ["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]
listen = "0.0.0.0:7070"
socket = "/run/px/a.sock"
group = "parallax"
threads = 4
arena_bytes = 1048576
max_arena_bytes = 2097152
ring_capacity = 256
log_level = "error"
restore = "/ckpt"

[fabric]
provider = "verbs;ofi_rxm"
address = "10.0.0.3"
port = 7071
chunk_bytes = 1048576

[timeouts]
startup_ms = 100
peer_silence_ms = 3600000
)");
  DaemonConfig c;
  std::string error;
  REQUIRE_MESSAGE(load_config_file(path, &c, &error), error);
  CHECK(c.cluster == "train-a");
  CHECK(c.node_index == 2);
  CHECK(c.nodes.size() == 3);
  CHECK(c.nodes[2] == "10.0.0.3:7070");
  CHECK(c.listen == "0.0.0.0:7070");
  CHECK(c.socket_path == "/run/px/a.sock");
  CHECK(c.group == "parallax");
  CHECK(c.threads == 4);
  CHECK(c.default_arena_bytes == 1048576);
  CHECK(c.max_arena_bytes == 2097152);
  CHECK(c.ring_capacity == 256);
  CHECK(c.log_level == LogLevel::kError);
  CHECK(c.restore_dir == "/ckpt");
  CHECK(c.fabric_provider == "verbs;ofi_rxm");
  CHECK(c.fabric_address == "10.0.0.3");
  CHECK(c.fabric_port == 7071);
  CHECK(c.chunk_bytes == 1048576);
  CHECK(c.startup_timeout_ms == 100);
  CHECK(c.peer_silence_ms == 3600000);
  REQUIRE_MESSAGE(finalize_config(&c, &error), error);
  CHECK(c.node_count == 3);

  SUBCASE("coordinator form, dotted keys") {
    write_text(path,
               "coordinator = \"10.0.0.1:7070\"\nnode_count = 3\nfabric.port = 9000\n"
               "timeouts.startup_ms = 2000\n");
    DaemonConfig d;
    REQUIRE_MESSAGE(load_config_file(path, &d, &error), error);
    CHECK(d.coordinator == "10.0.0.1:7070");
    CHECK(d.node_count == 3);
    CHECK(d.fabric_port == 9000);
    CHECK(d.startup_timeout_ms == 2000);
    REQUIRE_MESSAGE(finalize_config(&d, &error), error);
    CHECK(d.fabric_address == "10.0.0.1");  // node 0 is the coordinator: its host
  }
  SUBCASE("an empty file changes nothing") {
    write_text(path, "# nothing\n");
    DaemonConfig d;
    REQUIRE_MESSAGE(load_config_file(path, &d, &error), error);
    CHECK(d.threads == DaemonConfig{}.threads);
    CHECK(d.socket_path == DaemonConfig{}.socket_path);
  }
}

namespace {

struct BadValue {
  const char* key;    // the TOML key
  const char* toml;   // its value as TOML source
  const char* flag;   // the same setting as a flag
  const char* value;  // the flag's value
};

const BadValue kBadValues[] = {
    {"threads", "257", "--threads", "257"},
    {"threads", "-1", "--threads", "-1"},
    {"threads", "\"four\"", "--threads", "four"},
    {"threads", "\"4x\"", "--threads", "4x"},
    {"threads", "\"\"", "--threads", ""},
    {"arena_bytes", "1048575", "--arena-bytes", "1048575"},
    {"max_arena_bytes", "\" -1\"", "--max-arena-bytes", " -1"},
    {"max_arena_bytes", "\"18446744073709551616\"", "--max-arena-bytes", "18446744073709551616"},
    {"ring_capacity", "1", "--ring-capacity", "1"},
    {"ring_capacity", "96", "--ring-capacity", "96"},
    {"ring_capacity", "2097152", "--ring-capacity", "2097152"},
    {"log_level", "\"loud\"", "--log-level", "loud"},
    {"log_level", "\"INFO\"", "--log-level", "INFO"},
    {"node_index", "1024", "--node-index", "1024"},
    {"node_count", "0", "--node-count", "0"},
    {"node_count", "129", "--node-count", "129"},
    {"fabric.port", "65536", "--fabric-port", "65536"},
    {"fabric.chunk_bytes", "4095", "--chunk-bytes", "4095"},
    {"fabric.chunk_bytes", "1073741825", "--chunk-bytes", "1073741825"},
    {"timeouts.peer_silence_ms", "999", "--peer-silence-ms", "999"},
    {"timeouts.startup_ms", "99", "--startup-timeout-ms", "99"},
    {"limits.job_variables", "16777217", "--job-variables", "16777217"},
    {"limits.job_requests_in_flight", "-1", "--job-requests-in-flight", "-1"},
    {"limits.job_arena_bytes", "\"lots\"", "--job-arena-bytes", "lots"},
    {"limits.job_sparse_table_bytes", "\"1e9\"", "--job-sparse-table-bytes", "1e9"},
};

// "fabric.port = 1" is the same TOML as "[fabric] port = 1".
std::string toml_line(const BadValue& bad) {
  return std::string(bad.key) + " = " + bad.toml + "\n";
}

}  // namespace

TEST_CASE("config: a bad value in the file is refused with a message naming the key") {
  TempDir dir;
  std::string path = dir.file("bad.toml");
  for (const BadValue& bad : kBadValues) {
    CAPTURE(toml_line(bad));
    write_text(path, toml_line(bad));
    DaemonConfig c;
    std::string error;
    CHECK_FALSE(load_config_file(path, &c, &error));
    CHECK(contains(error, path));
    CHECK(contains(error, bad.key));
  }
}

TEST_CASE("config: a bad flag value exits 2 with a message naming the flag and the key") {
  SocketEnv env;
  for (const BadValue& bad : kBadValues) {
    CAPTURE(bad.flag);
    CAPTURE(bad.value);
    Outcome o = parse_in_child({bad.flag, bad.value});
    CHECK(o.exit_code == 2);
    CHECK(contains(o.err, std::string("parallaxd: ") + bad.flag + ": " + bad.key));
    CHECK(contains(o.err, "parallaxd --help"));
    CHECK(o.out.empty());
  }
}

TEST_CASE("config: values of the wrong TOML type are refused naming the key") {
  TempDir dir;
  std::string path = dir.file("bad.toml");
  const char* cases[][2] = {
      {"threads = 4.5\n", "threads"},
      {"threads = true\n", "threads"},
      {"nodes = [\"a:1\", 2]\n", "nodes"},
      {"[fabric]\nport = 1.0\n", "fabric.port"},
      {"[fabric.extra]\nx = 1\n", "fabric.extra"},
      {"cluster = 1979-05-27\n", "cluster"},
  };
  for (auto& [text, key] : cases) {
    CAPTURE(text);
    write_text(path, text);
    DaemonConfig c;
    std::string error;
    CHECK_FALSE(load_config_file(path, &c, &error));
    CHECK(contains(error, path + ": " + key + " has the wrong type"));
  }
}

TEST_CASE("config: unknown keys, tables and flags are refused") {
  TempDir dir;
  std::string path = dir.file("unknown.toml");
  DaemonConfig c;
  std::string error;

  write_text(path, "threads = 2\nthread = 2\n");
  CHECK_FALSE(load_config_file(path, &c, &error));
  CHECK(contains(error, path + ": unknown setting 'thread'"));

  write_text(path, "[fabric]\nprovider = \"tcp\"\nbogus = 1\n");
  CHECK_FALSE(load_config_file(path, &c, &error));
  CHECK(contains(error, "unknown setting 'fabric.bogus'"));

  write_text(path, "[timeout]\nstartup_ms = 1000\n");
  CHECK_FALSE(load_config_file(path, &c, &error));
  CHECK(contains(error, path + ": unknown table [timeout]"));

  write_text(path, "fabric = \"tcp\"\n");  // a table's name as a plain key
  CHECK_FALSE(load_config_file(path, &c, &error));
  CHECK(contains(error, "unknown setting 'fabric'"));

  SocketEnv env;
  Outcome o = parse_in_child({"--threads", "2", "--thread", "2"});
  CHECK(o.exit_code == 2);
  CHECK(contains(o.err, "unknown option '--thread'"));
  o = parse_in_child({"threads", "2"});
  CHECK(o.exit_code == 2);
  CHECK(contains(o.err, "unknown option 'threads'"));
}

TEST_CASE("config: a file that is missing or not TOML is refused naming the file") {
  TempDir dir;
  DaemonConfig c;
  std::string error;
  std::string missing = dir.file("missing.toml");
  CHECK_FALSE(load_config_file(missing, &c, &error));
  CHECK(contains(error, missing));

  std::string broken = dir.file("broken.toml");
  write_text(broken, "threads = 2\ncluster = \"unterminated\n");
  CHECK_FALSE(load_config_file(broken, &c, &error));
  CHECK(contains(error, broken + ":2:"));  // the line of the error

  SocketEnv env;
  Outcome o = parse_in_child({"--config", broken});
  CHECK(o.exit_code == 2);
  CHECK(contains(o.err, broken + ":2:"));
  o = parse_in_child({"--config"});
  CHECK(o.exit_code == 2);
  CHECK(contains(o.err, "--config needs a file"));
}

TEST_CASE(
    "config: flags override the file wherever --config stands, the file overrides the "
    "environment") {
  TempDir dir;
  std::string path = dir.file("parallaxd.toml");
  write_text(path,
             "threads = 2\nsocket = \"/file.sock\"\ngroup = \"from-file\"\n"
             "[fabric]\nport = 1000\n[timeouts]\nstartup_ms = 1000\n");
  SocketEnv env("/env.sock");

  DaemonConfig c = parse({"--threads", "8", "--config", path, "--fabric-port", "2000"});
  CHECK(c.threads == 8);                 // flag before --config still wins
  CHECK(c.fabric_port == 2000);          // flag after --config wins
  CHECK(c.group == "from-file");         // the file where no flag is given
  CHECK(c.startup_timeout_ms == 1000);   // a file table key where no flag is given
  CHECK(c.socket_path == "/file.sock");  // the file over $PARALLAX_SOCKET
  CHECK(c.chunk_bytes == 256ull << 10);  // neither: the default

  c = parse({"--config", path, "--socket", "/flag.sock"});
  CHECK(c.socket_path == "/flag.sock");

  c = parse({});
  CHECK(c.socket_path == "/env.sock");  // $PARALLAX_SOCKET over the built-in default

  SUBCASE("a flag does not rescue a bad file value") {
    write_text(path, "threads = 1000\n");
    Outcome o = parse_in_child({"--config", path, "--threads", "2"});
    CHECK(o.exit_code == 2);
    CHECK(contains(o.err, "threads"));
  }
  SUBCASE("two files: the later one wins") {
    std::string second = dir.file("second.toml");
    write_text(second, "threads = 5\n");
    c = parse({"--config", path, "--config", second});
    CHECK(c.threads == 5);
    CHECK(c.group == "from-file");
  }
}

TEST_CASE("config: usage errors, --help and --version") {
  SocketEnv env;
  Outcome o = parse_in_child({"--threads"});
  CHECK(o.exit_code == 2);
  CHECK(contains(o.err, "--threads needs a value"));

  o = parse_in_child({"--help"});
  CHECK(o.exit_code == 0);
  CHECK(contains(o.out, "usage: parallaxd [options]"));
  for (const char* flag : {"--config",          "--socket",          "--group",
                           "--foreground",      "--threads",         "--arena-bytes",
                           "--max-arena-bytes", "--ring-capacity",   "--log-level",
                           "--restore",         "--cluster",         "--node-index",
                           "--nodes",           "--coordinator",     "--node-count",
                           "--listen",          "--fabric-provider", "--fabric-address",
                           "--fabric-port",     "--chunk-bytes",     "--startup-timeout-ms",
                           "--peer-silence-ms", "--checkpoint-dir",  "--checkpoint-interval-s",
                           "--checkpoint-keep", "--version"}) {
    CAPTURE(flag);
    CHECK(contains(o.out, std::string("  ") + flag + " "));
  }
  CHECK(o.err.empty());

  o = parse_in_child({"--threads", "2", "-h"});
  CHECK(o.exit_code == 0);
  CHECK(contains(o.out, "usage: parallaxd"));

  o = parse_in_child({"--version"});
  CHECK(o.exit_code == 0);
  CHECK(contains(o.out, "parallaxd "));
  CHECK(contains(o.out, "(ABI "));

  o = parse_in_child({"--threads", "4"});  // a good command line: the child's parse returns
  CHECK(o.exit_code == 0);
  CHECK(o.err.empty());
}

TEST_CASE("config: cross-field checks of finalize_config") {
  std::string error;
  SUBCASE("arena larger than the largest arena") {
    DaemonConfig c;
    c.default_arena_bytes = c.max_arena_bytes + 1;
    CHECK_FALSE(finalize_config(&c, &error));
    CHECK(contains(error, "arena_bytes"));
    CHECK(contains(error, "max_arena_bytes"));
  }
  SUBCASE("periodic checkpoints need a directory; the directories default to each other") {
    DaemonConfig c;
    c.checkpoint_interval_s = 60;
    CHECK_FALSE(finalize_config(&c, &error));
    CHECK(contains(error, "service.checkpoint_interval_s"));
    CHECK(contains(error, "service.checkpoint_dir"));
    DaemonConfig dir;
    dir.checkpoint_interval_s = 60;
    dir.drain_checkpoint_dir = "/var/lib/parallax/checkpoints";
    REQUIRE(finalize_config(&dir, &error));
    CHECK(dir.restore_dir == "/var/lib/parallax/checkpoints");  // a restart restores it
    DaemonConfig restore;
    restore.restore_dir = "/r";
    REQUIRE(finalize_config(&restore, &error));
    CHECK(restore.drain_checkpoint_dir == "/r");
  }
  SUBCASE("node_count disagreeing with nodes") {
    DaemonConfig c;
    c.nodes = {"a:1", "b:1"};
    c.node_count = 3;
    CHECK_FALSE(finalize_config(&c, &error));
    CHECK(contains(error, "node_count 3 but nodes lists 2"));
  }
  SUBCASE("node_count > 1 with neither nodes nor coordinator") {
    DaemonConfig c;
    c.node_count = 2;
    CHECK_FALSE(finalize_config(&c, &error));
    CHECK(contains(error, "needs nodes or coordinator"));
  }
  SUBCASE("node_index beyond the node count") {
    DaemonConfig c;
    c.nodes = {"a:1", "b:1"};
    c.node_index = 2;
    CHECK_FALSE(finalize_config(&c, &error));
    CHECK(contains(error, "node_index 2 is not below the node count 2"));
    DaemonConfig single;
    single.node_index = 1;
    CHECK_FALSE(finalize_config(&single, &error));
    CHECK(contains(error, "node_index 1"));
  }
  SUBCASE("the fabric address comes from this node's entry") {
    DaemonConfig c;
    c.nodes = {"10.0.0.1:7070", "host-b:7070", "0.0.0.0:7070"};
    c.node_index = 1;
    REQUIRE(finalize_config(&c, &error));
    CHECK(c.node_count == 3);
    CHECK(c.fabric_address == "host-b");
    DaemonConfig any;
    any.nodes = c.nodes;
    any.node_index = 2;
    REQUIRE(finalize_config(&any, &error));
    CHECK(any.fabric_address == "127.0.0.1");  // a wildcard is no address to reach
    DaemonConfig set;
    set.nodes = c.nodes;
    set.fabric_address = "192.168.1.9";
    REQUIRE(finalize_config(&set, &error));
    CHECK(set.fabric_address == "192.168.1.9");  // an explicit one is kept
  }
  SUBCASE("membership on etcd: its URL, listen, and no configured index or node list") {
    DaemonConfig c =
        parse({"--membership", "etcd://10.0.0.5:2379,10.0.0.6:2379/px/prod/", "--node-count", "4",
               "--listen", "10.0.0.2:7070", "--membership-lease-s", "7"});
    CHECK(c.membership == "etcd://10.0.0.5:2379,10.0.0.6:2379/px/prod/");
    CHECK(c.membership_lease_s == 7);
    CHECK(c.fabric_address == "10.0.0.2");  // its own control address's host
    MembershipUrl url;
    REQUIRE(parse_membership_url(c.membership, &url, &error));
    CHECK(url.endpoints == std::vector<std::string>{"10.0.0.5:2379", "10.0.0.6:2379"});
    CHECK(url.prefix == "/px/prod");
    DaemonConfig indexed;
    indexed.membership = "etcd://h:2379/p";
    indexed.node_count = 2;
    indexed.listen = "h:1";
    indexed.node_index_given = true;
    CHECK_FALSE(finalize_config(&indexed, &error));
    CHECK(contains(error, "the node index is assigned"));
    DaemonConfig no_listen;
    no_listen.membership = "etcd://h:2379/p";
    no_listen.node_count = 2;
    CHECK_FALSE(finalize_config(&no_listen, &error));
    CHECK(contains(error, "needs listen"));
    // The fewest nodes to re-form on: node_count unless set, at most node_count, and only
    // with membership.
    CHECK(cluster_config(c).min_nodes == 4);
    DaemonConfig survivors = parse({"--membership", "etcd://h:2379/p", "--node-count", "4",
                                    "--listen", "h:1", "--membership-min-nodes", "3"});
    CHECK(cluster_config(survivors).min_nodes == 3);
    // One node may go on alone (an epoch of one); none is no cluster.
    DaemonConfig alone = parse({"--membership", "etcd://h:2379/p", "--node-count", "2", "--listen",
                                "h:1", "--membership-min-nodes", "1"});
    CHECK(cluster_config(alone).min_nodes == 1);
    // The most nodes: node indices past node_count, which the first epoch forms with (and
    // the fewest by default); at least node_count, and only with membership.
    DaemonConfig grows = parse({"--membership", "etcd://h:2379/p", "--node-count", "2", "--listen",
                                "h:1", "--membership-max-nodes", "4"});
    CHECK(cluster_indices(grows) == 4);
    CHECK(cluster_config(grows).node_count == 4);
    CHECK(cluster_config(grows).first_nodes == 2);
    CHECK(cluster_config(grows).min_nodes == 2);
    CHECK(cluster_indices(alone) == 2);
    grows.membership_max_nodes = 1;
    CHECK_FALSE(finalize_config(&grows, &error));
    CHECK(contains(error, "membership_max_nodes (1) is less than node_count (2)"));
    DaemonConfig static_max;
    static_max.membership_max_nodes = 3;
    CHECK_FALSE(finalize_config(&static_max, &error));
    CHECK(contains(error, "membership_max_nodes needs membership"));
    survivors.membership_min_nodes = 5;
    CHECK_FALSE(finalize_config(&survivors, &error));
    CHECK(contains(error, "membership_min_nodes (5) is more than node_count (4)"));
    DaemonConfig static_min;
    static_min.membership_min_nodes = 2;
    CHECK_FALSE(finalize_config(&static_min, &error));
    CHECK(contains(error, "membership_min_nodes needs membership"));
    for (const char* bad : {"http://h:2379/p", "etcd://h:2379", "etcd://h/p", "etcd://:1/p",
                            "etcd://h:2379,/p", "etcd://h:x/p"}) {
      CAPTURE(bad);
      DaemonConfig b;
      b.membership = bad;
      b.node_count = 2;
      b.listen = "h:1";
      CHECK_FALSE(finalize_config(&b, &error));
      CHECK(contains(error, "membership: "));
    }
  }
  SUBCASE("flags reach finalize_config too") {
    SocketEnv env;
    Outcome o = parse_in_child({"--arena-bytes", "4194304", "--max-arena-bytes", "2097152"});
    CHECK(o.exit_code == 2);
    CHECK(contains(o.err, "arena_bytes is larger than max_arena_bytes"));
    o = parse_in_child({"--node-count", "2"});
    CHECK(o.exit_code == 2);
    CHECK(contains(o.err, "needs nodes or coordinator"));
  }
}
