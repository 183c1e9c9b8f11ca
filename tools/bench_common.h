// Helpers shared by px-bench's scenarios.
#pragma once

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallax_c.h"

namespace pxbench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] inline void die(const std::string& what) {
  fprintf(stderr, "px-bench: %s\n", what.c_str());
  exit(1);
}

inline void check(px_status s, const char* what) {
  if (s != PX_OK) die(std::string(what) + ": " + px_strerror(s) + ": " + px_last_error());
}

inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// The folder of this executable (the build's tools/).
inline std::string tools_dir() {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return ".";
  self[n] = '\0';
  std::string path(self);
  return path.substr(0, path.rfind('/'));
}

inline std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    if (comma > at) out.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// px-bench sparse (bench_sparse.cc): argv after the scenario name.
int bench_sparse(int argc, char** argv);
int sparse_worker(int argc, char** argv);

}  // namespace pxbench
