#include <doctest/doctest.h>

#include <cstring>

#include "transport/collectives/scratch_pool.h"

using namespace px;

TEST_CASE("scratch buffers are reused: the smallest idle one that fits, none beyond the cap") {
  ScratchBuffer::free_idle();  // other tests' collectives leave buffers behind
  size_t before = ScratchBuffer::idle_bytes();
  REQUIRE(before == 0);
  char* first = nullptr;
  {
    ScratchBuffer a = ScratchBuffer::take(1 << 20);
    REQUIRE(a.size() >= size_t{1} << 20);
    std::memset(a.data(), 7, a.size());
    first = a.data();
  }
  CHECK(ScratchBuffer::idle_bytes() == before + (size_t{1} << 20));
  {
    ScratchBuffer small = ScratchBuffer::take(1000);  // the idle 1 MiB one fits
    CHECK(small.data() == first);
    CHECK(small.size() == size_t{1} << 20);
    ScratchBuffer big = ScratchBuffer::take(2 << 20);  // nothing idle fits: a new one
    CHECK(big.data() != first);
    CHECK(big.size() == size_t{2} << 20);
    CHECK(ScratchBuffer::idle_bytes() == before);
    ScratchBuffer moved = std::move(big);
    CHECK(big.data() == nullptr);  // NOLINT: moved-from is empty by contract
    CHECK(moved.size() == size_t{2} << 20);
  }
  CHECK(ScratchBuffer::idle_bytes() == before + (size_t{3} << 20));
  {
    // More than the cap (256 MiB) comes back: the excess is freed, the pool stays bounded.
    ScratchBuffer huge = ScratchBuffer::take(size_t{300} << 20);
  }
  CHECK(ScratchBuffer::idle_bytes() <= size_t{256} << 20);
  CHECK(ScratchBuffer::idle_bytes() >= before + (size_t{3} << 20));
}

TEST_CASE("scratch buffers held: in use and idle, until the idle ones are freed") {
  ScratchBuffer::free_idle();
  size_t before = ScratchBuffer::held_bytes();  // other tests' buffers still in use, if any
  {
    ScratchBuffer a = ScratchBuffer::take(1 << 20);
    CHECK(ScratchBuffer::held_bytes() == before + (size_t{1} << 20));  // in use
  }
  CHECK(ScratchBuffer::held_bytes() == before + (size_t{1} << 20));  // idle
  ScratchBuffer::free_idle();
  CHECK(ScratchBuffer::held_bytes() == before);
  {
    ScratchBuffer huge = ScratchBuffer::take(size_t{300} << 20);  // above the cap
    CHECK(ScratchBuffer::held_bytes() == before + (size_t{300} << 20));
  }
  CHECK(ScratchBuffer::held_bytes() == before);  // freed, not kept
}
