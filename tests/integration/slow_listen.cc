// listen(2) with a 300 ms pause before it, LD_PRELOADed into parallaxd by the test of when its
// socket file appears (test_local_node.cc): a daemon that made the file visible before it
// listens would then refuse connections for 300 ms, every time, not only under load.
#include <dlfcn.h>
#include <sys/socket.h>

#include <ctime>

extern "C" int listen(int fd, int backlog) {
  using ListenFn = int (*)(int, int);
  static ListenFn real = reinterpret_cast<ListenFn>(dlsym(RTLD_NEXT, "listen"));
  timespec pause{0, 300 * 1000 * 1000};
  nanosleep(&pause, nullptr);
  return real(fd, backlog);
}
