#include "clients/python/c10d/work.h"

#include <stdexcept>

namespace pxc10d {

ParallaxWork::ParallaxWork(c10d::OpType type, std::vector<at::Tensor> outputs, std::string what)
    : c10d::Work(-1, type),
      outputs_(std::move(outputs)),
      what_(std::move(what)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

void ParallaxWork::succeed() {
  // The future first: a waiter on the Work then finds it complete too.
  future_->markCompleted(c10::IValue(outputs_));
  finish();
}

void ParallaxWork::fail(const std::string& message) {
  auto error = std::make_exception_ptr(std::runtime_error(message));
  future_->setError(error);
  finish(error);
}

bool ParallaxWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    throw std::runtime_error("parallax backend: " + what_ + " did not complete within " +
                             std::to_string(timeout.count()) + " ms (the timeout of wait())");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

}  // namespace pxc10d
