// pxctl: the parallaxd admin tool. Talks to the local daemon over its Unix socket (the
// workers' socket, with the same peer-credential check) with admin requests (control.fbs:
// AdminRequest), prints tables, or JSON with --json. Every wait has a deadline (--timeout).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parallax_c.h"  // status values only: pxctl links no libparallax
#include "tools/pxctl/output.h"
#include "tools/pxctl/render.h"
#include "transport/ipc/control_channel.h"

namespace {

namespace control = px::control;
using control::AdminCommand;

const char kUsage[] =
    "usage: pxctl [--socket PATH] [--json] [--timeout SEC] COMMAND [ARGS]\n"
    "\n"
    "Asks the local parallaxd (over its Unix socket) what it is doing, or tells it what to do.\n"
    "\n"
    "commands:\n"
    "  status                     the daemon: node, cluster, workers, jobs, metrics, timeline\n"
    "  jobs                       jobs on this node and their workers\n"
    "  vars [--job NAME]          variables with their counters (sparse: alpha, rows, bytes)\n"
    "  peers                      the cluster's nodes as this daemon sees them\n"
    "  stalls [--job NAME] [--min-ms N]\n"
    "                             operations waiting longer than the daemon's stall report\n"
    "                             threshold (or N ms), and whom they wait for\n"
    "  timeline on FILE           write every operation to FILE as a Chrome trace\n"
    "  timeline off               stop; FILE is then a complete JSON array\n"
    "  checkpoint DIR             checkpoint every job's sparse variables into DIR\n"
    "  drain                      make the daemon drain and exit (SIGTERM); waits until it did\n"
    "\n"
    "options:\n"
    "  --socket PATH    the daemon's socket (default $PARALLAX_SOCKET, else\n"
    "                   /run/parallax/parallaxd.sock)\n"
    "  --json           print JSON (one object) instead of tables\n"
    "  --timeout SEC    deadline of the whole command (default 10; checkpoint 120; drain 120)\n"
    "\n"
    "timeline, checkpoint and drain need parallaxd's own user or root. FILE and DIR are\n"
    "written by the daemon, relative paths are taken from pxctl's directory.\n"
    "exit status: 0 done; 1 the daemon refused or failed the command; 2 usage; 3 the daemon\n"
    "cannot be reached (not running, permission denied); 4 timed out\n";

enum Exit { kOk = 0, kFailed = 1, kBadUsage = 2, kUnreachable = 3, kTimedOut = 4 };

struct Options {
  std::string socket;
  bool json = false;
  double timeout_s = -1;
  std::string command;
  std::vector<std::string> args;
  std::string job;
  int64_t min_wait_ms = -1;
};

bool g_json = false;

[[noreturn]] void die(Exit code, const std::string& message) {
  if (g_json)
    printf("%s\n", pxctl::JsonObject().add("ok", false).add("error", message).str().c_str());
  fprintf(stderr, "pxctl: %s\n", message.c_str());
  exit(code);
}

[[noreturn]] void usage(const std::string& message) {
  fprintf(stderr, "pxctl: %s\n(see pxctl --help)\n", message.c_str());
  exit(kBadUsage);
}

// The absolute form of a path the daemon is to write (it does not share our directory).
std::string absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) die(kFailed, std::string("getcwd: ") + strerror(errno));
  return std::string(cwd) + "/" + path;
}

// One connection to the daemon, every wait bounded by deadline_ns.
class Connection {
 public:
  Connection(const std::string& path, int64_t deadline_ns) : path_(path), deadline_(deadline_ns) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) usage("socket path too long: " + path);
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) die(kFailed, std::string("socket: ") + strerror(errno));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      int e = errno;
      if (e == ENOENT || e == ECONNREFUSED)
        die(kUnreachable, "parallaxd is not running: nothing listens on " + path + " (" +
                              strerror(e) + "; --socket or PARALLAX_SOCKET name another)");
      if (e == EACCES || e == EPERM)
        die(kUnreachable, "permission denied: cannot connect to " + path + " (" + strerror(e) +
                              "; run as parallaxd's user, root, or a member of its group)");
      die(kUnreachable, "cannot connect to " + path + ": " + strerror(e));
    }
  }
  ~Connection() { ::close(fd_); }

  // Sends request, returns the reply (exits on any failure, naming it).
  const control::AdminReply& ask(flatbuffers::FlatBufferBuilder& b,
                                 flatbuffers::Offset<control::AdminRequest> request) {
    std::string error;
    bool timed_out = false;
    std::string frame = px::finish_frame(b, control::Body::AdminRequest, request.Union());
    if (!px::send_frame_blocking(fd_, frame, deadline_, &error, &timed_out))
      die(timed_out ? kTimedOut : kUnreachable, error + " (" + path_ + ")");
    if (!px::recv_frame_blocking(fd_, decoder_, &payload_, nullptr, deadline_, &error,
                                 &timed_out)) {
      if (timed_out) die(kTimedOut, "parallaxd did not answer in time (" + path_ + ")");
      die(kUnreachable, error + " without answering (" + path_ +
                            "; a parallaxd older than pxctl knows no admin requests)");
    }
    const control::Message* message = px::parse_frame(payload_, &error);
    if (!message) die(kFailed, "parallaxd's answer: " + error);
    if (message->body_type() == control::Body::HelloReply) {
      // What the daemon sends a connection it refuses, workers and pxctl alike.
      const control::HelloReply* refused = message->body_as_HelloReply();
      std::string why = refused->message() ? refused->message()->str() : "refused";
      die(kUnreachable, refused->status() == PX_ERR_PERMISSION ? "permission denied: " + why : why);
    }
    if (message->body_type() != control::Body::AdminReply)
      die(kFailed, std::string("parallaxd answered with an unexpected ") +
                       control::EnumNameBody(message->body_type()));
    return *message->body_as_AdminReply();
  }

  // True once the daemon closed the connection (by the deadline; false if it did not).
  bool wait_closed() {
    std::string payload, error;
    bool timed_out = false;
    while (
        px::recv_frame_blocking(fd_, decoder_, &payload, nullptr, deadline_, &error, &timed_out)) {
    }
    return !timed_out;
  }

 private:
  std::string path_;
  int64_t deadline_;
  int fd_ = -1;
  px::FrameDecoder decoder_;
  std::string payload_;
};

// Nothing listens on path any more (the daemon exited), polled until deadline_ns.
bool wait_gone(const std::string& path, int64_t deadline_ns) {
  for (;;) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool listening = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (fd >= 0) ::close(fd);
    if (!listening) return true;
    if (px::monotonic_ns() >= deadline_ns) return false;
    usleep(50 * 1000);
  }
}

flatbuffers::Offset<control::AdminRequest> request(flatbuffers::FlatBufferBuilder& b,
                                                   AdminCommand command, const Options& o,
                                                   uint32_t offset = 0,
                                                   const std::string& path = "",
                                                   int64_t timeout_ms = 0) {
  return control::CreateAdminRequestDirect(b, command, path.empty() ? nullptr : path.c_str(),
                                           timeout_ms, offset,
                                           o.job.empty() ? nullptr : o.job.c_str(), o.min_wait_ms);
}

const control::AdminReply& checked(const control::AdminReply& reply) {
  if (reply.status() != 0) {
    std::string message = reply.message() ? reply.message()->str() : "failed";
    die(reply.status() == PX_ERR_TIMEOUT ? kTimedOut : kFailed, message);
  }
  return reply;
}

// A list command: every page, each item as JSON and as a table row.
template <class Item>
int list(Connection& c, AdminCommand command, const Options& o, const char* key,
         const flatbuffers::Vector<flatbuffers::Offset<Item>>* (control::AdminReply::*field)()
             const,
         std::string (*to_json)(const Item&), void (*to_row)(pxctl::Table&, const Item&),
         pxctl::Table table, std::string (*note)(const Item&) = nullptr) {
  std::vector<std::string> items, notes;
  uint32_t offset = 0;
  do {
    flatbuffers::FlatBufferBuilder b;
    const control::AdminReply& reply = checked(c.ask(b, request(b, command, o, offset)));
    if (const auto* v = (reply.*field)()) {
      for (const Item* item : *v) {
        items.push_back(to_json(*item));
        to_row(table, *item);
        if (note && !note(*item).empty()) notes.push_back(note(*item));
      }
    }
    offset = reply.next_offset();
  } while (offset != 0);
  if (o.json) {
    printf("%s\n", pxctl::JsonObject().add_raw(key, pxctl::json_array(items)).str().c_str());
  } else {
    fputs(table.empty() ? "(none)\n" : table.str().c_str(), stdout);
    for (const std::string& n : notes) printf("%s\n", n.c_str());
  }
  return kOk;
}

void print_message(const Options& o, const control::AdminReply& reply) {
  std::string message = reply.message() ? reply.message()->str() : "";
  if (o.json)
    printf("%s\n", pxctl::JsonObject().add("ok", true).add("message", message).str().c_str());
  else
    printf("%s\n", message.c_str());
}

Options parse(int argc, char** argv) {
  Options o;
  if (const char* env = getenv("PARALLAX_SOCKET"); env && *env) o.socket = env;
  if (o.socket.empty()) o.socket = "/run/parallax/parallaxd.sock";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      fputs(kUsage, stdout);
      exit(kOk);
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--socket") {
      o.socket = value();
    } else if (a == "--timeout") {
      std::string v = value();
      char* end = nullptr;
      o.timeout_s = strtod(v.c_str(), &end);
      if (*end || !(o.timeout_s > 0) || o.timeout_s > 86400)
        usage("--timeout: '" + v + "' is not a number of seconds in (0, 86400]");
    } else if (a == "--job") {
      o.job = value();
    } else if (a == "--min-ms") {
      std::string v = value();
      char* end = nullptr;
      long long n = strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 0) usage("--min-ms: '" + v + "' is not a count of ms");
      o.min_wait_ms = n;
    } else if (a.size() > 1 && a[0] == '-') {
      usage("unknown option '" + a + "'");
    } else if (o.command.empty()) {
      o.command = a;
    } else {
      o.args.push_back(a);
    }
  }
  if (o.command.empty()) usage("no command");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  g_json = o.json;
  const std::string& cmd = o.command;
  auto args = [&](size_t n) {
    if (o.args.size() != n)
      usage(cmd + " takes " + std::to_string(n) + " argument" + (n == 1 ? "" : "s"));
  };
  bool long_wait = cmd == "checkpoint" || cmd == "drain";
  double timeout_s = o.timeout_s > 0 ? o.timeout_s : long_wait ? 120 : 10;
  int64_t deadline = px::monotonic_ns() + static_cast<int64_t>(timeout_s * 1e9);
  if ((!o.job.empty() && cmd != "vars" && cmd != "stalls") ||
      (o.min_wait_ms >= 0 && cmd != "stalls"))
    usage("--job is for vars and stalls, --min-ms for stalls");

  if (cmd == "status") {
    args(0);
    Connection c(o.socket, deadline);
    flatbuffers::FlatBufferBuilder b;
    const control::AdminReply& reply = checked(c.ask(b, request(b, AdminCommand::Status, o)));
    if (!reply.daemon()) die(kFailed, "parallaxd's answer has no status");
    fputs(
        (o.json ? pxctl::status_json(*reply.daemon()) + "\n" : pxctl::status_text(*reply.daemon()))
            .c_str(),
        stdout);
    return kOk;
  }
  if (cmd == "jobs") {
    args(0);
    Connection c(o.socket, deadline);
    return list<control::AdminJob>(c, AdminCommand::Jobs, o, "jobs", &control::AdminReply::jobs,
                                   pxctl::job_json, pxctl::job_row, pxctl::job_table(),
                                   pxctl::job_notes);
  }
  if (cmd == "vars") {
    args(0);
    Connection c(o.socket, deadline);
    return list<control::AdminVariable>(c, AdminCommand::Vars, o, "variables",
                                        &control::AdminReply::variables, pxctl::variable_json,
                                        pxctl::variable_row, pxctl::variable_table());
  }
  if (cmd == "peers") {
    args(0);
    Connection c(o.socket, deadline);
    return list<control::AdminPeer>(c, AdminCommand::Peers, o, "peers", &control::AdminReply::peers,
                                    pxctl::peer_json, pxctl::peer_row, pxctl::peer_table());
  }
  if (cmd == "stalls") {
    args(0);
    Connection c(o.socket, deadline);
    auto no_row = [](pxctl::Table& t, const control::AdminStall& s) {
      t.row({pxctl::stall_text(s)});
    };
    return list<control::AdminStall>(c, AdminCommand::Stalls, o, "stalls",
                                     &control::AdminReply::stalls, pxctl::stall_json, no_row,
                                     pxctl::Table({"STALLED OPERATIONS"}));
  }
  if (cmd == "timeline") {
    if (o.args.empty() || (o.args[0] != "on" && o.args[0] != "off"))
      usage("timeline on FILE | timeline off");
    bool on = o.args[0] == "on";
    args(on ? 2 : 1);
    Connection c(o.socket, deadline);
    flatbuffers::FlatBufferBuilder b;
    AdminCommand command = on ? AdminCommand::TimelineStart : AdminCommand::TimelineStop;
    print_message(o, checked(c.ask(b, request(b, command, o, 0, on ? absolute(o.args[1]) : ""))));
    return kOk;
  }
  if (cmd == "checkpoint") {
    args(1);
    Connection c(o.socket, deadline);
    flatbuffers::FlatBufferBuilder b;
    // The daemon answers PX_ERR_TIMEOUT a little before our own deadline.
    int64_t daemon_ms = std::max<int64_t>(1, static_cast<int64_t>(timeout_s * 1000) - 500);
    print_message(o, checked(c.ask(b, request(b, AdminCommand::CheckpointAll, o, 0,
                                              absolute(o.args[0]), daemon_ms))));
    return kOk;
  }
  if (cmd == "drain") {
    args(0);
    Connection c(o.socket, deadline);
    flatbuffers::FlatBufferBuilder b;
    const control::AdminReply& reply = checked(c.ask(b, request(b, AdminCommand::Drain, o)));
    std::string message = reply.message() ? reply.message()->str() : "";
    if (!c.wait_closed() || !wait_gone(o.socket, deadline))
      die(kTimedOut, message + "; it had not exited after " +
                         pxctl::human_ms(static_cast<int64_t>(timeout_s * 1000)));
    if (o.json)
      printf("%s\n", pxctl::JsonObject()
                         .add("ok", true)
                         .add("message", message + "; it exited")
                         .str()
                         .c_str());
    else
      printf("%s; it exited\n", message.c_str());
    return kOk;
  }
  usage("unknown command '" + cmd + "'");
}
