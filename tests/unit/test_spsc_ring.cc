#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "transport/ipc/spsc_ring.h"

namespace {
struct Item {
  uint64_t value;
  uint64_t check;
};
}  // namespace

TEST_CASE("ring: fills to capacity, refuses more, drains in order") {
  std::vector<char> memory(px::SpscRing<Item>::bytes_for(8) + 64);
  void* aligned =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(memory.data()) + 63) & ~uintptr_t{63});
  px::SpscRing<Item>::format(aligned);
  px::SpscRing<Item> ring(aligned, 8);
  for (uint64_t i = 0; i < 8; ++i) CHECK(ring.try_push({i, ~i}));
  CHECK_FALSE(ring.try_push({99, 0}));
  Item item;
  for (uint64_t i = 0; i < 8; ++i) {
    REQUIRE(ring.try_pop(&item));
    CHECK(item.value == i);
    CHECK(item.check == ~i);
  }
  CHECK_FALSE(ring.try_pop(&item));
  CHECK(ring.empty());
}

TEST_CASE("ring: wakeup flag is consumed once per arming") {
  std::vector<char> memory(px::SpscRing<Item>::bytes_for(4) + 64);
  void* aligned =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(memory.data()) + 63) & ~uintptr_t{63});
  px::SpscRing<Item>::format(aligned);
  px::SpscRing<Item> ring(aligned, 4);
  CHECK(ring.consumer_needs_wakeup());  // a fresh consumer counts as asleep
  CHECK_FALSE(ring.consumer_needs_wakeup());
  CHECK(ring.arm_and_check_empty());
  CHECK(ring.try_push({1, 1}));
  CHECK(ring.consumer_needs_wakeup());
  CHECK_FALSE(ring.consumer_needs_wakeup());
  CHECK_FALSE(ring.arm_and_check_empty());  // not empty: consumer must drain, not sleep
}

TEST_CASE("ring: two threads pass a million items without loss or reordering") {
  constexpr uint32_t kCapacity = 64;
  constexpr uint64_t kItems = 1000000;
  std::vector<char> memory(px::SpscRing<Item>::bytes_for(kCapacity) + 64);
  void* aligned =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(memory.data()) + 63) & ~uintptr_t{63});
  px::SpscRing<Item>::format(aligned);
  px::SpscRing<Item> producer(aligned, kCapacity), consumer(aligned, kCapacity);
  std::thread t([&] {
    for (uint64_t i = 0; i < kItems;)
      if (producer.try_push({i, i * 3}))
        ++i;
      else
        std::this_thread::yield();
  });
  uint64_t expected = 0, bad = 0;
  Item item;
  while (expected < kItems) {
    if (consumer.try_pop(&item)) {
      bad += item.value != expected || item.check != expected * 3;
      ++expected;
    } else {
      std::this_thread::yield();
    }
  }
  t.join();
  CHECK(bad == 0);
  CHECK(consumer.empty());
}
