#include "daemon/common/loop_thread.h"

#include <cstdlib>

#include "daemon/common/log.h"

namespace px::detail {

void loop_thread_violation(const char* function, const char* file, int line) {
  // A loop-only function on another thread races with the loop: stop before state is torn.
  PX_LOG_ERROR("%s (%s:%d) is loop thread only but ran on another thread", function, file, line);
  std::abort();
}

}  // namespace px::detail
