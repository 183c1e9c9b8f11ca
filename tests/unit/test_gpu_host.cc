// The GPU kernels' host side, which runs on any machine: argument checks, launch geometry,
// scratch sizes and layouts, the runtime probe, and the kernels' own per-element code run
// on the host (emulate_device_*) against the host path, bit for bit.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sharding/coalesce.h"
#include "tests/unit/gpu_test_data.h"
#include "transport/kernels/cuda/coalesce_plan.h"
#include "transport/kernels/cuda/device_coalesce.h"
#include "transport/kernels/cuda/device_probe.h"
#include "transport/kernels/cuda/device_reduce.h"
#include "transport/kernels/cuda/launch_geometry.h"
#include "transport/kernels/cuda/reduce_plan.h"

using px::DType;
using px::ReduceOp;
using namespace px::gpu;
using pxt::gpu::Bytes;

namespace {

constexpr size_t kMaxSize = std::numeric_limits<size_t>::max();

DeviceReduceArgs args_for(DType dtype, ReduceOp op, size_t nsrc, size_t count) {
  DeviceReduceArgs a;
  a.dtype = dtype;
  a.op = op;
  a.nsrc = nsrc;
  a.count = count;
  return a;
}

bool refused(const DeviceReduceArgs& a, const std::string& says) {
  ReducePlan plan;
  std::string why;
  bool ok = check_reduce_args(a, &plan, &why);
  INFO(why);
  return !ok && why.find(says) != std::string::npos;
}

}  // namespace

TEST_CASE("host: launch geometry covers n elements with at most kMaxGridBlocks blocks") {
  CHECK(elementwise_geometry(0).blocks == 0);
  CHECK(elementwise_geometry(1).blocks == 1);
  CHECK(elementwise_geometry(1).threads == kBlockThreads);
  CHECK(elementwise_geometry(kBlockThreads).blocks == 1);
  CHECK(elementwise_geometry(kBlockThreads + 1).blocks == 2);
  CHECK(elementwise_geometry(size_t{kBlockThreads} * kMaxGridBlocks).blocks == kMaxGridBlocks);
  CHECK(elementwise_geometry(size_t{kBlockThreads} * kMaxGridBlocks + 1).blocks == kMaxGridBlocks);
  CHECK(elementwise_geometry(kMaxSize).blocks == kMaxGridBlocks);  // no wrap near SIZE_MAX
  CHECK(elementwise_geometry(1000, 0).blocks == 1);
  CHECK(elementwise_geometry(1000, 2).blocks == 2);

  CHECK(segment_geometry(0, 128).blocks == 0);
  CHECK(segment_geometry(10, 0).blocks == 0);
  LaunchGeometry g = segment_geometry(10, 128);
  CHECK(g.blocks == 10);
  CHECK(g.threads == 128);
  CHECK(segment_geometry(10, 1).threads == 32);
  CHECK(segment_geometry(10, 33).threads == 64);
  CHECK(segment_geometry(10, 100000).threads == kBlockThreads);
  CHECK(segment_geometry(kMaxSize, 8).blocks == kMaxGridBlocks);
}

TEST_CASE("host: reduce arguments are checked before anything is launched") {
  std::vector<float> a(16), b(16), c(16);
  const void* srcs[3] = {a.data(), b.data(), c.data()};
  DeviceReduceArgs ok = args_for(DType::kF32, ReduceOp::kSum, 3, 16);
  ok.srcs = srcs;
  std::vector<float> out(16);
  ok.dst = out.data();
  ReducePlan plan;
  std::string why;
  CHECK(check_reduce_args(ok, &plan, &why));
  CHECK(plan.passes == 1);
  CHECK(plan.scratch_bytes == 0);

  DeviceReduceArgs x = ok;
  x.dtype = static_cast<DType>(6);
  CHECK(refused(x, "invalid dtype 6"));
  x = ok;
  x.op = static_cast<ReduceOp>(5);
  CHECK(refused(x, "invalid op 5"));
  x = ok;
  x.nsrc = 0;
  CHECK(refused(x, "0 sources, expected 1..4096"));
  x = ok;
  x.nsrc = kMaxReduceSources + 1;
  CHECK(refused(x, "4097 sources"));
  x = ok;
  x.count = kMaxSize / 4 + 1;
  CHECK(refused(x, "overflow the address space"));
  x = ok;
  x.dtype = DType::kF64;
  x.count = kMaxSize / 8 + 1;
  CHECK(refused(x, "elements of f64 overflow"));
  x = ok;
  x.dst = nullptr;
  CHECK(refused(x, "null destination"));
  x = ok;
  x.srcs = nullptr;
  CHECK(refused(x, "null source array"));
  const void* with_null[3] = {a.data(), nullptr, c.data()};
  x = ok;
  x.srcs = with_null;
  CHECK(refused(x, "source 1 is null"));
  // Overlaps: a later source on dst (even partly), source 0 partly on dst.
  x = ok;
  x.dst = c.data() + 8;
  CHECK(refused(x, "source 2 overlaps the destination"));
  x = ok;
  x.dst = a.data() + 1;
  CHECK(refused(x, "source 0 overlaps the destination without being it"));
  // In place into source 0 is fine; nothing is looked at for count 0.
  x = ok;
  x.dst = a.data();
  CHECK(check_reduce_args(x, &plan, &why));
  DeviceReduceArgs empty = args_for(DType::kF16, ReduceOp::kMean, 5, 0);
  CHECK(check_reduce_args(empty, &plan, &why));
  CHECK(plan.passes == 0);
  // A mean divisor of 0 is 1, as reduce_buffers takes it.
  CHECK(plan.mean_divisor == 1);
}

TEST_CASE("host: reduce scratch is needed only past 32 sources, where a running value rounds") {
  const size_t count = 1000;
  for (uint32_t d = 0; d < px::kDTypeCount; ++d) {
    for (uint32_t o = 0; o < px::kReduceOpCount; ++o) {
      DType dtype = static_cast<DType>(d);
      ReduceOp op = static_cast<ReduceOp>(o);
      CAPTURE(px::dtype_name(dtype));
      CAPTURE(px::reduce_op_name(op));
      bool half = dtype == DType::kF16 || dtype == DType::kBF16;
      // What rounds when a pass's running value is stored as the element type.
      bool sum_like = op == ReduceOp::kSum || op == ReduceOp::kMean || op == ReduceOp::kProd;
      size_t want = 0;
      if (half && sum_like) want = count * 4;  // f32 running sums and products
      if (dtype == DType::kI32 && op == ReduceOp::kMean) want = count * 8;  // i64
      size_t bytes = 1;
      std::string why;
      REQUIRE(reduce_scratch_bytes(args_for(dtype, op, 32, count), &bytes, &why));
      CHECK(bytes == 0);
      REQUIRE(reduce_scratch_bytes(args_for(dtype, op, 33, count), &bytes, &why));
      CHECK(bytes == want);
      REQUIRE(reduce_scratch_bytes(args_for(dtype, op, kMaxReduceSources, count), &bytes, &why));
      CHECK(bytes == want);
    }
  }
  // The scratch's size can overflow where the elements' does not.
  size_t bytes = 0;
  std::string why;
  CHECK_FALSE(
      reduce_scratch_bytes(args_for(DType::kI32, ReduceOp::kMean, 33, kMaxSize / 4), &bytes, &why));
  CHECK(why.find("scratch") != std::string::npos);
  // Missing or short scratch is refused, naming what is needed.
  std::vector<uint16_t> out(10);
  std::vector<std::vector<uint16_t>> in(40, std::vector<uint16_t>(10));
  std::vector<const void*> ptrs;
  for (auto& v : in) ptrs.push_back(v.data());
  DeviceReduceArgs a = args_for(DType::kBF16, ReduceOp::kSum, 40, 10);
  a.srcs = ptrs.data();
  a.dst = out.data();
  CHECK(refused(a, "40 sources of bf16 sum need 40 bytes of scratch, given 0"));
  std::vector<float> scratch(10);
  a.scratch = scratch.data();
  a.scratch_bytes = 39;
  CHECK(refused(a, "given 39"));
  a.scratch_bytes = 40;
  ReducePlan plan;
  CHECK(check_reduce_args(a, &plan, &why));
}

TEST_CASE("host: reduce passes take 32 sources each and carry the running value between them") {
  std::vector<float> out(4), scratch(4);
  std::vector<std::vector<uint16_t>> in(70, std::vector<uint16_t>(4));
  std::vector<const void*> ptrs;
  for (auto& v : in) ptrs.push_back(v.data());
  DeviceReduceArgs a = args_for(DType::kF16, ReduceOp::kMean, 70, 4);
  a.srcs = ptrs.data();
  a.dst = out.data();
  a.scratch = scratch.data();
  a.scratch_bytes = 16;
  a.mean_divisor = 6;
  ReducePlan plan;
  std::string why;
  REQUIRE(check_reduce_args(a, &plan, &why));
  REQUIRE(plan.passes == 3);
  CHECK(plan.carry_in_scratch);
  PassArgs p0 = reduce_pass_args(plan, a, 0), p1 = reduce_pass_args(plan, a, 1),
           p2 = reduce_pass_args(plan, a, 2);
  CHECK(p0.nsrc == 32);
  CHECK(p1.nsrc == 32);
  CHECK(p2.nsrc == 6);
  CHECK(p0.src.ptr[0] == ptrs[0]);
  CHECK(p1.src.ptr[0] == ptrs[32]);
  CHECK(p2.src.ptr[5] == ptrs[69]);
  CHECK(p2.src.ptr[6] == nullptr);
  CHECK((!p0.from_carry && p0.to_carry));
  CHECK((p1.from_carry && p1.to_carry));
  CHECK((p2.from_carry && !p2.to_carry));
  CHECK(p0.carry == scratch.data());
  CHECK(p2.mean_divisor == 6);
  // f16 max loses nothing in f16: its carry is dst itself.
  a.op = ReduceOp::kMax;
  REQUIRE(check_reduce_args(a, &plan, &why));
  CHECK_FALSE(plan.carry_in_scratch);
  CHECK(plan.scratch_bytes == 0);
  CHECK(reduce_pass_args(plan, a, 1).carry == out.data());
}

TEST_CASE("host: the kernel's per-element code matches reduce_buffers bit for bit") {
  // emulate_device_reduce runs the kernel's passes and reduce_element on the host: every
  // dtype x op, 1..4096 sources (several passes past 32), in place or not, with NaN, inf,
  // -0, subnormals and overflowing sums in the inputs.
  std::mt19937_64 rng(17);
  const size_t source_counts[] = {1, 2, 3, 7, 32, 33, 64, 65, 100};
  for (uint32_t d = 0; d < px::kDTypeCount; ++d) {
    for (uint32_t o = 0; o < px::kReduceOpCount; ++o) {
      for (size_t nsrc : source_counts) {
        for (size_t count : {size_t{1}, size_t{1000}}) {
          for (bool in_place : {false, true}) {
            for (unsigned divisor : {0u, 6u}) {
              DType dtype = static_cast<DType>(d);
              ReduceOp op = static_cast<ReduceOp>(o);
              CAPTURE(px::dtype_name(dtype));
              CAPTURE(px::reduce_op_name(op));
              CAPTURE(nsrc);
              CAPTURE(count);
              CAPTURE(in_place);
              CAPTURE(divisor);
              std::vector<Bytes> srcs = pxt::gpu::make_sources(dtype, nsrc, count, rng);
              unsigned div = divisor == 0 ? 0 : static_cast<unsigned>(nsrc) * divisor;
              Bytes want = pxt::gpu::host_reduce(dtype, op, srcs, count, div, in_place);
              std::vector<Bytes> copy = srcs;
              std::vector<const void*> ptrs;
              for (Bytes& s : copy) ptrs.push_back(s.data());
              Bytes out(count * px::dtype_size(dtype));
              DeviceReduceArgs a = args_for(dtype, op, nsrc, count);
              a.srcs = ptrs.data();
              a.dst = in_place ? copy[0].data() : out.data();
              a.mean_divisor = div;
              size_t scratch_bytes = 0;
              std::string why;
              REQUIRE(reduce_scratch_bytes(a, &scratch_bytes, &why));
              std::vector<uint64_t> scratch(scratch_bytes / 8 + 1);
              a.scratch = scratch.data();
              a.scratch_bytes = scratch_bytes;
              REQUIRE(emulate_device_reduce(a, &why));
              const Bytes& got = in_place ? copy[0] : out;
              CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("host: the kernel's passes over 4096 sources match reduce_buffers bit for bit") {
  std::mt19937_64 rng(4096);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin}) {
      CAPTURE(px::dtype_name(dtype));
      CAPTURE(px::reduce_op_name(op));
      const size_t count = 64;
      std::vector<Bytes> srcs = pxt::gpu::make_sources(dtype, kMaxReduceSources, count, rng);
      Bytes want = pxt::gpu::host_reduce(dtype, op, srcs, count, 4096, false);
      std::vector<const void*> ptrs;
      for (Bytes& s : srcs) ptrs.push_back(s.data());
      Bytes out(count * px::dtype_size(dtype));
      std::vector<uint64_t> scratch(count);
      DeviceReduceArgs a = args_for(dtype, op, kMaxReduceSources, count);
      a.srcs = ptrs.data();
      a.dst = out.data();
      a.mean_divisor = 4096;
      a.scratch = scratch.data();
      a.scratch_bytes = scratch.size() * 8;
      std::string why;
      REQUIRE(emulate_device_reduce(a, &why));
      CHECK(std::memcmp(out.data(), want.data(), want.size()) == 0);
    }
  }
}

TEST_CASE("host: coalesce checks, sort bits and scratch layout") {
  CoalescePlan plan;
  std::string why;
  CHECK(plan_coalesce(8192, 128, 100000, &plan, &why));
  CHECK(plan.end_bit == 17);
  CHECK(plan.entries.blocks == 32);
  CHECK(plan.segments.blocks == kMaxGridBlocks);
  CHECK(plan.segments.threads == 128);
  CHECK_FALSE(plan_coalesce(kMaxCoalesceEntries + 1, 4, 0, &plan, &why));
  CHECK(why.find("at most 2147483647") != std::string::npos);
  CHECK_FALSE(plan_coalesce(10, 0, 0, &plan, &why));
  CHECK(why.find("0 columns") != std::string::npos);
  CHECK_FALSE(plan_coalesce(1 << 30, kMaxSize / 4, 0, &plan, &why));
  CHECK(why.find("overflow") != std::string::npos);
  CHECK(plan_coalesce(0, 4, 0, &plan, &why));

  CHECK(coalesce_sort_bits(0) == 64);
  CHECK(coalesce_sort_bits(1) == 1);
  CHECK(coalesce_sort_bits(2) == 1);
  CHECK(coalesce_sort_bits(3) == 2);
  CHECK(coalesce_sort_bits(1024) == 10);
  CHECK(coalesce_sort_bits(1025) == 11);
  CHECK(coalesce_sort_bits(uint64_t{1} << 63) == 63);
  CHECK(coalesce_sort_bits(std::numeric_limits<uint64_t>::max()) == 64);

  DeviceCoalesceArgs a;
  a.n = 4;
  a.dim = 2;
  CHECK_FALSE(check_coalesce_args(a, &plan, &why));
  CHECK(why.find("out_unique") != std::string::npos);
  int64_t unique = 0;
  a.out_unique = &unique;
  CHECK_FALSE(check_coalesce_args(a, &plan, &why));
  CHECK(why.find("null indices") != std::string::npos);

  for (size_t n : {size_t{1}, size_t{3}, size_t{8192}, kMaxCoalesceEntries}) {
    CAPTURE(n);
    CoalesceLayout l;
    REQUIRE(coalesce_layout(n, 12345, &l, &why));
    size_t starts[] = {l.sorted_keys, l.positions, l.sorted_positions, l.counts,
                       l.offsets,     l.num_runs,  l.first_bad,        l.cub_temp};
    size_t sizes[] = {n * 8, n * 4, n * 4, n * 4, n * 4, 8, 8, 12345};
    for (size_t i = 0; i < 8; ++i) {
      CHECK(starts[i] % kScratchAlign == 0);
      if (i > 0) CHECK(starts[i] >= starts[i - 1] + sizes[i - 1]);  // in order, no overlap
    }
    CHECK(l.total == l.cub_temp + 12345);
  }
  CoalesceLayout l;
  CHECK_FALSE(coalesce_layout(100, kMaxSize - 1000, &l, &why));
  CHECK(why.find("overflows") != std::string::npos);
}

TEST_CASE("host: the coalescing's semantics match sharding's coalesce bit for bit") {
  // emulate_device_coalesce: a stable sort by index (CUB's radix sort is stable) and the
  // kernel's own segment_sum_column, against coalesce() of the same push.
  for (uint64_t row_limit : {uint64_t{0}, uint64_t{100000}}) {
    CAPTURE(row_limit);
    pxt::gpu::Push p = pxt::gpu::zipf_push(8192, 128, 100000, 1.1, 5);
    p.grads[3 * 128 + 5] = std::numeric_limits<float>::quiet_NaN();
    p.grads[9 * 128 + 7] = std::numeric_limits<float>::infinity();
    px::CoalescedRows want;
    px::coalesce({{p.indices.data(), p.indices.size(), p.grads.data()}}, p.dim, false, &want);
    REQUIRE(want.rows.size() < p.indices.size() / 2);  // the skew gives many duplicates
    std::vector<int64_t> rows(p.indices.size());
    std::vector<float> values(p.grads.size());
    int64_t unique = -1, first_bad = 7;
    DeviceCoalesceArgs a;
    a.indices = p.indices.data();
    a.grads = p.grads.data();
    a.n = p.indices.size();
    a.dim = p.dim;
    a.row_limit = row_limit;
    a.out_indices = rows.data();
    a.out_grads = values.data();
    a.out_unique = &unique;
    a.out_first_bad = &first_bad;
    std::string why;
    REQUIRE(emulate_device_coalesce(a, &why));
    CHECK(first_bad == -1);
    REQUIRE(unique == static_cast<int64_t>(want.rows.size()));
    rows.resize(want.rows.size());
    values.resize(want.values.size());
    CHECK(rows == want.rows);
    CHECK(std::memcmp(values.data(), want.values.data(), values.size() * 4) == 0);
  }
}

TEST_CASE(
    "host: coalescing each worker's push, then the node's, equals the node's coalescing "
    "when later workers hold each index once") {
  // What device_coalesce.h says of per-worker device coalescing followed by the host's.
  pxt::gpu::Push w0 = pxt::gpu::zipf_push(2048, 16, 5000, 1.1, 1);
  std::vector<int64_t> once(1000);
  std::vector<float> once_grads(1000 * 16);
  for (size_t i = 0; i < once.size(); ++i) once[i] = static_cast<int64_t>(i * 5);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g;
  for (float& v : once_grads) v = g(rng);
  std::vector<px::RowBatch> raw = {{w0.indices.data(), w0.indices.size(), w0.grads.data()},
                                   {once.data(), once.size(), once_grads.data()}};
  px::CoalescedRows whole;
  px::coalesce(raw, 16, false, &whole);
  px::CoalescedRows first;
  px::coalesce({raw[0]}, 16, false, &first);
  px::CoalescedRows of_parts;
  px::coalesce({{first.rows.data(), first.rows.size(), first.values.data()}, raw[1]}, 16, false,
               &of_parts);
  CHECK(of_parts.rows == whole.rows);
  CHECK(std::memcmp(of_parts.values.data(), whole.values.data(), whole.values.size() * 4) == 0);
}

TEST_CASE("host: a bad index empties the coalescing and names its position") {
  std::vector<int64_t> idx = {3, 1, 3, 10, -1, 2};
  std::vector<float> grads(idx.size() * 2, 1.0f), out(idx.size() * 2);
  std::vector<int64_t> rows(idx.size());
  int64_t unique = -1, first_bad = -2;
  DeviceCoalesceArgs a;
  a.indices = idx.data();
  a.grads = grads.data();
  a.n = idx.size();
  a.dim = 2;
  a.row_limit = 10;
  a.out_indices = rows.data();
  a.out_grads = out.data();
  a.out_unique = &unique;
  a.out_first_bad = &first_bad;
  std::string why;
  REQUIRE(emulate_device_coalesce(a, &why));
  CHECK(unique == 0);
  CHECK(first_bad == 3);
  a.row_limit = 11;
  REQUIRE(emulate_device_coalesce(a, &why));
  CHECK(first_bad == 4);  // -1
  idx[4] = 0;
  REQUIRE(emulate_device_coalesce(a, &why));
  CHECK(first_bad == -1);
  CHECK(unique == 5);
  CHECK(std::vector<int64_t>(rows.begin(), rows.begin() + 5) ==
        std::vector<int64_t>{0, 1, 2, 3, 10});
  CHECK(out[3 * 2] == 2.0f);  // row 3, twice
}

TEST_CASE("host: the runtime probe says why there is no device, and what NCCL is") {
  std::string why;
  int devices = cuda_device_count(&why);
  CHECK(devices >= 0);
  if (devices == 0) {
    MESSAGE("no CUDA device: " << why);
    CHECK_FALSE(why.empty());
    if (built_with_cuda())
      CHECK(why.find("cudaGetDeviceCount") == 0);
    else
      CHECK(why.find("built without CUDA") != std::string::npos);
  } else {
    MESSAGE(devices << " CUDA device(s)");
  }
  std::string nccl_why;
  std::string nccl = nccl_version(&nccl_why);
  if (nccl.empty()) {
    MESSAGE("NCCL: " << nccl_why);
    CHECK_FALSE(nccl_why.empty());
  } else {
    MESSAGE("NCCL " << nccl);
    CHECK(nccl.find('.') != std::string::npos);
    CHECK(nccl[0] >= '2');
  }
}

TEST_CASE("host: without a device, device calls fail with a reason and enqueue nothing") {
  std::string why;
  if (cuda_device_count(&why) > 0) {
    MESSAGE("a CUDA device is present: the device tests cover these calls");
    return;
  }
  // Invalid arguments are refused first, with their own reason.
  DeviceReduceArgs bad = args_for(DType::kF32, ReduceOp::kSum, 0, 4);
  CHECK_FALSE(device_reduce(bad, &why));
  CHECK(why.find("0 sources") != std::string::npos);
  // Valid ones fail at the launch (pointers are never dereferenced on the host).
  std::vector<float> a(4), b(4), out(4);
  const void* srcs[2] = {a.data(), b.data()};
  DeviceReduceArgs ok = args_for(DType::kF32, ReduceOp::kSum, 2, 4);
  ok.srcs = srcs;
  ok.dst = out.data();
  why.clear();
  CHECK_FALSE(device_reduce(ok, &why));
  MESSAGE("device_reduce: " << why);
  CHECK(why.find("gpu reduce") == 0);
  size_t bytes = 0;
  why.clear();
  CHECK_FALSE(device_coalesce_scratch_bytes(8192, 100000, &bytes, &why));
  MESSAGE("device_coalesce_scratch_bytes: " << why);
  CHECK(why.find("gpu coalesce") == 0);
}
