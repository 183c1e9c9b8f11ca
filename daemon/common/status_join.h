// One completion out of several: the callback returned by join_statuses() is given to each
// of n operations; once all n have called it, done runs once with the first failure seen
// (or PX_OK). Every call must come from one thread (the event loop), as the daemon's
// completions do.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "parallax_c.h"

namespace px {

using StatusCallback = std::function<void(px_status, const std::string&)>;

inline StatusCallback join_statuses(size_t n, StatusCallback done) {
  struct Join {
    size_t left;
    px_status status = PX_OK;
    std::string error;
    StatusCallback done;
  };
  auto join = std::make_shared<Join>(Join{n, PX_OK, "", std::move(done)});
  return [join](px_status status, const std::string& error) {
    if (status != PX_OK && join->status == PX_OK) {
      join->status = status;
      join->error = error;
    }
    if (--join->left == 0 && join->done) join->done(join->status, join->error);
  };
}

}  // namespace px
