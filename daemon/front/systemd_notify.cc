#include "daemon/front/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "daemon/common/log.h"

namespace px {

void SystemdNotifier::start(uv_loop_t* loop) {
  const char* socket = getenv("NOTIFY_SOCKET");
  enabled_ = socket && *socket;
  if (!enabled_) return;
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
    watchdog_ms_ =
        std::max<uint64_t>(1, usec / 2000);  // half the interval, as sd_watchdog_enabled(3) asks
  last_status_ = describe_();
  std::string ready = "READY=1\nSTATUS=";
  send(ready.append(last_status_));
  PX_LOG_INFO(
      "told systemd the daemon is ready%s",
      watchdog_ms_ ? (" (watchdog every " + std::to_string(watchdog_ms_) + " ms)").c_str() : "");
  uint64_t every = watchdog_ms_ ? std::min<uint64_t>(watchdog_ms_, 1000) : 1000;
  uv_timer_init(loop, &timer_);
  timer_.data = this;
  timer_started_ = true;
  uv_timer_start(&timer_, on_tick, watchdog_ms_ ? 0 : every, every);
}

void SystemdNotifier::on_tick(uv_timer_t* timer) {
  auto* self = static_cast<SystemdNotifier*>(timer->data);
  // The timer runs on the loop: when the loop hangs, the pings stop and systemd acts.
  std::string state = self->watchdog_ms_ ? "WATCHDOG=1" : "";
  uint64_t now = uv_now(timer->loop);
  if (now >= self->next_status_ms_) {
    self->next_status_ms_ = now + 1000;
    std::string text = self->describe_();
    if (text != self->last_status_) {
      self->last_status_ = text;
      if (!state.empty()) state += '\n';
      state.append("STATUS=").append(text);
    }
  }
  if (!state.empty()) self->send(state);
}

void SystemdNotifier::stopping() {
  if (enabled_) send("STOPPING=1");
}

void SystemdNotifier::status(const std::string& text) {
  if (!enabled_) return;
  last_status_ = text;
  std::string state = "STATUS=";
  send(state.append(text));
}

void SystemdNotifier::stop() {
  if (!timer_started_) return;
  timer_started_ = false;
  uv_timer_stop(&timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

void SystemdNotifier::send(const std::string& state) {
  int r = sd_notify(0, state.c_str());
  if (r < 0 && !warned_) {  // once: the watchdog would repeat it every tick
    warned_ = true;
    PX_LOG_WARN("sd_notify(%s): %s", state.c_str(), strerror(-r));
  }
}

}  // namespace px
