#include "daemon/observe/metrics_exposer.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <prometheus/metric_family.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <utility>

namespace px {

// What the Exposer calls on its threads. Shared with the tasks it posts to the loop, so a
// task that runs late finds it alive.
class MetricsExposer::Collector : public prometheus::Collectable,
                                  public std::enable_shared_from_this<Collector> {
 public:
  Collector(PostToLoop post, Build build) : post_(std::move(post)), build_(std::move(build)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    auto self = std::const_pointer_cast<Collector>(shared_from_this());
    std::unique_lock<std::mutex> lock(self->mutex_);
    if (self->stopped_) return self->with_stale(true);
    uint64_t ticket = ++self->asked_;
    self->post_([self, ticket] {
      std::vector<prometheus::MetricFamily> families;
      {
        std::lock_guard<std::mutex> guard(self->mutex_);
        if (self->stopped_) return;
      }
      families = self->build_();  // on the loop, outside the lock: scrapes never hold it up
      std::lock_guard<std::mutex> guard(self->mutex_);
      self->last_ = std::move(families);
      self->answered_ = std::max(self->answered_, ticket);
      self->ready_.notify_all();
    });
    bool fresh = self->ready_.wait_for(lock, std::chrono::milliseconds(kScrapeWaitMs),
                                       [&] { return self->stopped_ || self->answered_ >= ticket; });
    return self->with_stale(!fresh || self->answered_ < ticket);
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    ready_.notify_all();
  }

 private:
  // Called with mutex_ held.
  std::vector<prometheus::MetricFamily> with_stale(bool stale) const {
    std::vector<prometheus::MetricFamily> out = last_;
    prometheus::MetricFamily f;
    f.name = "parallax_metrics_stale";
    f.help = "1: the daemon's loop did not answer this scrape in time; older values served";
    f.type = prometheus::MetricType::Gauge;
    prometheus::ClientMetric m;
    m.gauge.value = stale ? 1 : 0;
    f.metric.push_back(m);
    out.push_back(std::move(f));
    return out;
  }

  PostToLoop post_;
  Build build_;
  mutable std::mutex mutex_;
  mutable std::condition_variable ready_;
  mutable std::vector<prometheus::MetricFamily> last_;
  mutable uint64_t asked_ = 0;
  mutable uint64_t answered_ = 0;
  bool stopped_ = false;
};

std::unique_ptr<MetricsExposer> MetricsExposer::start(const std::string& address, PostToLoop post,
                                                      Build build, std::string* error) {
  std::unique_ptr<MetricsExposer> e(new MetricsExposer());
  e->collector_ = std::make_shared<Collector>(std::move(post), std::move(build));
  try {
    // One serving thread: scrapes are rare and each waits on the loop anyway.
    e->exposer_ = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& ex) {
    *error =
        "metrics.listen " + address + ": cannot listen (" + ex.what() + "; is the port taken?)";
    return nullptr;
  }
  e->exposer_->RegisterCollectable(e->collector_);
  std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->host_ = address.substr(0, address.rfind(':'));
  e->port_ = ports.empty() ? 0 : ports[0];
  e->url_ = "http://" + e->host_ + ":" + std::to_string(e->port_) + "/metrics";
  return e;
}

namespace {

// One TCP connection to host:port, closed at once.
void knock(const std::string& host, int port) {
  std::string name =
      host.size() > 2 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(name.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    (void)connect(fd, found->ai_addr, found->ai_addrlen);
    ::close(fd);
  }
  freeaddrinfo(found);
}

}  // namespace

void MetricsExposer::stop() {
  if (!exposer_) return;
  collector_->stop();  // no scrape waits on the loop any more
  closer_ = std::thread([exposer = std::move(exposer_), host = host_, port = port_]() mutable {
    // civetweb's listener polls in 2 s quanta before it sees it must stop: connections
    // wake it sooner.
    std::atomic<bool> closed{false};
    std::thread waker([&] {
      while (!closed) {
        knock(host, port);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    exposer.reset();
    closed = true;
    waker.join();
  });
}

MetricsExposer::~MetricsExposer() {
  stop();
  if (closer_.joinable()) closer_.join();
}

}  // namespace px
