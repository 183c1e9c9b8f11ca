// Talking to systemd (Type=notify) through sd_notify: READY=1 once the socket listens,
// WATCHDOG=1 from a loop timer (a hung loop stops sending and systemd kills the daemon),
// STOPPING=1 when a drain begins, and STATUS= lines for `systemctl status`. Outside systemd
// (no NOTIFY_SOCKET) every call does nothing. Loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <string>

namespace px {

class SystemdNotifier {
 public:
  // describe: the STATUS= text now (jobs, workers, cluster); sent when it changes.
  explicit SystemdNotifier(std::function<std::string()> describe)
      : describe_(std::move(describe)) {}

  // Sends READY=1 and the first STATUS=, then starts the timer: WATCHDOG=1 every half of
  // WATCHDOG_USEC (when systemd asks for one), STATUS= refreshed once a second.
  void start(uv_loop_t* loop);
  // Sends STOPPING=1 (systemd then waits for the exit, up to TimeoutStopSec).
  void stopping();
  // Sends STATUS=text at once (drain progress).
  void status(const std::string& text);
  // Closes the timer (the loop can end).
  void stop();

  bool enabled() const { return enabled_; }
  uint64_t watchdog_interval_ms() const { return watchdog_ms_; }

 private:
  static void on_tick(uv_timer_t* timer);
  void send(const std::string& state);

  std::function<std::string()> describe_;
  bool enabled_ = false;
  bool timer_started_ = false;
  uint64_t watchdog_ms_ = 0;  // 0: systemd asked for no watchdog
  uint64_t next_status_ms_ = 0;
  std::string last_status_;
  bool warned_ = false;
  uv_timer_t timer_{};
};

}  // namespace px
