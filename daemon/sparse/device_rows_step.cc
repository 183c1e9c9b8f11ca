#include "daemon/sparse/device_rows_step.h"

#include <string>
#include <utility>
#include <vector>

#include "daemon/common/loop_thread.h"

namespace px {
namespace {

bool on_device(const BufferRef& ref) {
  return ref.memory_kind == static_cast<uint32_t>(MemoryKind::kCudaDevice);
}

// A worker of the step as the router sees it: completions of a pull copy the staged rows
// into the worker's device memory first. Holds the staged buffers and the worker's
// mappings until then (a px_free meanwhile is refused as busy).
class DeviceRowsWorker final : public Completer,
                               public std::enable_shared_from_this<DeviceRowsWorker> {
 public:
  DeviceRowsWorker(std::shared_ptr<Completer> worker, const Offload& offload)
      : worker_(std::move(worker)), offload_(offload) {}

  void complete(uint64_t request_id, px_status status, const std::string& message) override {
    PX_ASSERT_LOOP_THREAD();
    if (status != PX_OK || kind != Kind::kRowsBack || staged->rows.empty())
      return answer(request_id, status, message);
    auto self = shared_from_this();
    offload_.run(
        true,
        [self] {
          self->ok_ =
              self->gpu->copy_to_device(self->device, self->rows_out, self->staged->rows.data(),
                                        self->staged->rows.size() * sizeof(float), &self->why_);
        },
        [self, request_id, message] {
          if (self->ok_) return self->answer(request_id, PX_OK, message);
          self->answer(
              request_id, PX_ERR_INTERNAL,
              "gpu: the rows were not copied to device memory: " + self->why_ + self->where);
        });
  }
  std::string label() const override { return worker_->label(); }
  const SharedArena& arena() const override { return worker_->arena(); }
  const gpu::DeviceRegions* device_regions() const override { return worker_->device_regions(); }

  // Set up on the loop before the pool stages the buffers.
  std::shared_ptr<StagedRows> staged = std::make_shared<StagedRows>();
  std::vector<std::shared_ptr<gpu::DeviceMapping>> held;
  gpu::GpuBackend* gpu = nullptr;
  int device = 0;
  const int64_t* indices = nullptr;  // device
  size_t n = 0;
  void* rows_out = nullptr;  // device: a pull's or read's rows, a push's gradients, a load's values
  // What crosses PCIe: a push coalesced on the GPU; a load's indices and values as they are;
  // a pull's or read's indices, and its rows back once the router filled them.
  enum class Kind { kCoalesce, kRowsIn, kRowsBack } kind = Kind::kRowsBack;
  std::string where;  // " (variable 'v', pull step 3)"

 private:
  void answer(uint64_t request_id, px_status status, const std::string& message) {
    held.clear();  // before the worker hears: a px_free after it may close them
    worker_->complete(request_id, status, message);
  }

  std::shared_ptr<Completer> worker_;
  const Offload& offload_;
  bool ok_ = false;
  std::string why_;
};

// Resolves the device buffers of c (admission checked them), or says why not.
bool resolve(const Contribution& c, DeviceRowsWorker& w, std::string* why) {
  if (w.n == 0) return true;
  auto in = find_device_buffer(*c.worker, c.in, why);
  auto out = in ? find_device_buffer(*c.worker, c.out, why) : nullptr;
  if (!out) return false;
  w.device = in->device();
  w.indices = reinterpret_cast<const int64_t*>(static_cast<char*>(in->pointer()) + c.in.offset);
  w.rows_out = static_cast<char*>(out->pointer()) + c.out.offset;
  w.held = {std::move(in), std::move(out)};
  return true;
}

// On the pool: one worker's buffers across PCIe into w.staged.
void stage(DeviceRowsWorker& w, uint64_t table_rows, size_t dim, const std::string& label) {
  StagedRows& s = *w.staged;
  if (s.status != PX_OK || w.n == 0) return;
  std::string why;
  if (w.kind == DeviceRowsWorker::Kind::kCoalesce) {
    gpu::CoalescedPush coalesced;
    if (!w.gpu->coalesce_push(w.device, w.indices, static_cast<const float*>(w.rows_out), w.n, dim,
                              table_rows, &coalesced, &why)) {
      s.status = PX_ERR_INTERNAL;
      s.message = "gpu coalescing of " + label + "'s push: " + why + w.where;
      return;
    }
    if (coalesced.first_bad >= 0) {
      s.status = PX_ERR_INDEX;
      s.message = "index " + std::to_string(coalesced.bad_index) + " at position " +
                  std::to_string(coalesced.first_bad) + " is outside [0, " +
                  std::to_string(table_rows) + ") in " + label + "'s push step" + w.where +
                  "; nothing of it was applied";
      return;
    }
    s.indices = std::move(coalesced.indices);
    s.rows = std::move(coalesced.rows);
    return;
  }
  s.indices.resize(w.n);
  s.rows.resize(w.n * dim);
  bool ok = w.gpu->copy_to_host(w.device, s.indices.data(), w.indices, w.n * sizeof(int64_t), &why);
  if (ok && w.kind == DeviceRowsWorker::Kind::kRowsIn)
    ok = w.gpu->copy_to_host(w.device, s.rows.data(), w.rows_out, s.rows.size() * sizeof(float),
                             &why);
  if (!ok) {
    s.status = PX_ERR_INTERNAL;
    s.message = "gpu: " + label + "'s indices and rows were not copied to host: " + why + w.where;
  }
}

// A worker's device contribution, wrapped (see DeviceRowsWorker) with its buffers resolved,
// or with the reason it cannot run in its StagedRows.
std::shared_ptr<DeviceRowsWorker> wrap(const Offload& offload, gpu::GpuBackend* gpu,
                                       const Contribution& c, Opcode opcode,
                                       const std::string& where) {
  auto w = std::make_shared<DeviceRowsWorker>(c.worker, offload);
  w->gpu = gpu;
  w->n = c.in.bytes / sizeof(int64_t);
  w->kind = opcode == Opcode::kPushRows   ? DeviceRowsWorker::Kind::kCoalesce
            : opcode == Opcode::kLoadRows ? DeviceRowsWorker::Kind::kRowsIn
                                          : DeviceRowsWorker::Kind::kRowsBack;
  w->where = where;
  std::string why;
  if (!gpu) {
    w->staged->status = PX_ERR_NOT_IMPLEMENTED;
    w->staged->message = "this parallaxd has no usable GPU" + where;
  } else if (!resolve(c, *w, &why)) {
    w->staged->status = PX_ERR_INVALID;
    w->staged->message = c.worker->label() + " gave an invalid buffer: " + why + where;
  }
  return w;
}

}  // namespace

bool has_device_rows(const PendingStep& pending) {
  for (const auto& c : pending.by_rank)
    if (c && on_device(c->in)) return true;
  return false;
}

void run_device_rows_step(const Offload& offload, gpu::GpuBackend* gpu, SparseRouter& router,
                          std::shared_ptr<Job> job, Variable& var, Opcode opcode, uint64_t step,
                          PendingStep pending) {
  PX_ASSERT_LOOP_THREAD();
  bool push = opcode == Opcode::kPushRows;
  std::string where = " (variable '" + var.name + "', " + (push ? "push" : "pull") + " step " +
                      std::to_string(step) + ")";
  std::vector<std::shared_ptr<DeviceRowsWorker>> staged;
  for (auto& c : pending.by_rank) {
    if (!on_device(c->in)) continue;
    auto w = wrap(offload, gpu, *c, opcode, where);
    c->staged = w->staged;
    c->worker = w;  // the router answers through it
    staged.push_back(std::move(w));
  }
  uint64_t rows = var.fingerprint.count;
  size_t dim = static_cast<size_t>(var.fingerprint.dim);
  auto later = std::make_shared<PendingStep>(std::move(pending));
  offload.run(
      true,
      [staged, rows, dim] {
        for (auto& w : staged) stage(*w, rows, dim, w->label());
      },
      [&router, job = std::move(job), &var, opcode, step, later]() mutable {
        router.run_step(std::move(job), var, opcode, step, std::move(*later));
      });
}

void run_device_rows_single(const Offload& offload, gpu::GpuBackend* gpu, SparseRouter& router,
                            std::shared_ptr<Job> job, std::shared_ptr<Completer> worker,
                            Variable& var, const SubmitEntry& entry) {
  PX_ASSERT_LOOP_THREAD();
  auto opcode = static_cast<Opcode>(entry.opcode);
  std::string where =
      " (variable '" + var.name + "', " + (opcode == Opcode::kLoadRows ? "load" : "read") + ")";
  Contribution c{worker, entry.request_id, entry.in, entry.out, entry.root, nullptr};
  auto w = wrap(offload, gpu, c, opcode, where);
  uint64_t rows = var.fingerprint.count;
  size_t dim = static_cast<size_t>(var.fingerprint.dim);
  offload.run(
      true, [w, rows, dim] { stage(*w, rows, dim, w->label()); },
      [&router, job = std::move(job), w, &var, entry]() mutable {
        router.run_single(std::move(job), w, var, entry, w->staged);
      });
}

}  // namespace px
