// Network namespaces on one bridge, for tests that cut a node's link (a partition) and heal
// it: each namespace has an eth0 on the bridge with its own address, 10.78.0.(i + 1). The
// bridge lives in a namespace of its own, so nothing touches the host's network; the
// namespaces are deleted with the object. Needs root (tests skip without it: unavailable()).
#pragma once

#include <string>
#include <vector>

namespace pxt {

class NetnsBridge {
 public:
  // Why namespaces cannot be made here ("" when they can).
  static std::string unavailable();

  NetnsBridge(const std::string& tag, int namespaces);
  ~NetnsBridge();
  NetnsBridge(const NetnsBridge&) = delete;
  NetnsBridge& operator=(const NetnsBridge&) = delete;

  // Namespace i's address.
  std::string address(int i) const;
  // A command prefix that runs a program in namespace i (it execs the program: same pid).
  std::vector<std::string> launcher(int i) const;
  // Takes namespace i's link down (a partition: nothing reaches it, nothing leaves it) or up.
  void set_link(int i, bool up);
  // Cuts namespaces i and j off from each other alone (a blackhole route to the other's
  // address in each), or mends the cut.
  void set_cut(int i, int j, bool cut);

 private:
  void remove();

  std::vector<std::string> names_;  // [0] is the bridge's
};

}  // namespace pxt
