// The Prometheus endpoint: prometheus-cpp's Exposer (civetweb) serves GET /metrics on its own
// threads. A scrape asks the loop for the families (posts build() to it) and waits up to
// kScrapeWaitMs for them; the loop itself never waits on the endpoint. A loop too busy to
// answer in time gets the previous scrape's families served again, with
// parallax_metrics_stale 1.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/common/offload.h"  // PostToLoop

namespace px {

class MetricsExposer {
 public:
  static constexpr int kScrapeWaitMs = 2000;
  using Build = std::function<std::vector<prometheus::MetricFamily>()>;

  // Listens on address ("127.0.0.1:9464"; port 0: one the kernel picks); null with error set
  // if it cannot. build runs on the loop thread (through post).
  static std::unique_ptr<MetricsExposer> start(const std::string& address, PostToLoop post,
                                               Build build, std::string* error);
  ~MetricsExposer();  // stop() if not yet

  // "http://127.0.0.1:9464/metrics", with the port actually bound.
  const std::string& url() const { return url_; }
  // Loop thread, before the loop stops taking posts: scrapes waiting for the loop get the
  // previous families at once and none posts to the loop any more; the server closes on a
  // thread of its own (civetweb takes up to 2 s to stop), joined by the destructor.
  void stop();

 private:
  class Collector;
  MetricsExposer() = default;

  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string url_;
  std::string host_;
  int port_ = 0;
  std::thread closer_;
};

}  // namespace px
