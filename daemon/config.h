// parallaxd's settings (command line today; the cluster issue adds a TOML file).
#pragma once

#include <cstdint>
#include <string>

#include "log.h"

namespace px {

struct DaemonConfig {
  std::string socket_path = "/run/parallax/parallaxd.sock";
  std::string group;  // members of this group may connect, besides the daemon's own user
  bool foreground = false;
  unsigned threads = 0;  // 0: min(4, cores)
  uint64_t default_arena_bytes = 256ull << 20;
  uint64_t max_arena_bytes = 16ull << 30;
  uint32_t ring_capacity = 1024;
  LogLevel log_level = LogLevel::kInfo;
};

}  // namespace px
