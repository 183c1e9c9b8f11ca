// Fuzz target: the client control decoder, what parallaxd (daemon/front/session.cc) and
// libparallax (clients/c) do with bytes from the other end of the Unix socket before any
// handler acts on them: FrameDecoder cuts the stream into frames, parse_frame verifies each
// one (the FlatBuffers verifier, the protocol version, a body), and the handlers read the
// body's fields.
//
// Contract: no crash, no sanitizer report, no leak, for any bytes; a frame the decoder
// hands out has 1 to kMaxControlFrameBytes bytes; a refused frame comes with a reason; a
// message parse_frame accepts has our protocol version and a body of the type it names
// (the handlers dereference body_as_X() unchecked), every string in it is NUL-terminated
// inside the frame, and every field a handler reads is readable. RegisterSparse options go
// through SparseOptions::validate and canonical() as the session does.
#include <cmath>
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "fuzz_inputs.h"
#include "sharding/sparse_spec.h"
#include "transport/ipc/control_channel.h"
#include "transport/kernels/dtype.h"

namespace px::fuzz {
namespace {

using namespace px::control;

uint64_t text(const flatbuffers::String* s) {
  if (!s) return 0;
  PX_FUZZ_CHECK(s->c_str()[s->size()] == '\0');
  return touch(s->c_str(), s->size()) + std::string(s->str()).size();
}

// What session.cc's handle_register_sparse builds from the options before validating them.
uint64_t sparse_options(const control::SparseOptions* o) {
  if (!o) return 0;  // the session answers PX_ERR_PROTOCOL
  px::SparseOptions options;
  options.optimizer = static_cast<Optimizer>(o->optimizer());
  options.learning_rate = o->learning_rate();
  options.beta1 = o->beta1();
  options.beta2 = o->beta2();
  options.epsilon = o->epsilon();
  options.initial_accumulator = o->initial_accumulator();
  options.initializer = static_cast<Initializer>(o->initializer());
  options.init_seed = o->init_seed();
  options.init_low = o->init_low();
  options.init_high = o->init_high();
  options.init_std = o->init_std();
  options.mean = o->aggregation() == 1;
  options.consistency = static_cast<Consistency>(o->consistency());
  options.staleness = o->staleness();
  options.partitions = o->partitions();
  options.route = static_cast<Route>(o->route());
  options.nonfinite = static_cast<NonFinite>(o->nonfinite());
  options.wire = static_cast<WireDtype>(o->wire_dtype());
  std::string error;
  if (!options.validate(&error)) {
    PX_FUZZ_CHECK(!error.empty());
    return error.size();
  }
  return options.canonical().size();
}

// Reads every field of the body, as the daemon's handlers (requests) and the client's
// (replies) do.
uint64_t read_body(const Message& m) {
  switch (m.body_type()) {
    case Body::Hello: {
      const Hello* b = m.body_as_Hello();
      PX_FUZZ_CHECK(b);
      return b->abi_version() + text(b->job()) + static_cast<uint64_t>(b->local_rank()) +
             static_cast<uint64_t>(b->local_size()) + static_cast<uint64_t>(b->pid()) +
             b->arena_bytes();
    }
    case Body::HelloReply: {
      const HelloReply* b = m.body_as_HelloReply();
      PX_FUZZ_CHECK(b);
      uint64_t sum =
          static_cast<uint64_t>(b->status()) + text(b->message()) + b->daemon_abi_version();
      for (int32_t v : {b->node_index(), b->node_count(), b->rank(), b->world_size(),
                        b->local_rank(), b->local_size()})
        sum += static_cast<uint64_t>(v);
      if (b->gpu_pci_bus_ids())
        for (const auto* id : *b->gpu_pci_bus_ids()) sum += text(id);
      return sum + text(b->gpu_why_none());
    }
    case Body::RegisterDense: {
      const RegisterDense* b = m.body_as_RegisterDense();
      PX_FUZZ_CHECK(b);
      uint64_t sum = text(b->name()) + b->count();
      if (valid_dtype(b->dtype()) && valid_reduce_op(b->op()))
        sum += dtype_size(static_cast<DType>(b->dtype()));
      return sum;
    }
    case Body::RegisterSparse: {
      const RegisterSparse* b = m.body_as_RegisterSparse();
      PX_FUZZ_CHECK(b);
      uint64_t tables = 0;
      if (b->table_names())
        for (auto name : *b->table_names()) tables += text(name);
      if (b->table_rows())
        for (uint64_t rows : *b->table_rows()) tables += rows;
      return text(b->name()) + b->dtype() + b->rows() + b->dim() + sparse_options(b->options()) +
             tables;
    }
    case Body::RegisterReply: {
      const RegisterReply* b = m.body_as_RegisterReply();
      PX_FUZZ_CHECK(b);
      return static_cast<uint64_t>(b->status()) + text(b->message()) + b->var_id();
    }
    case Body::StatsRequest: {
      const StatsRequest* b = m.body_as_StatsRequest();
      PX_FUZZ_CHECK(b);
      return b->var_id();
    }
    case Body::StatsReply: {
      const StatsReply* b = m.body_as_StatsReply();
      PX_FUZZ_CHECK(b);
      return static_cast<uint64_t>(b->status()) + text(b->message()) + b->ops() + b->bytes() +
             b->wait_ns() + b->reduce_ns() + b->pull_steps() + b->push_steps() + b->rows_pulled() +
             b->rows_unique() + b->rows_applied() + b->bytes_sent() + b->bytes_received() +
             b->request_partitions() + b->search_steps_left();
    }
    case Body::SetSparseLr: {
      const SetSparseLr* b = m.body_as_SetSparseLr();
      PX_FUZZ_CHECK(b);
      double rate = b->learning_rate();  // any bits: the daemon checks it is finite and > 0
      return b->var_id() + b->from_step() + (std::isfinite(rate) && rate > 0 ? 1u : 0u);
    }
    case Body::SetSparseLrReply: {
      const SetSparseLrReply* b = m.body_as_SetSparseLrReply();
      PX_FUZZ_CHECK(b);
      return static_cast<uint64_t>(b->status()) + text(b->message());
    }
    case Body::Goodbye:
      PX_FUZZ_CHECK(m.body_as_Goodbye());
      return 1;
    case Body::Checkpoint: {
      const Checkpoint* b = m.body_as_Checkpoint();
      PX_FUZZ_CHECK(b);
      return text(b->path()) + static_cast<uint64_t>(b->timeout_ms());
    }
    case Body::CheckpointReply: {
      const CheckpointReply* b = m.body_as_CheckpointReply();
      PX_FUZZ_CHECK(b);
      return static_cast<uint64_t>(b->status()) + text(b->message());
    }
    case Body::ErrorText: {
      const ErrorText* b = m.body_as_ErrorText();
      PX_FUZZ_CHECK(b);
      return b->request_id();
    }
    case Body::ErrorTextReply: {
      const ErrorTextReply* b = m.body_as_ErrorTextReply();
      PX_FUZZ_CHECK(b);
      return b->found() + text(b->message());
    }
    case Body::Cancel: {
      const Cancel* b = m.body_as_Cancel();
      PX_FUZZ_CHECK(b);
      return b->request_id() + text(b->reason());
    }
    case Body::CancelReply: {
      const CancelReply* b = m.body_as_CancelReply();
      PX_FUZZ_CHECK(b);
      return b->withdrawn();
    }
    case Body::Abort: {
      const Abort* b = m.body_as_Abort();
      PX_FUZZ_CHECK(b);
      return text(b->reason());
    }
    case Body::AbortReply: {
      const AbortReply* b = m.body_as_AbortReply();
      PX_FUZZ_CHECK(b);
      return static_cast<uint64_t>(b->status()) + text(b->message());
    }
    case Body::AdminRequest: {
      const AdminRequest* b = m.body_as_AdminRequest();
      PX_FUZZ_CHECK(b);
      return static_cast<uint64_t>(b->command()) + text(b->path()) +
             static_cast<uint64_t>(b->timeout_ms()) + b->offset() + text(b->job()) +
             static_cast<uint64_t>(b->min_wait_ms());
    }
    case Body::AdminReply: {
      const AdminReply* b = m.body_as_AdminReply();
      PX_FUZZ_CHECK(b);
      uint64_t sum =
          static_cast<uint64_t>(b->status()) + text(b->message()) + b->total() + b->next_offset();
      if (b->jobs()) sum += b->jobs()->size();
      if (b->variables()) sum += b->variables()->size();
      if (b->peers()) sum += b->peers()->size();
      if (b->stalls()) sum += b->stalls()->size();
      return sum;
    }
    case Body::RegisterDeviceMemory: {
      const RegisterDeviceMemory* b = m.body_as_RegisterDeviceMemory();
      PX_FUZZ_CHECK(b);
      uint64_t sum = b->region() + text(b->pci_bus_id()) + b->bytes();
      if (b->ipc_handle())
        for (uint8_t byte : *b->ipc_handle()) sum += byte;
      return sum;
    }
    case Body::ReleaseDeviceMemory: {
      const ReleaseDeviceMemory* b = m.body_as_ReleaseDeviceMemory();
      PX_FUZZ_CHECK(b);
      return b->region();
    }
    case Body::DeviceMemoryReply: {
      const DeviceMemoryReply* b = m.body_as_DeviceMemoryReply();
      PX_FUZZ_CHECK(b);
      return static_cast<uint64_t>(b->status()) + text(b->message());
    }
    case Body::NONE:
      PX_FUZZ_CHECK(!"parse_frame accepted a message without a body");
  }
  // A body type newer than this schema: the session drops such a client, naming the type.
  return std::string(EnumNameBody(m.body_type())).size();
}

// Takes every complete frame out of the decoder; false once the stream is refused (the
// session closes the connection then).
bool drain(FrameDecoder& decoder, uint64_t* sink) {
  std::string payload, error;
  for (;;) {
    int got = decoder.next(&payload, &error);
    if (got == 0) return true;
    if (got < 0) {
      PX_FUZZ_CHECK(!error.empty());
      return false;
    }
    PX_FUZZ_CHECK(got == 1);
    PX_FUZZ_CHECK(!payload.empty() && payload.size() <= kMaxControlFrameBytes);
    error.clear();
    const Message* message = parse_frame(payload, &error);
    if (!message) {
      PX_FUZZ_CHECK(!error.empty());
      continue;  // the session closes here; reading on checks the decoder's own state
    }
    PX_FUZZ_CHECK(message->protocol_version() == kControlProtocolVersion);
    PX_FUZZ_CHECK(message->body_type() != Body::NONE);
    *sink += read_body(*message);
  }
}

}  // namespace
}  // namespace px::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  size_t split = px::fuzz::split_point(data, size);
  const char* stream = reinterpret_cast<const char*>(data + 1);
  size_t n = size - 1;
  split = split > n ? n : split;
  px::FrameDecoder decoder;
  uint64_t sink = 0;
  decoder.append(stream, split);
  if (px::fuzz::drain(decoder, &sink)) {
    decoder.append(stream + split, n - split);
    px::fuzz::drain(decoder, &sink);
  }
  px::fuzz::sink = px::fuzz::sink + sink;
  return 0;
}
