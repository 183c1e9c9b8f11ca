#include "clients/python/c10d/engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <stdexcept>

namespace pxc10d {

using Clock = std::chrono::steady_clock;

// Shared by the engine and its thread: the thread is detached at the engine's end, so a
// process group dropped from a future's callback (on this very thread) or with Python's
// lock held (a Python callback on this thread may be waiting for it) never waits for it.
struct Engine::State {
  const PxLibrary& px;
  px_client* client;
  int client_fd = -1;
  int wake_fd = -1;
  std::mutex mutex;
  std::vector<Operation> incoming;  // added, not yet seen by the thread
  bool stopping = false;

  State(const PxLibrary& library, px_client* c) : px(library), client(c) {}
  ~State() {
    if (wake_fd >= 0) close(wake_fd);
  }

  void wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof one);
    (void)n;  // a full counter already wakes the thread
  }

  void release(Operation& op, bool daemon_done) {
    if (op.request) px.request_free(op.request);
    // An unfinished request may still write its arena blocks: they stay allocated (the
    // arena goes with the client).
    if (daemon_done)
      for (void* block : op.arena) px.free(client, block);
  }

  // The daemon finished op with status (PX_OK or its failure).
  void complete(Operation& op, px_status status) {
    if (!op.expired) {
      if (status == PX_OK) {
        try {
          if (op.deliver) op.deliver();
          op.work->succeed();
        } catch (const std::exception& e) {
          op.work->fail("parallax backend: " + op.work->what() + ": " + e.what());
        }
      } else {
        const char* message = op.request ? px.request_error(op.request) : "";
        op.work->fail("parallax backend: " + op.work->what() + " failed with " +
                      px.status_name(status) + ": " +
                      (message && *message ? message : "(no message)"));
      }
    }
    release(op, true);
  }

  void run() {
    std::list<Operation> pending;
    for (;;) {
      auto now = Clock::now();
      int timeout_ms = 1000;  // the longest sleep: deadlines are checked at least this often
      for (auto& op : pending)
        if (!op.expired)
          timeout_ms = std::min<int64_t>(
              timeout_ms,
              std::max<int64_t>(
                  0,
                  std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline - now).count() +
                      1));
      pollfd fds[2] = {{client_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      int ready = poll(fds, 2, timeout_ms);
      if (ready < 0 && errno != EINTR) break;
      if (fds[1].revents & POLLIN) {
        uint64_t count;
        ssize_t n = read(wake_fd, &count, sizeof count);
        (void)n;
      }
      // Failures of the connection itself reach every request: px_test reports them.
      px.progress(client);
      // Taken after px_progress, and tested below before the next sleep: a completion that
      // px_progress drained for an operation added meanwhile would ring nothing more.
      {
        std::lock_guard<std::mutex> lock(mutex);
        for (auto& op : incoming) pending.push_back(std::move(op));
        incoming.clear();
        if (stopping) break;
      }
      now = Clock::now();
      for (auto it = pending.begin(); it != pending.end();) {
        Operation& op = *it;
        int32_t done = op.request ? 0 : 1;
        px_status status = op.request ? px.test(op.request, &done) : PX_OK;
        if (done || status != PX_OK) {
          complete(op, status);
          it = pending.erase(it);
          continue;
        }
        if (!op.expired && now >= op.deadline) {
          op.expired = true;
          op.work->fail("parallax backend: " + op.work->what() + " did not complete within " +
                        std::to_string(op.timeout.count()) +
                        " ms (the process group's timeout): did every rank call it, with "
                        "the same dtype and size?");
        }
        ++it;
      }
    }
    for (auto& op : pending) {
      if (!op.expired)
        op.work->fail("parallax backend: " + op.work->what() +
                      ": the process group was destroyed before it completed");
      int32_t done = 0;
      px_status status = op.request ? px.test(op.request, &done) : PX_OK;
      release(op, done || status != PX_OK);
    }
  }
};

Engine::Engine(const PxLibrary& px, px_client* client)
    : state_(std::make_shared<State>(px, client)), client_(client) {
  if (px.client_fd(client, &state_->client_fd) != PX_OK)
    throw std::runtime_error(std::string("parallax backend: px_client_fd: ") + px.last_error());
  state_->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (state_->wake_fd < 0)
    throw std::runtime_error(std::string("parallax backend: eventfd: ") + strerror(errno));
  std::thread([state = state_] { state->run(); }).detach();
}

Engine::~Engine() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->stopping = true;
  state_->wake();
}

void Engine::add(Operation op) {
  op.deadline = Clock::now() + op.timeout;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->stopping) throw std::runtime_error("parallax backend: the process group is gone");
  state_->incoming.push_back(std::move(op));
  state_->wake();
}

}  // namespace pxc10d
