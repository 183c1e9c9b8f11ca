#include "daemon/common/loop_timer.h"

#include "daemon/common/loop_thread.h"
namespace px {

struct LoopTimer::Handle {
  uv_timer_t timer{};
  std::function<void()> fire;
  LoopTimer* owner = nullptr;
};

namespace {

void close_handle(uv_timer_t* timer) {
  uv_close(reinterpret_cast<uv_handle_t*>(timer),
           [](uv_handle_t* h) { delete static_cast<LoopTimer::Handle*>(h->data); });
}

}  // namespace

std::shared_ptr<LoopTimer> LoopTimer::start(uv_loop_t* loop, uint64_t ms,
                                            std::function<void()> fire) {
  PX_ASSERT_LOOP_THREAD();
  auto timer = std::shared_ptr<LoopTimer>(new LoopTimer);
  auto* h = new Handle;
  h->fire = std::move(fire);
  h->timer.data = h;
  timer->handle_ = h;
  h->owner = timer.get();
  uv_timer_init(loop, &h->timer);
  uv_timer_start(
      &h->timer,
      [](uv_timer_t* t) {
        auto* h = static_cast<Handle*>(t->data);
        std::function<void()> fire = std::move(h->fire);
        if (h->owner) h->owner->handle_ = nullptr;
        close_handle(t);
        fire();
      },
      ms, 0);
  return timer;
}

LoopTimer::~LoopTimer() {
  if (handle_) handle_->owner = nullptr;
}

void LoopTimer::cancel() {
  PX_ASSERT_LOOP_THREAD();
  if (!handle_) return;
  uv_timer_stop(&handle_->timer);
  close_handle(&handle_->timer);
  handle_ = nullptr;
}

}  // namespace px
