// Helpers shared by the integration-test worker's scenarios.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "parallax_c.h"

namespace pxt {
inline int g_rank = -1;

[[noreturn]] inline void die(const std::string& what) {
  fprintf(stdout, "FAIL rank %d: %s\n", g_rank, what.c_str());
  fflush(stdout);
  exit(1);
}

inline void check(px_status s, const char* what) {
  if (s != PX_OK) die(std::string(what) + ": " + px_strerror(s) + ": " + px_last_error());
}

inline void expect_status(px_status got, px_status want, const char* what) {
  if (got != want)
    die(std::string(what) + ": expected " + px_strerror(want) + ", got " + px_strerror(got) + " (" +
        px_last_error() + ")");
}

inline void expect_contains(const std::string& text, const std::string& part) {
  if (text.find(part) == std::string::npos)
    die("message '" + text + "' does not contain '" + part + "'");
}

inline px_client* connect_default() {
  px_client* client = nullptr;
  px_connect_options o;
  px_connect_options_init(&o);
  o.timeout_ms = 20000;
  if (const char* a = getenv("PX_TEST_ARENA_BYTES")) o.arena_bytes = strtoull(a, nullptr, 10);
  check(px_connect(&o, &client), "px_connect");
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(client, &w), "px_world");
  g_rank = w.rank;
  return client;
}

inline int world_size(px_client* c) {
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  return w.world_size;
}

// Runs a sparse-variable scenario (sparse_scenarios.cc); returns the exit code.
int run_sparse_scenario(px_client* c, const std::string& scenario, int argc, char** argv);
// ABI 1.3 scenarios (abi_scenarios.cc): after connecting, and before (connect itself).
int run_abi_scenario(px_client* c, const std::string& scenario);
int run_connect_scenario();
// px_broadcast, px_allgather, px_allgatherv against a reference (collective_scenarios.cc).
int run_collectives_scenario(px_client* c);

}  // namespace pxt
