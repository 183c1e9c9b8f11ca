#include "tests/integration/etcd_cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace pxt {

namespace {

bool healthy(const std::string& client, const std::vector<std::string>& launcher) {
  std::string command;
  for (const auto& word : launcher) command += word + " ";
  command += "env ETCDCTL_API=3 etcdctl --endpoints=http://" + client +
             " --dial-timeout=1s --command-timeout=2s endpoint health >/dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

// spawn_process does not search PATH.
std::string etcd_path() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    std::string path = std::string(dir) + "/etcd";
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  throw std::runtime_error(
      "no etcd in /usr/bin, /usr/local/bin or /usr/sbin (Debian's "
      "etcd-server; tools/quickstart installs it)");
}

}  // namespace

std::vector<std::string> membership_args(const std::string& cluster, const std::string& url,
                                         int nodes, const std::string& listen,
                                         int peer_silence_ms) {
  return {"--cluster",
          cluster,
          "--membership",
          url,
          "--node-count",
          std::to_string(nodes),
          "--listen",
          listen,
          "--membership-lease-s",
          "2",
          "--peer-silence-ms",
          std::to_string(peer_silence_ms)};
}

EtcdCluster::EtcdCluster(const std::string& tag, int members) : dir_("etcd-" + tag) {
  start(tag, ClusterProcesses::free_endpoints(2 * members));
}

EtcdCluster::EtcdCluster(const std::string& tag, int members, const std::string& host,
                         const std::vector<std::string>& launcher)
    : dir_("etcd-" + tag), launcher_(launcher) {
  std::vector<std::string> ports;
  for (int i = 0; i < 2 * members; ++i) ports.push_back(host + ":" + std::to_string(2379 + i));
  start(tag, ports);
}

void EtcdCluster::start(const std::string& tag, const std::vector<std::string>& ports) {
  const int members = static_cast<int>(ports.size() / 2);
  std::string initial;
  for (int i = 0; i < members; ++i) {
    clients_.push_back(ports[static_cast<size_t>(2 * i)]);
    initial += (i ? "," : "") + std::string("m") + std::to_string(i) + "=http://" +
               ports[static_cast<size_t>(2 * i + 1)];
  }
  for (int i = 0; i < members; ++i) {
    std::string name = "m" + std::to_string(i);
    std::string client = "http://" + clients_[static_cast<size_t>(i)];
    std::string peer = "http://" + ports[static_cast<size_t>(2 * i + 1)];
    argvs_.push_back(launcher_);
    argvs_.back().insert(argvs_.back().end(), {etcd_path(),
                                               "--name",
                                               name,
                                               "--data-dir",
                                               dir_.path() + "/" + name,
                                               "--listen-client-urls",
                                               client,
                                               "--advertise-client-urls",
                                               client,
                                               "--listen-peer-urls",
                                               peer,
                                               "--initial-advertise-peer-urls",
                                               peer,
                                               "--initial-cluster",
                                               initial,
                                               "--initial-cluster-state",
                                               "new",
                                               "--initial-cluster-token",
                                               tag,
                                               "--log-level",
                                               "warn"});
    pids_.push_back(spawn_process(argvs_.back(), {}, dir_.path() + "/" + name + ".log"));
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (const auto& client : clients_) {
    while (!healthy(client, launcher_)) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("etcd at " + client + " did not become healthy within 30 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

EtcdCluster::~EtcdCluster() {
  for (size_t i = 0; i < pids_.size(); ++i) kill(static_cast<int>(i));
}

std::string EtcdCluster::endpoints() const {
  std::string all;
  for (const auto& c : clients_) all += (all.empty() ? "" : ",") + c;
  return all;
}

void EtcdCluster::restart(int i) {
  kill(i);
  // On its data directory the member ignores the initial-cluster flags and rejoins.
  std::string log = dir_.path() + "/m" + std::to_string(i) + "-restarted.log";
  pids_[static_cast<size_t>(i)] = spawn_process(argvs_[static_cast<size_t>(i)], {}, log);
}

void EtcdCluster::kill(int i) {
  pid_t& pid = pids_[static_cast<size_t>(i)];
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  pid = -1;
}

}  // namespace pxt
