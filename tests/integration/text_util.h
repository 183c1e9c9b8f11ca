// Text checks shared by the process tests (harness.h), the test worker (worker_util.h) and
// the unit tests: header-only, no dependencies.
#pragma once

#include <string>

namespace pxt {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The value of "key=value" in a worker's output (up to the next space or newline); "" if
// the output has no "key=".
inline std::string field(const std::string& output, const std::string& key) {
  size_t at = output.find(key + "=");
  if (at == std::string::npos) return "";
  size_t end = output.find_first_of(" \n", at);
  return output.substr(at + key.size() + 1, end - at - key.size() - 1);
}

}  // namespace pxt
