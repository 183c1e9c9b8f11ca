// px_gpu_worker: a worker that holds device memory (CUDA builds only; it links the CUDA
// runtime, as a framework's process has it loaded). Exits 77 after printing "no CUDA device
// here: why" where there is no device.
//
//   px_gpu_worker alloc   px_alloc_ex device memory the daemon maps, written by a kernel
//                         (cudaMemset), freed; bad devices refused; some left for
//                         px_disconnect to release
//   px_gpu_worker allreduce [COUNT]
//                         px_allreduce_ex on device memory (COUNT elements, 3000 by
//                         default; on one node or across nodes) for every dtype x op, against
//                         px_allreduce on host memory of the same data, bit for bit; the
//                         result read by a copy queued on the stream right after the call,
//                         with no host wait in between (stream ordering); device
//                         memory outside px_alloc_ex (cudaMalloc), copied through the
//                         variable's staging allocation; px_broadcast_ex and
//                         px_allgather_ex on device memory
//   px_gpu_worker rows    px_pull_rows_ex and px_push_rows_ex on device memory (indices with
//                         duplicates, coalesced on the GPU) against the same steps on host
//                         memory of a twin table, bit for bit; px_load_rows_ex and
//                         px_read_rows_ex likewise
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parallax_c.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  printf("FAIL %s: %s\n", what.c_str(), px_last_error());
  fflush(stdout);
  exit(1);
}

void check(px_status s, const std::string& what) {
  if (s != PX_OK) die(what + " returned " + px_status_name(s));
}

void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    printf("FAIL %s: %s\n", what.c_str(), cudaGetErrorString(err));
    exit(1);
  }
}

int alloc(px_client* c, int devices) {
  px_alloc_options o;
  px_alloc_options_init(&o);
  o.memory_kind = PX_MEMORY_CUDA;
  const size_t bytes = 1 << 20;
  void* p = nullptr;
  check(px_alloc_ex(c, bytes, &o, &p), "px_alloc_ex PX_MEMORY_CUDA");
  cudaPointerAttributes attributes{};
  check_cuda(cudaPointerGetAttributes(&attributes, p), "cudaPointerGetAttributes");
  if (attributes.type != cudaMemoryTypeDevice) die("px_alloc_ex did not return device memory");
  check_cuda(cudaMemset(p, 1, bytes), "cudaMemset on px_alloc_ex memory");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(px_free(c, p), "px_free of device memory");
  if (px_free(c, p) != PX_ERR_INVALID) die("px_free twice was not refused");

  o.device = devices;  // one past the last
  if (px_alloc_ex(c, bytes, &o, &p) != PX_ERR_INVALID) die("a device past the last was taken");
  if (std::string(px_last_error()).find("cudaDeviceGetPCIBusId") == std::string::npos)
    die("the bad device's error does not name cudaDeviceGetPCIBusId");

  // Left for px_disconnect, which releases them before freeing.
  o.device = 0;
  for (int i = 0; i < 3; ++i) check(px_alloc_ex(c, bytes, &o, &p), "px_alloc_ex, kept");
  check(px_barrier(c, 20000), "px_barrier");
  printf("gpu alloc OK on %d device(s)\n", devices);
  return 0;
}

size_t dtype_bytes(px_dtype t) {
  return t == PX_F64 || t == PX_I64 ? 8 : t == PX_F16 || t == PX_BF16 ? 2 : 4;
}

// Deterministic inputs per rank: small integers (exact in every dtype), some negative.
std::vector<unsigned char> inputs(px_dtype t, int rank, size_t count) {
  std::vector<unsigned char> bytes(count * dtype_bytes(t));
  for (size_t i = 0; i < count; ++i) {
    int v = static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 23) - 11;
    float f = static_cast<float>(v) * 0.5f;
    switch (t) {
      case PX_F32:
        std::memcpy(&bytes[i * 4], &f, 4);
        break;
      case PX_F64: {
        double d = f;
        std::memcpy(&bytes[i * 8], &d, 8);
        break;
      }
      case PX_I32: {
        int32_t x = v;
        std::memcpy(&bytes[i * 4], &x, 4);
        break;
      }
      case PX_I64: {
        int64_t x = v;
        std::memcpy(&bytes[i * 8], &x, 8);
        break;
      }
      case PX_BF16: {  // f's top half: exact for these values
        uint32_t u;
        std::memcpy(&u, &f, 4);
        uint16_t h = static_cast<uint16_t>(u >> 16);
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      case PX_F16: {  // v * 0.5 in binary16: exact for |v| <= 11
        uint16_t h = 0;
        if (v != 0) {
          float a = f < 0 ? -f : f;
          int e = 0;
          while (a >= 2.0f) {
            a /= 2;
            ++e;
          }
          while (a < 1.0f) {
            a *= 2;
            --e;
          }
          uint16_t mant = static_cast<uint16_t>((a - 1.0f) * 1024.0f);
          h = static_cast<uint16_t>((f < 0 ? 0x8000 : 0) | ((e + 15) << 10) | mant);
        }
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      default:
        break;
    }
  }
  return bytes;
}

int allreduce(px_client* c, size_t count) {
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  px_alloc_options ao;
  px_alloc_options_init(&ao);
  ao.memory_kind = PX_MEMORY_CUDA;
  void* dev_in = nullptr;
  void* dev_out = nullptr;
  check(px_alloc_ex(c, count * 8, &ao, &dev_in), "px_alloc_ex in");
  check(px_alloc_ex(c, count * 8, &ao, &dev_out), "px_alloc_ex out");
  void* pinned = nullptr;
  check_cuda(cudaMallocHost(&pinned, count * 8), "cudaMallocHost");
  int cases = 0;
  for (px_dtype t : {PX_F32, PX_F64, PX_F16, PX_BF16, PX_I32, PX_I64}) {
    for (px_reduce_op op : {PX_SUM, PX_MEAN, PX_MIN, PX_MAX}) {
      char name[32], host_name[32];
      snprintf(name, sizeof name, "d%do%d", static_cast<int>(t), static_cast<int>(op));
      snprintf(host_name, sizeof host_name, "h%do%d", static_cast<int>(t), static_cast<int>(op));
      std::string label = std::string("dtype ") + std::to_string(t) + " op " + std::to_string(op);
      px_var* dv = nullptr;
      px_var* hv = nullptr;
      check(px_register_dense(c, name, t, count, op, &dv), label + ": register");
      check(px_register_dense(c, host_name, t, count, op, &hv), label + ": register host");
      std::vector<unsigned char> in = inputs(t, w.rank, count);
      size_t bytes = in.size();
      check_cuda(cudaMemcpy(dev_in, in.data(), bytes, cudaMemcpyHostToDevice), "upload");
      check_cuda(cudaMemset(dev_out, 0xff, bytes), "memset");
      check_cuda(cudaDeviceSynchronize(), "sync");
      px_op_options o;
      px_op_options_init(&o);
      o.memory_kind = PX_MEMORY_CUDA;
      o.stream = stream;
      px_request* r = nullptr;
      check(px_allreduce_ex(dv, dev_in, dev_out, &o, &r), "px_allreduce_ex " + label);
      // Queued right after the call: sees the result with no host wait in between.
      check_cuda(cudaMemcpyAsync(pinned, dev_out, bytes, cudaMemcpyDeviceToHost, stream),
                 "copy back");
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      std::vector<unsigned char> device_result(static_cast<unsigned char*>(pinned),
                                               static_cast<unsigned char*>(pinned) + bytes);
      check(px_wait(r, 60000), "px_wait " + label);
      check(px_request_free(r), "px_request_free");
      std::vector<unsigned char> host_result(bytes);
      check(px_allreduce(hv, in.data(), host_result.data(), &r), "px_allreduce host " + label);
      check(px_wait(r, 60000), "px_wait host");
      check(px_request_free(r), "px_request_free");
      if (device_result != host_result) die("device and host results differ for " + label);
      ++cases;
    }
  }
  {  // Broadcast on device memory: the last rank's input reaches every worker's output.
    px_var* bv = nullptr;
    check(px_register_dense(c, "bcast", PX_F32, count, PX_SUM, &bv), "register bcast");
    std::vector<unsigned char> mine = inputs(PX_F32, w.rank, count);
    std::vector<unsigned char> root_in = inputs(PX_F32, w.world_size - 1, count);
    check_cuda(cudaMemcpy(dev_in, mine.data(), mine.size(), cudaMemcpyHostToDevice), "upload");
    check_cuda(cudaMemset(dev_out, 0xff, mine.size()), "memset");
    check_cuda(cudaDeviceSynchronize(), "sync");
    px_op_options bo;
    px_op_options_init(&bo);
    bo.memory_kind = PX_MEMORY_CUDA;
    bo.stream = stream;
    bo.root = w.world_size - 1;
    px_request* r = nullptr;
    check(px_broadcast_ex(bv, dev_in, dev_out, &bo, &r), "px_broadcast_ex");
    check_cuda(cudaMemcpyAsync(pinned, dev_out, mine.size(), cudaMemcpyDeviceToHost, stream),
               "copy back");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(px_wait(r, 60000), "px_wait broadcast");
    check(px_request_free(r), "px_request_free");
    if (std::memcmp(pinned, root_in.data(), root_in.size()) != 0)
      die("the device broadcast did not deliver the root's input");
    // Allgather on device memory: every rank's input, in rank order.
    px_var* gv = nullptr;
    check(px_register_dense(c, "gather", PX_F32, count, PX_SUM, &gv), "register gather");
    size_t all = mine.size() * static_cast<size_t>(w.world_size);
    void* gathered = nullptr;
    check(px_alloc_ex(c, all, &ao, &gathered), "px_alloc_ex gathered");
    check(px_allgather_ex(gv, dev_in, gathered, &bo, &r), "px_allgather_ex");
    check(px_wait(r, 60000), "px_wait allgather");
    check(px_request_free(r), "px_request_free");
    std::vector<unsigned char> got(all);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check_cuda(cudaMemcpy(got.data(), gathered, all, cudaMemcpyDeviceToHost), "download");
    for (int k = 0; k < w.world_size; ++k)
      if (std::memcmp(got.data() + k * mine.size(), inputs(PX_F32, k, count).data(), mine.size()) !=
          0)
        die("the device allgather's block of rank " + std::to_string(k) + " differs");
    check(px_free(c, gathered), "px_free gathered");
  }
  // In place (in == out), against the host path.
  px_var* v = nullptr;
  px_var* hv = nullptr;
  check(px_register_dense(c, "inplace", PX_F32, count, PX_SUM, &v), "register inplace");
  check(px_register_dense(c, "inplace-host", PX_F32, count, PX_SUM, &hv), "register host");
  std::vector<unsigned char> in = inputs(PX_F32, w.rank, count);
  check_cuda(cudaMemcpy(dev_in, in.data(), in.size(), cudaMemcpyHostToDevice), "upload");
  check_cuda(cudaDeviceSynchronize(), "sync");  // the upload is not on the stream
  px_op_options o;
  px_op_options_init(&o);
  o.memory_kind = PX_MEMORY_CUDA;
  o.stream = stream;
  px_request* r = nullptr;
  check(px_allreduce_ex(v, dev_in, dev_in, &o, &r), "px_allreduce_ex in place");
  check(px_wait(r, 60000), "px_wait in place");
  check(px_request_free(r), "px_request_free");
  std::vector<unsigned char> device_result(in.size()), host_result(in.size());
  check_cuda(cudaMemcpy(device_result.data(), dev_in, in.size(), cudaMemcpyDeviceToHost),
             "copy back");
  check(px_allreduce(hv, in.data(), host_result.data(), &r), "px_allreduce host in place");
  check(px_wait(r, 60000), "px_wait host");
  check(px_request_free(r), "px_request_free");
  if (device_result != host_result) die("in place: device and host results differ");
  // Device memory outside px_alloc_ex (cudaMalloc'd, as a framework's allocator holds it):
  // copied through the variable's staging allocation, on the stream, both ways; then in
  // outside and out inside; against the host path, read by a copy queued right after.
  void* plain_in = nullptr;
  void* plain_out = nullptr;
  check_cuda(cudaMalloc(&plain_in, in.size()), "cudaMalloc in");
  check_cuda(cudaMalloc(&plain_out, in.size()), "cudaMalloc out");
  px_var* sv = nullptr;
  check(px_register_dense(c, "staged", PX_F32, count, PX_SUM, &sv), "register staged");
  for (int round = 0; round < 3; ++round) {
    std::string label = "outside px_alloc_ex, round " + std::to_string(round);
    check_cuda(cudaMemcpy(plain_in, in.data(), in.size(), cudaMemcpyHostToDevice), "upload");
    check_cuda(cudaMemset(plain_out, 0xff, in.size()), "memset");
    check_cuda(cudaMemset(dev_out, 0xff, in.size()), "memset");
    check_cuda(cudaDeviceSynchronize(), "sync");
    void* out = round == 2 ? dev_out : round == 1 ? plain_in : plain_out;  // 1: in place
    check(px_allreduce_ex(sv, plain_in, out, &o, &r), "px_allreduce_ex " + label);
    check_cuda(cudaMemcpyAsync(pinned, out, in.size(), cudaMemcpyDeviceToHost, stream),
               "copy back");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(px_wait(r, 60000), "px_wait " + label);
    check(px_request_free(r), "px_request_free");
    if (std::memcmp(pinned, host_result.data(), in.size()) != 0)
      die(label + ": device and host results differ");
  }
  // The staged variable keeps to its stream: its staging allocation is shared by its steps.
  cudaStream_t other_stream;
  check_cuda(cudaStreamCreateWithFlags(&other_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  px_op_options other_o = o;
  other_o.stream = other_stream;
  if (px_allreduce_ex(sv, plain_in, plain_out, &other_o, &r) != PX_ERR_INVALID)
    die("a staged step on a second stream was not refused");
  check_cuda(cudaStreamDestroy(other_stream), "cudaStreamDestroy");
  check_cuda(cudaFree(plain_in), "cudaFree");
  check_cuda(cudaFree(plain_out), "cudaFree");
  // A host pointer as device memory is refused, and device memory as host memory.
  std::vector<float> host(count);
  if (px_allreduce_ex(v, host.data(), host.data(), &o, &r) != PX_ERR_INVALID)
    die("a host buffer passed as PX_MEMORY_CUDA was not refused");
  void* other = nullptr;
  check_cuda(cudaMalloc(&other, count * 4), "cudaMalloc");
  if (px_allreduce(v, other, other, &r) != PX_ERR_INVALID)
    die("device memory passed as host memory was not refused");
  check_cuda(cudaFree(other), "cudaFree");
  check(px_free(c, dev_in), "px_free in");
  check(px_free(c, dev_out), "px_free out");
  check_cuda(cudaFreeHost(pinned), "cudaFreeHost");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  check(px_barrier(c, 20000), "px_barrier");
  printf("gpu allreduce OK: %d dtype x op cases bitwise the host path's\n", cases);
  return 0;
}

// Sparse pull and push steps on device memory against a twin table stepped on host memory.
int rows(px_client* c) {
  px_world_info w;
  w.struct_size = sizeof w;
  check(px_world(c, &w), "px_world");
  const uint64_t table_rows = 100, dim = 8, n = 64;
  px_sparse_options so;
  px_sparse_options_init(&so);
  so.learning_rate = 0.5;
  px_var* dev = nullptr;
  px_var* host = nullptr;
  check(px_register_sparse(c, "rows-dev", PX_F32, table_rows, dim, &so, &dev), "register dev");
  check(px_register_sparse(c, "rows-host", PX_F32, table_rows, dim, &so, &host), "register host");
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  px_alloc_options ao;
  px_alloc_options_init(&ao);
  ao.memory_kind = PX_MEMORY_CUDA;
  void* d_idx = nullptr;
  void* d_rows = nullptr;
  check(px_alloc_ex(c, n * 8, &ao, &d_idx), "px_alloc_ex indices");
  check(px_alloc_ex(c, n * dim * 4, &ao, &d_rows), "px_alloc_ex rows");
  px_op_options o;
  px_op_options_init(&o);
  o.memory_kind = PX_MEMORY_CUDA;
  o.stream = stream;
  std::vector<int64_t> idx(n);
  std::vector<float> grads(n * dim), from_device(n * dim), from_host(n * dim);
  for (uint64_t step = 0; step < 4; ++step) {
    // Duplicates within and across workers; halves, so every sum is exact in any order.
    for (uint64_t i = 0; i < n; ++i)
      idx[i] = static_cast<int64_t>((i * 7 + static_cast<uint64_t>(w.rank) * 3 + step) % 40);
    for (uint64_t i = 0; i < n * dim; ++i) grads[i] = static_cast<float>((i + step) % 5) * 0.5f;
    std::string label = "step " + std::to_string(step);
    check_cuda(cudaMemcpy(d_idx, idx.data(), n * 8, cudaMemcpyHostToDevice), "upload indices");
    check_cuda(cudaMemset(d_rows, 0xff, n * dim * 4), "memset");
    check_cuda(cudaDeviceSynchronize(), "sync");
    px_request* r = nullptr;
    check(px_pull_rows_ex(dev, static_cast<const int64_t*>(d_idx), n, d_rows, &o, &r),
          "px_pull_rows_ex " + label);
    // Queued right after the call: sees the rows with no host wait in between.
    check_cuda(
        cudaMemcpyAsync(from_device.data(), d_rows, n * dim * 4, cudaMemcpyDeviceToHost, stream),
        "copy back");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(px_wait(r, 60000), "px_wait pull " + label);
    check(px_request_free(r), "px_request_free");
    check(px_pull_rows(host, idx.data(), n, from_host.data(), &r), "px_pull_rows " + label);
    check(px_wait(r, 60000), "px_wait host pull");
    check(px_request_free(r), "px_request_free");
    if (from_device != from_host) die("device and host pulls differ at " + label);
    check_cuda(cudaMemcpy(d_rows, grads.data(), n * dim * 4, cudaMemcpyHostToDevice), "upload");
    check_cuda(cudaDeviceSynchronize(), "sync");
    check(px_push_rows_ex(dev, static_cast<const int64_t*>(d_idx), n, d_rows, &o, &r),
          "px_push_rows_ex " + label);
    check(px_wait(r, 60000), "px_wait push " + label);
    check(px_request_free(r), "px_request_free");
    check(px_push_rows(host, idx.data(), n, grads.data(), &r), "px_push_rows " + label);
    check(px_wait(r, 60000), "px_wait host push");
    check(px_request_free(r), "px_request_free");
  }
  // Loads and reads on device memory: rank 0 loads 8 rows into both tables, every worker
  // reads them back from device memory and from the host twin.
  {
    const uint64_t k = 8;
    std::vector<int64_t> ids(k);
    std::vector<float> values(k * dim), from_dev(k * dim), from_twin(k * dim);
    for (uint64_t i = 0; i < k; ++i) ids[i] = static_cast<int64_t>(90 + i);
    for (uint64_t i = 0; i < k * dim; ++i) values[i] = static_cast<float>(i) * 0.25f;
    check_cuda(cudaMemcpy(d_idx, ids.data(), k * 8, cudaMemcpyHostToDevice), "upload ids");
    px_request* r = nullptr;
    if (w.rank == 0) {
      check_cuda(cudaMemcpy(d_rows, values.data(), k * dim * 4, cudaMemcpyHostToDevice), "upload");
      check(px_load_rows_ex(dev, static_cast<const int64_t*>(d_idx), k, d_rows, &o, &r),
            "px_load_rows_ex");
      check(px_wait(r, 60000), "px_wait load");
      check(px_request_free(r), "px_request_free");
      check(px_load_rows(host, ids.data(), k, values.data(), &r), "px_load_rows");
      check(px_wait(r, 60000), "px_wait host load");
      check(px_request_free(r), "px_request_free");
    }
    check(px_barrier(c, 20000), "px_barrier after the loads");
    check(px_read_rows_ex(dev, static_cast<const int64_t*>(d_idx), k, d_rows, &o, &r),
          "px_read_rows_ex");
    check_cuda(
        cudaMemcpyAsync(from_dev.data(), d_rows, k * dim * 4, cudaMemcpyDeviceToHost, stream),
        "copy back");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(px_wait(r, 60000), "px_wait read");
    check(px_request_free(r), "px_request_free");
    check(px_read_rows(host, ids.data(), k, from_twin.data(), &r), "px_read_rows");
    check(px_wait(r, 60000), "px_wait host read");
    check(px_request_free(r), "px_request_free");
    if (from_dev != from_twin || from_dev != values) die("device and host reads differ");
  }
  // Device memory outside px_alloc_ex is not taken for rows (no staging copy for them).
  void* plain = nullptr;
  check_cuda(cudaMalloc(&plain, n * dim * 4), "cudaMalloc");
  px_request* r = nullptr;
  if (px_pull_rows_ex(dev, static_cast<const int64_t*>(d_idx), n, plain, &o, &r) !=
      PX_ERR_NOT_IMPLEMENTED)
    die("rows outside px_alloc_ex were not refused");
  check_cuda(cudaFree(plain), "cudaFree");
  check(px_free(c, d_idx), "px_free indices");
  check(px_free(c, d_rows), "px_free rows");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  check(px_barrier(c, 20000), "px_barrier");
  printf("gpu rows OK: 4 pull and push steps on device memory bitwise the host table's\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: px_gpu_worker alloc | allreduce [COUNT] | rows\n");
    return 2;
  }
  std::string scenario = argv[1];
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    printf("no CUDA device here: %s\n",
           err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    return 77;
  }
  px_client* c = nullptr;
  check(px_connect(nullptr, &c), "px_connect");
  int rc = 2;
  if (scenario == "alloc")
    rc = alloc(c, devices);
  else if (scenario == "rows")
    rc = rows(c);
  else if (scenario == "allreduce")
    rc = allreduce(c, argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 3000);
  else
    fprintf(stderr, "px_gpu_worker: unknown scenario %s\n", scenario.c_str());
  check(px_disconnect(c), "px_disconnect");
  return rc;
}
