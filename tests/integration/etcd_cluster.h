// A real etcd cluster for the membership tests: `members` etcd processes (Debian's
// etcd-server) with their own client and peer ports and data under a scratch directory, on
// loopback or in a network namespace, started healthy, killed with the test.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace pxt {

// The flags of a daemon whose membership is at url (etcd://.../PREFIX): one of `nodes`
// nodes of cluster `cluster`, on control address listen, with a lease of 2 s (a quick
// take-over) and the given peer silence.
std::vector<std::string> membership_args(const std::string& cluster, const std::string& url,
                                         int nodes, const std::string& listen, int peer_silence_ms);

class EtcdCluster {
 public:
  EtcdCluster(const std::string& tag, int members);
  // The members on host (an address of a network namespace of their own, where any port is
  // free), each started through launcher (see DaemonProcess).
  EtcdCluster(const std::string& tag, int members, const std::string& host,
              const std::vector<std::string>& launcher);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // "127.0.0.1:C0,127.0.0.1:C1,...": every member's client endpoint.
  std::string endpoints() const;
  // SIGKILLs member i and reaps it.
  void kill(int i);
  // Starts member i again on its data (after kill): it rejoins its cluster.
  void restart(int i);

 private:
  void start(const std::string& tag, const std::vector<std::string>& ports);

  ScratchDir dir_;
  std::vector<std::string> launcher_;
  std::vector<pid_t> pids_;
  std::vector<std::vector<std::string>> argvs_;
  std::vector<std::string> clients_;
};

}  // namespace pxt
