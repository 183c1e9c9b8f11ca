// A collective's torch Work: completed by the engine's thread (engine.h) from the daemon's
// completion, never by a thread of its own. Its future carries the output tensors as a
// List[Tensor], as torch's Gloo backend does: DDP's reducer and comm hooks read it that way.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace pxc10d {

class ParallaxWork : public c10d::Work {
 public:
  // what: the collective as errors name it ("all_reduce of 1024 float32 (variable ...)").
  ParallaxWork(c10d::OpType type, std::vector<at::Tensor> outputs, std::string what);

  void succeed();                         // the outputs hold the result
  void fail(const std::string& message);  // torch raises it as a RuntimeError
  const std::string& what() const { return what_; }

  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  std::string what_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace pxc10d
