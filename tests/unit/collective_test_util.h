// Helpers for the collective tests: completion tracking and libfabric endpoint groups.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/fabric/fabric_endpoint.h"
#include "transport/kernels/dtype.h"

namespace pxt {

using namespace px;

// Collects the done() of every rank; waits with a deadline.
struct Completion {
  std::mutex mutex;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::string> errors;
  std::function<void(bool, const std::string&)> callback() {
    return [this](bool ok, const std::string& error) {
      std::lock_guard<std::mutex> lock(mutex);
      ++finished;
      if (!ok) errors.push_back(error);
      cv.notify_all();
    };
  }
  int count() {
    std::lock_guard<std::mutex> lock(mutex);
    return finished;
  }
  bool wait_for(int n, int seconds = 30) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return finished >= n; });
  }
};

// Small integers per rank: every summation order gives the exact same float result, so a
// collective's output can be compared with reference() bit for bit.
template <typename T>
std::vector<std::vector<T>> small_integer_inputs(int n, size_t count, int salt) {
  std::vector<std::vector<T>> v(static_cast<size_t>(n), std::vector<T>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      v[static_cast<size_t>(r)][i] = static_cast<T>(
          static_cast<int>((i * 7 + static_cast<size_t>(r) * 13 + static_cast<size_t>(salt)) %
                           101) -
          50);
  return v;
}

// The reduction of every rank's input, in rank order.
template <typename T>
std::vector<T> reference_reduction(const std::vector<std::vector<T>>& in, ReduceOp op) {
  std::vector<T> out = in[0];
  for (size_t r = 1; r < in.size(); ++r)
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = op == ReduceOp::kMin    ? std::min(out[i], in[r][i])
               : op == ReduceOp::kMax  ? std::max(out[i], in[r][i])
               : op == ReduceOp::kProd ? out[i] * in[r][i]
                                       : out[i] + in[r][i];
  return out;
}

// N endpoints of one group over tcp;ofi_rxm on loopback, progress threads running.
inline std::vector<std::unique_ptr<FabricEndpoint>> open_endpoints(int n) {
  std::vector<std::unique_ptr<FabricEndpoint>> eps;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    FabricOptions options;
    options.provider = "tcp;ofi_rxm";
    options.address = "127.0.0.1";
    std::string error;
    auto ep = FabricEndpoint::open(options, &error);
    REQUIRE_MESSAGE(ep, error);
    addresses.push_back(ep->address());
    eps.push_back(std::move(ep));
  }
  for (int r = 0; r < n; ++r) {
    std::string error;
    REQUIRE_MESSAGE(eps[static_cast<size_t>(r)]->set_peers(addresses, r, &error), error);
    eps[static_cast<size_t>(r)]->start();
  }
  return eps;
}

}  // namespace pxt
