#include "tests/integration/netns_bridge.h"

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace pxt {

namespace {

// spawn_process does not search PATH.
std::string ip_path() {
  for (const char* path : {"/usr/sbin/ip", "/usr/bin/ip", "/sbin/ip", "/bin/ip"})
    if (access(path, X_OK) == 0) return path;
  return "";
}

void run(const std::string& command) {
  if (std::system((command + " >/dev/null 2>&1").c_str()) != 0)
    throw std::runtime_error("network namespaces: '" + command + "' failed");
}

}  // namespace

std::string NetnsBridge::unavailable() {
  if (geteuid() != 0) return "needs root";
  if (ip_path().empty()) return "no ip (iproute2)";
  if (std::system((ip_path() + " netns list >/dev/null 2>&1").c_str()) != 0)
    return "no network namespaces";
  return "";
}

NetnsBridge::NetnsBridge(const std::string& tag, int namespaces) try {
  const std::string ip = ip_path();
  names_.push_back(tag + "-br");
  run(ip + " netns add " + names_[0]);
  run(ip + " -n " + names_[0] + " link add br0 type bridge");
  run(ip + " -n " + names_[0] + " link set br0 up");
  for (int i = 0; i < namespaces; ++i) {
    const std::string ns = tag + "-" + std::to_string(i);
    run(ip + " netns add " + ns);
    names_.push_back(ns);
    const std::string port = "p" + std::to_string(i);
    run(ip + " -n " + names_[0] + " link add " + port + " type veth peer name eth0 netns " + ns);
    run(ip + " -n " + names_[0] + " link set " + port + " master br0");
    run(ip + " -n " + names_[0] + " link set " + port + " up");
    run(ip + " -n " + ns + " link set lo up");
    run(ip + " -n " + ns + " addr add " + address(i) + "/24 dev eth0");
    run(ip + " -n " + ns + " link set eth0 up");
  }
} catch (...) {
  remove();
  throw;
}

NetnsBridge::~NetnsBridge() {
  remove();
}

void NetnsBridge::remove() {
  for (const auto& ns : names_)
    (void)std::system((ip_path() + " netns del " + ns + " >/dev/null 2>&1").c_str());
}

std::string NetnsBridge::address(int i) const {
  return "10.78.0." + std::to_string(i + 1);
}

std::vector<std::string> NetnsBridge::launcher(int i) const {
  return {ip_path(), "netns", "exec", names_[static_cast<size_t>(i + 1)]};
}

void NetnsBridge::set_link(int i, bool up) {
  run(ip_path() + " -n " + names_[static_cast<size_t>(i + 1)] + " link set eth0 " +
      (up ? "up" : "down"));
}

void NetnsBridge::set_cut(int i, int j, bool cut) {
  for (auto [from, to] : {std::pair<int, int>{i, j}, {j, i}})
    run(ip_path() + " -n " + names_[static_cast<size_t>(from + 1)] + " route " +
        (cut ? "add" : "del") + " blackhole " + address(to) + "/32");
}

}  // namespace pxt
