// Heavy work off the loop thread and back: the one way dense/ and sparse/ hand work to the
// pool and go on on the loop. Light work runs inline on the loop, where a pool hop (a thread
// wake-up each way) would cost more than the work; heavy work runs on the pool and its
// `then` is posted to the loop. The work is a template argument so the inline path (the
// small, latency-bound steps) builds no std::function for it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

#include "daemon/common/thread_pool.h"

namespace px {

// Runs a function on the loop thread; callable from any thread (Server::post).
using PostToLoop = std::function<void(std::function<void()>)>;

class Offload {
 public:
  Offload(ThreadPool& pool, PostToLoop post) : pool_(pool), post_(std::move(post)) {}

  ThreadPool& pool() const { return pool_; }
  const PostToLoop& post() const { return post_; }

  // work() inline then then(), or work() on the pool then then() posted to the loop.
  template <class Work>
  void run(bool heavy, Work work, std::function<void()> then) const {
    if (!heavy) {
      work();
      then();
      return;
    }
    pool_.submit([this, work = std::move(work), then = std::move(then)]() mutable {
      work();
      post_(std::move(then));
    });
  }

  // work(begin, end) over [0, count): inline in one piece when light; else on the pool in
  // up to `slices` pieces (no more than the pool's threads), each a multiple of `align`
  // elements (whole cache lines for the caller's element size), then then() on the loop
  // once every piece is done.
  template <class Work>
  void run_sliced(bool heavy, size_t count, size_t slices, size_t align, Work work,
                  std::function<void()> then) const {
    if (!heavy) {
      work(size_t{0}, count);
      then();
      return;
    }
    auto n = static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(pool_.size(), slices)));
    size_t per_slice = (count / n + align - 1) / align * align;
    auto state = std::make_shared<Sliced<Work>>(n, std::move(work), std::move(then));
    for (unsigned s = 0; s < n; ++s) {
      size_t begin = std::min(count, s * per_slice);
      size_t end = s + 1 == n ? count : std::min(count, begin + per_slice);
      pool_.submit([this, state, begin, end] {
        state->work(begin, end);
        if (state->left.fetch_sub(1) == 1) post_(std::move(state->then));
      });
    }
  }

 private:
  template <class Work>
  struct Sliced {
    Sliced(unsigned n, Work w, std::function<void()> t)
        : left(n), work(std::move(w)), then(std::move(t)) {}
    std::atomic<unsigned> left;
    Work work;
    std::function<void()> then;  // taken by the last piece to finish
  };

  ThreadPool& pool_;
  PostToLoop post_;
};

}  // namespace px
