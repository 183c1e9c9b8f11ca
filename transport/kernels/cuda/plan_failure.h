// How the kernels' host-side plans (coalesce_plan, reduce_plan) refuse an input: the reason
// goes to *why (when given) and the check returns false.
#pragma once

#include <string>
#include <utility>

namespace px::gpu {

inline bool plan_failure(std::string* why, std::string message) {
  if (why) *why = std::move(message);
  return false;
}

}  // namespace px::gpu
