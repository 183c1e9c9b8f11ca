// The per-step timeline: every operation of the node as Chrome trace events (chrome://tracing
// or https://ui.perfetto.dev), one track per variable as Horovod's timeline has one per
// tensor: an event for the whole operation with its stages nested inside (wait_workers, then
// the executor's: local_reduce, cross_node, fan_out, or the sparse run's states). Switched on
// and off at run time (pxctl timeline on FILE / off). The loop only queues records; a writer
// thread of its own formats and writes them, so the loop never waits on the disk. Records
// past kMaxQueued waiting for the writer are dropped and counted.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/common/offload.h"  // PostToLoop
#include "daemon/observe/step_trace.h"
#include "parallax_c.h"

namespace px {

// One finished operation, as the writer needs it.
struct TimelineRecord {
  std::string job;
  std::string variable;
  const char* operation = "";
  const char* route = "";
  uint64_t step = 0;
  px_status status = PX_OK;
  StepTrace trace;
  int64_t end_ns = 0;
};

// Chrome trace JSON for one record (several events, each ",\n"-prefixed but the first of
// the file's), ts/dur in microseconds since origin_ns. pid: the variable's track, tid: the
// operation's row. Exposed for the unit test.
std::string format_timeline_events(const TimelineRecord& record, int64_t origin_ns, int pid,
                                   int tid);
// JSON string escaping (quotes, backslashes, control characters).
std::string json_escape(const std::string& text);

class Timeline {
 public:
  using Done = std::function<void(px_status status, const std::string& message)>;
  static constexpr size_t kMaxQueued = 1 << 16;

  explicit Timeline(PostToLoop post);
  ~Timeline();  // completes an open file and joins the writer
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Loop thread. start: the file is created (truncated) by the writer; done runs on the loop
  // once it is open (or could not be). stop: done once every queued event is written and the
  // file is a complete JSON array.
  void start(const std::string& path, Done done);
  void stop(Done done);
  // Taking records (from start until stop).
  bool on() const { return state_ == State::kOn || state_ == State::kStarting; }
  const std::string& path() const { return path_; }
  uint64_t recorded() const { return recorded_; }
  uint64_t dropped() const { return dropped_; }
  // Loop thread; never blocks on the disk. Operations that began before start are skipped.
  void record(TimelineRecord record);
  // Loop thread, at shutdown (before the loop stops taking posts): an open file is
  // completed by the writer without telling the loop; nothing is posted from then on.
  void detach_from_loop();

 private:
  enum class State { kOff, kStarting, kOn, kStopping };
  struct Command {
    enum class Kind { kOpen, kRecord, kClose } kind;
    std::string path;       // kOpen
    int64_t origin_ns = 0;  // kOpen: time 0 of the file's events
    TimelineRecord record;
    Done done;  // kOpen, kClose
  };
  void writer_main();
  void post_done(const Done& done, px_status status, std::string message);

  PostToLoop post_;
  // Loop side.
  State state_ = State::kOff;
  std::string path_;
  int64_t origin_ns_ = 0;
  uint64_t recorded_ = 0;
  uint64_t dropped_ = 0;
  // Shared with the writer.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Command> queue_;
  size_t queued_records_ = 0;
  bool quit_ = false;
  bool loop_gone_ = false;  // detach_from_loop: post_ may no longer be called
  std::thread writer_;
};

}  // namespace px
