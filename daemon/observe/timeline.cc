#include "daemon/observe/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "daemon/common/log.h"
#include "daemon/observe/step_metrics.h"    // status_label
#include "transport/ipc/control_channel.h"  // monotonic_ns

namespace px {
namespace {

// Microseconds since origin with nanosecond digits, as Chrome's trace format takes them.
std::string micros(int64_t ns) {
  char text[32];
  snprintf(text, sizeof text, "%" PRId64 ".%03" PRId64, ns / 1000, (ns < 0 ? -ns : ns) % 1000);
  return text;
}

std::string complete_event(const char* name, int64_t begin_ns, int64_t end_ns, int64_t origin_ns,
                           int pid, int tid, const std::string& args) {
  std::string e = "{\"name\":\"";
  e += name;
  e += "\",\"ph\":\"X\",\"ts\":" + micros(begin_ns - origin_ns) +
       ",\"dur\":" + micros(end_ns > begin_ns ? end_ns - begin_ns : 0) +
       ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid);
  if (!args.empty()) e += ",\"args\":{" + args + "}";
  return e + "}";
}

std::string metadata_event(const char* what, int pid, int tid, const std::string& name) {
  return std::string("{\"name\":\"") + what + "\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
         ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":\"" + json_escape(name) + "\"}}";
}

}  // namespace

std::string json_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char hex[8];
          snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(c));
          out += hex;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string format_timeline_events(const TimelineRecord& r, int64_t origin_ns, int pid, int tid) {
  const StepTrace& t = r.trace;
  std::string args = "\"job\":\"" + json_escape(r.job) + "\",\"variable\":\"" +
                     json_escape(r.variable) + "\",\"step\":" + std::to_string(r.step) +
                     ",\"route\":\"" + r.route + "\",\"status\":\"" +
                     status_label(static_cast<size_t>(r.status)) + "\"";
  if (t.cache_rows >= 0) args += ",\"cache_rows\":" + std::to_string(t.cache_rows);
  std::string out = complete_event(r.operation, t.first_ns, r.end_ns, origin_ns, pid, tid, args);
  out += ",\n" + complete_event("wait_workers", t.first_ns, t.matched_ns, origin_ns, pid, tid, "");
  for (int i = 0; i < t.stages; ++i) {
    int64_t end = i + 1 < t.stages ? t.stage_ns[i + 1] : r.end_ns;
    out += ",\n" + complete_event(t.stage_name[i], t.stage_ns[i], end, origin_ns, pid, tid, "");
  }
  return out;
}

Timeline::Timeline(PostToLoop post) : post_(std::move(post)) {
  writer_ = std::thread([this] { writer_main(); });
}

Timeline::~Timeline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    loop_gone_ = true;
    if (state_ == State::kOn || state_ == State::kStarting)
      queue_.push_back(Command{Command::Kind::kClose, "", 0, {}, nullptr});
    quit_ = true;
  }
  wake_.notify_one();
  writer_.join();
}

void Timeline::detach_from_loop() {
  std::lock_guard<std::mutex> lock(mutex_);
  loop_gone_ = true;
}

void Timeline::post_done(const Done& done, px_status status, std::string message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (loop_gone_ || !done) return;
  post_([done, status, message = std::move(message)] { done(status, message); });
}

void Timeline::start(const std::string& path, Done done) {
  if (state_ != State::kOff)
    return done(PX_ERR_INVALID, "the timeline is already " +
                                    std::string(state_ == State::kStopping ? "stopping" : "on") +
                                    ", writing " + path_ + " (pxctl timeline off first)");
  state_ = State::kStarting;
  path_ = path;
  origin_ns_ = monotonic_ns();
  recorded_ = dropped_ = 0;
  Done opened = [this, done](px_status status, const std::string& message) {
    if (state_ == State::kStarting) state_ = status == PX_OK ? State::kOn : State::kOff;
    if (status != PX_OK) path_.clear();
    done(status, message);
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Command{Command::Kind::kOpen, path, origin_ns_, {}, std::move(opened)});
  }
  wake_.notify_one();
}

void Timeline::stop(Done done) {
  if (state_ != State::kOn && state_ != State::kStarting)
    return done(PX_ERR_INVALID, state_ == State::kStopping ? "the timeline is already stopping"
                                                           : "the timeline is off");
  state_ = State::kStopping;
  uint64_t dropped = dropped_;
  Done closed = [this, done, dropped](px_status status, const std::string& message) {
    state_ = State::kOff;
    std::string text = message;
    if (dropped)
      text += "; " + std::to_string(dropped) + " events dropped (the writer fell behind)";
    path_.clear();
    done(status, text);
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Command{Command::Kind::kClose, "", 0, {}, std::move(closed)});
  }
  wake_.notify_one();
}

void Timeline::record(TimelineRecord record) {
  if (!on() || record.trace.first_ns < origin_ns_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queued_records_ >= kMaxQueued) {
      ++dropped_;
      return;
    }
    ++queued_records_;
    queue_.push_back(Command{Command::Kind::kRecord, "", 0, std::move(record), nullptr});
  }
  ++recorded_;
  wake_.notify_one();
}

void Timeline::writer_main() {
  FILE* file = nullptr;
  std::string path;
  int64_t origin = 0;
  uint64_t written = 0;
  std::string write_error;
  std::map<std::string, int> tracks;                // "job/variable" -> pid
  std::map<std::pair<int, std::string>, int> rows;  // (pid, operation) -> tid
  // text holds `events` events ("},\n{" apart).
  auto emit = [&](const std::string& text, uint64_t events) {
    if (!file || !write_error.empty()) return;
    if (fputs(written ? ",\n" : "", file) < 0 || fputs(text.c_str(), file) < 0)
      write_error = strerror(errno);
    written += events;
  };
  for (;;) {
    std::deque<Command> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return quit_ || !queue_.empty(); });
      if (queue_.empty() && quit_) break;
      batch.swap(queue_);
      queued_records_ = 0;
    }
    for (Command& c : batch) {
      switch (c.kind) {
        case Command::Kind::kOpen: {
          path = c.path;
          int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
          file = fd >= 0 ? fdopen(fd, "w") : nullptr;
          if (!file) {
            std::string why = "cannot create the timeline " + path + ": " + strerror(errno);
            if (fd >= 0) ::close(fd);
            PX_LOG_WARN("%s", why.c_str());
            post_done(c.done, PX_ERR_INVALID, why);
            break;
          }
          origin = c.origin_ns;
          written = 0;
          write_error.clear();
          tracks.clear();
          rows.clear();
          fputs("[\n", file);
          PX_LOG_INFO("timeline on: writing %s", path.c_str());
          post_done(c.done, PX_OK, "timeline on: writing " + path);
          break;
        }
        case Command::Kind::kRecord: {
          if (!file) break;
          std::string track = c.record.job + "/" + c.record.variable;
          auto [t, new_track] = tracks.emplace(track, static_cast<int>(tracks.size()) + 1);
          int pid = t->second;
          if (new_track) emit(metadata_event("process_name", pid, 0, track), 1);
          auto [row, new_row] = rows.emplace(std::make_pair(pid, std::string(c.record.operation)),
                                             static_cast<int>(rows.size()) + 1);
          if (new_row) emit(metadata_event("thread_name", pid, row->second, c.record.operation), 1);
          emit(format_timeline_events(c.record, origin, pid, row->second),
               2 + static_cast<uint64_t>(c.record.trace.stages));
          break;
        }
        case Command::Kind::kClose: {
          if (!file) {
            post_done(c.done, PX_OK, "the timeline was not open");
            break;
          }
          if (fputs("\n]\n", file) < 0 && write_error.empty()) write_error = strerror(errno);
          if (fclose(file) != 0 && write_error.empty()) write_error = strerror(errno);
          file = nullptr;
          if (!write_error.empty()) {
            std::string why = "timeline " + path + ": writing failed: " + write_error;
            PX_LOG_WARN("%s", why.c_str());
            post_done(c.done, PX_ERR_INVALID, why);
          } else {
            std::string what = "timeline off: " + std::to_string(written) + " events in " + path;
            PX_LOG_INFO("%s", what.c_str());
            post_done(c.done, PX_OK, what);
          }
          break;
        }
      }
    }
  }
  if (file) {
    fputs("\n]\n", file);
    fclose(file);
  }
}

}  // namespace px
