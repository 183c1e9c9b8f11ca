// The daemon's bookkeeping of a worker's device memory (daemon/gpu/device_regions.h): the
// checks on a registration and on a buffer inside a region, without a GPU (a mapping of
// host memory stands in for the IPC mapping: these checks never touch the memory).
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

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
  CHECK(regions.release(3) == Release::kInUse);
  CHECK(closed == 0);
  held.reset();
  CHECK(regions.release(3) == Release::kReleased);
  CHECK(closed == 1);
  CHECK(regions.release(3) == Release::kUnknown);
  CHECK(regions.size() == 0);
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
