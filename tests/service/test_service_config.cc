// A bad configuration refuses to start with one line naming the key (what the unit's
// ExecStartPre, `parallaxd --check-config`, and a plain start both print), and the example
// configuration that cmake --install puts in place loads cleanly.
#include <doctest/doctest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/service/service_util.h"

using namespace pxt;

namespace {

struct Refusal {
  const char* what;
  const char* toml;   // nullptr: no file at all
  const char* names;  // the one line must contain this
};

int count_lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("service: a bad configuration refuses to start with one line naming the key") {
  ScratchDir scratch("svc-config");
  std::string socket = scratch.path() + "/d.sock";
  const Refusal cases[] = {
      {"unknown key", "threads = 2\nbogus = 1\n", "unknown setting 'bogus'"},
      {"unknown key in a table", "[service]\ndrain_timeout = 5\n",
       "unknown setting 'service.drain_timeout'"},
      {"unknown table", "[servce]\ndrain_timeout_ms = 5\n", "unknown table [servce]"},
      {"wrong type", "threads = true\n", "threads has the wrong type (a boolean"},
      {"wrong type in a table", "[service]\ndrain_timeout_ms = 1.5\n",
       "service.drain_timeout_ms has the wrong type (a float"},
      {"not a number", "[service]\ndrain_timeout_ms = \"soon\"\n",
       "service.drain_timeout_ms: 'soon' is not an integer in 0..3600000"},
      {"out of range", "[service]\ncheckpoint_timeout_ms = 10\n",
       "service.checkpoint_timeout_ms: '10' is not an integer in 100..86400000"},
      {"negative", "threads = -1\n", "threads: '-1' is not an integer in 0..256"},
      {"not TOML", "threads = = 2\n", "parallaxd.toml:1:"},
      {"missing file", nullptr, "cannot read the configuration: No such file or directory"},
  };
  for (const Refusal& c : cases) {
    CAPTURE(c.what);
    std::string config = scratch.path() + "/parallaxd.toml";
    unlink(config.c_str());
    if (c.toml) write_text_file(config, c.toml);
    for (bool check_only : {true, false}) {
      std::vector<std::string> argv = {PX_DAEMON_PATH, "--config", config, "--socket", socket};
      argv.push_back(check_only ? "--check-config" : "--foreground");
      std::string output;
      int code = run_command(argv, &output, 10000);
      CAPTURE(output);
      CHECK(code == 2);
      CHECK(count_lines(output) == 1);
      CHECK(contains(output, c.names));
      CHECK(contains(output, config));
      CHECK(access(socket.c_str(), F_OK) != 0);  // it never listened
    }
  }
}

TEST_CASE("service: --check-config accepts the example configuration, and names a missing group") {
  std::string example = std::string(PX_SOURCE_DIR) + "/packaging/parallaxd.toml";
  std::string output;
  // The example's group is the service's own, made by sysusers.d: absent on a test machine.
  CHECK(run_command({PX_DAEMON_PATH, "--config", example, "--check-config"}, &output) == 2);
  CHECK(output == "parallaxd: group: 'parallax' does not exist\n");
  CHECK(run_command({PX_DAEMON_PATH, "--config", example, "--group", "root", "--check-config"},
                    &output) == 0);
  CHECK(output ==
        "parallaxd: configuration OK (socket /run/parallax/parallaxd.sock, 1 node, drain "
        "checkpoints in /var/lib/parallax/checkpoints)\n");
}

TEST_CASE("service: a log file that cannot be opened stops the start with one line") {
  std::string output;
  CHECK(run_command({PX_DAEMON_PATH, "--foreground", "--socket", "/tmp/pxt-svc-nolog.sock",
                     "--log-file", "/nonexistent-dir/parallaxd.log"},
                    &output) == 1);
  CHECK(output ==
        "parallaxd: log.file: cannot open log file /nonexistent-dir/parallaxd.log: No such file or "
        "directory\n");
}
