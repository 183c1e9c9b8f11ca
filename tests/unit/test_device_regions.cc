// The daemon's bookkeeping of a worker's device memory (daemon/gpu/device_regions.h): the
// checks on a registration and on a buffer inside a region, without a GPU (a mapping of
// host memory stands in for the IPC mapping: these checks never touch the memory).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/common/completer.h"
#include "daemon/common/thread_pool.h"
#include "daemon/gpu/device_regions.h"
#include "tests/unit/host_device_mapping.h"

using px::gpu::DeviceMapping;
using px::gpu::DeviceRegions;
using px::gpu::kIpcHandleBytes;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("gpu: device regions: a registration is checked before its mapping is opened") {
  DeviceRegions regions;
  std::string why;
  const std::string bus = "0000:19:00.0";
  CHECK(regions.check(1, bus, kIpcHandleBytes, 4096, &why) == PX_OK);
  CHECK(regions.check(0, bus, kIpcHandleBytes, 4096, &why) == PX_ERR_INVALID);
  CHECK(contains(why, "region 0"));
  CHECK(regions.check(1, "", kIpcHandleBytes, 4096, &why) == PX_ERR_INVALID);
  CHECK(contains(why, "PCI bus id of 0 bytes"));
  CHECK(regions.check(1, bus, 63, 4096, &why) == PX_ERR_INVALID);
  CHECK(contains(why, "IPC handle of 63 bytes, not 64"));
  CHECK(regions.check(1, bus, kIpcHandleBytes, 0, &why) == PX_ERR_INVALID);
  CHECK(contains(why, "0 bytes"));

  // While region 1 opens, and once it is held, a second registration of it is refused.
  regions.begin(1);
  CHECK(regions.check(1, bus, kIpcHandleBytes, 4096, &why) == PX_ERR_INVALID);
  CHECK(contains(why, "region 1 is already registered"));
  int closed = 0;
  regions.finish(1, std::make_shared<pxtest::HostDeviceMapping>(4096, &closed));
  CHECK(regions.size() == 1);
  CHECK(regions.bytes() == 4096);
  CHECK(regions.check(1, bus, kIpcHandleBytes, 4096, &why) == PX_ERR_INVALID);

  // A mapping that failed to open leaves nothing behind: the region may be registered again.
  regions.begin(2);
  regions.finish(2, nullptr);
  CHECK(regions.size() == 1);
  CHECK(regions.check(2, bus, kIpcHandleBytes, 4096, &why) == PX_OK);
}

TEST_CASE("gpu: device regions: buffers inside a region; a release waits for steps using it") {
  DeviceRegions regions;
  int closed = 0;
  regions.begin(3);
  regions.finish(3, std::make_shared<pxtest::HostDeviceMapping>(1000, &closed));
  std::string why;
  CHECK(regions.find(3, 0, 1000, &why) != nullptr);
  CHECK(regions.find(3, 999, 1, &why) != nullptr);
  CHECK(regions.find(3, 1000, 0, &why) != nullptr);
  CHECK(regions.find(3, 999, 2, &why) == nullptr);
  CHECK(contains(why, "run past device memory region 3 of 1000 bytes"));
  CHECK(regions.find(3, ~0ull, 2, &why) == nullptr);  // no wrap-around
  CHECK(regions.find(4, 0, 1, &why) == nullptr);
  CHECK(contains(why, "device memory region 4 is not registered"));

  // A step under way holds the mapping: the release is refused until it lets go, so the
  // worker never frees memory the daemon may still write.
  using Release = DeviceRegions::Release;
  std::shared_ptr<DeviceMapping> held = regions.find(3, 0, 8, &why);
  std::shared_ptr<DeviceMapping> released;
  CHECK(regions.release(3, &released) == Release::kInUse);
  CHECK(released == nullptr);
  CHECK(closed == 0);
  held.reset();
  // Released: the caller gets the last reference, to close where it chooses (the pool).
  CHECK(regions.release(3, &released) == Release::kReleased);
  CHECK(closed == 0);
  CHECK(released.use_count() == 1);
  released.reset();
  CHECK(closed == 1);
  CHECK(regions.release(3, &released) == Release::kUnknown);
  CHECK(regions.size() == 0);
}

TEST_CASE("gpu: device regions: mappings are closed on the pool, and only their last holder's") {
  // cudaIpcCloseMemHandle may wait for the device: the loop never closes a mapping itself.
  px::ThreadPool pool(1);
  std::mutex mutex;
  std::vector<std::function<void()>> posted;
  px::Offload offload(pool, [&](std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex);
    posted.push_back(std::move(fn));
  });
  auto wait_posted = [&](size_t n) {
    for (int i = 0; i < 5000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (posted.size() >= n) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  };
  std::atomic<int> closed{0};
  std::thread::id closed_on;
  struct Recorded final : public DeviceMapping {
    std::atomic<int>* closed;
    std::thread::id* on;
    Recorded(std::atomic<int>* c, std::thread::id* o) : closed(c), on(o) {}
    ~Recorded() override {
      *on = std::this_thread::get_id();
      ++*closed;
    }
    void* pointer() const override { return nullptr; }
    uint64_t bytes() const override { return 1; }
    int device() const override { return 0; }
  };
  // Two mappings: the worker's regions still hold one (not closed), a step the other's last.
  auto kept = std::make_shared<Recorded>(&closed, &closed_on);
  std::vector<std::shared_ptr<DeviceMapping>> held = {
      kept, std::make_shared<Recorded>(&closed, &closed_on)};
  bool then_ran = false;
  px::release_mappings(offload, &held, [&] { then_ran = true; });
  CHECK(held.empty());
  REQUIRE(wait_posted(1));
  CHECK(closed == 1);
  CHECK(closed_on != std::this_thread::get_id());
  CHECK_FALSE(then_ran);  // the loop runs it
  posted[0]();
  CHECK(then_ran);
  CHECK(kept.use_count() == 1);

  // Nothing of which these are the last: `then` at once, no pool round trip.
  std::vector<std::shared_ptr<DeviceMapping>> shared = {kept};
  then_ran = false;
  px::release_mappings(offload, &shared, [&] { then_ran = true; });
  CHECK(then_ran);
  CHECK(closed == 1);

  // No `then` (a worker gone, the daemon exiting): closed on the pool, nothing posted.
  std::vector<std::shared_ptr<DeviceMapping>> last = {std::move(kept)};
  px::release_mappings(offload, &last);
  for (int i = 0; i < 5000 && closed < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(closed == 2);
  CHECK(closed_on != std::this_thread::get_id());
  std::lock_guard<std::mutex> lock(mutex);
  CHECK(posted.size() == 1);
}

TEST_CASE("gpu: device regions: a worker holds at most kMaxRegions") {
  DeviceRegions regions;
  int closed = 0;
  for (uint32_t r = 1; r <= DeviceRegions::kMaxRegions; ++r) {
    regions.begin(r);
    regions.finish(r, std::make_shared<pxtest::HostDeviceMapping>(1, &closed));
  }
  std::string why;
  CHECK(regions.check(DeviceRegions::kMaxRegions + 1, "0000:19:00.0", kIpcHandleBytes, 1, &why) ==
        PX_ERR_NO_MEMORY);
  CHECK(contains(why, "device memory regions already"));
}
