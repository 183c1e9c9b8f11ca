// What the scheduler's unit tests (test_scheduler.cc, test_device_allreduce.cc) share: a
// submission entry built in one call, and a completion as a fake worker records it.
#pragma once

#include <cstdint>
#include <string>

#include "parallax_c.h"
#include "transport/ipc/shm_layout.h"

namespace pxtest {

struct Completion {
  uint64_t request_id;
  px_status status;
  std::string message;
};

inline px::SubmitEntry entry(uint64_t request_id, uint32_t var_id, px::Opcode opcode, uint64_t step,
                             px::BufferRef in, px::BufferRef out) {
  px::SubmitEntry e{};
  e.request_id = request_id;
  e.var_id = var_id;
  e.opcode = static_cast<uint16_t>(opcode);
  e.step = step;
  e.in = in;
  e.out = out;
  return e;
}

}  // namespace pxtest
