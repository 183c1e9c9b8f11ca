// Coalescing on the GPU: check the indices (with a row limit), sort (index, position) pairs
// with CUB's stable radix sort on the index bits that matter, run-length encode the sorted
// indices (the unique ones go straight to the output), scan the run lengths into run
// starts, then sum each run's rows (a block a run, its threads over the columns), all on the
// caller's stream with no host synchronisation: the run count stays on the device.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "transport/kernels/cuda/coalesce_plan.h"
#include "transport/kernels/cuda/cuda_error.h"
#include "transport/kernels/cuda/device_coalesce.h"
#include "transport/kernels/cuda/segment_sum.h"

namespace px::gpu {
namespace {

using ull = unsigned long long;

__global__ void iota_kernel(uint32_t* positions, size_t n) {
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    positions[i] = static_cast<uint32_t>(i);
}

// The first position holding an index outside [0, limit) (negative ones wrap above it).
__global__ void check_kernel(const int64_t* indices, size_t n, uint64_t limit, ull* first_bad) {
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (static_cast<uint64_t>(indices[i]) >= limit) atomicMin(first_bad, static_cast<ull>(i));
}

__global__ void segment_sum_kernel(const int64_t* num_runs, const uint32_t* offsets,
                                   const uint32_t* counts, const uint32_t* positions,
                                   const float* grads, size_t dim, float* out) {
  int64_t runs = *num_runs;
  for (int64_t s = blockIdx.x; s < runs; s += gridDim.x) {
    const uint32_t* run = positions + offsets[s];
    uint32_t len = counts[s];
    for (size_t c = threadIdx.x; c < dim; c += blockDim.x)
      out[static_cast<size_t>(s) * dim + c] = segment_sum_column(run, len, grads, dim, c);
  }
}

__global__ void finish_kernel(const int64_t* num_runs, const ull* first_bad, int64_t* out_unique,
                              int64_t* out_first_bad) {
  bool bad = *first_bad != ~0ull;
  *out_unique = bad ? 0 : *num_runs;
  if (out_first_bad) *out_first_bad = bad ? static_cast<int64_t>(*first_bad) : -1;
}

// The largest temporary storage the three CUB steps need for n entries.
cudaError_t cub_temp_bytes(size_t n, int end_bit, cudaStream_t stream, size_t* bytes) {
  int items = static_cast<int>(n);
  size_t sort = 0, rle = 0, scan = 0;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, sort, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), items, 0, end_bit,
      stream);
  if (err != cudaSuccess) return err;
  err = cub::DeviceRunLengthEncode::Encode(
      nullptr, rle, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<uint32_t*>(nullptr), static_cast<int64_t*>(nullptr), items, stream);
  if (err != cudaSuccess) return err;
  err = cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const uint32_t*>(nullptr),
                                      static_cast<uint32_t*>(nullptr), items, stream);
  if (err != cudaSuccess) return err;
  *bytes = std::max(sort, std::max(rle, scan));
  return cudaSuccess;
}

bool layout_for(size_t n, uint64_t row_limit, cudaStream_t stream, CoalesceLayout* layout,
                std::string* why) {
  size_t temp = 0;
  cudaError_t err = cub_temp_bytes(n, coalesce_sort_bits(row_limit), stream, &temp);
  if (err != cudaSuccess) return cuda_failed(why, "gpu coalesce: CUB's scratch size", err);
  return coalesce_layout(n, temp, layout, why);
}

}  // namespace

bool device_coalesce_scratch_bytes(size_t n, uint64_t row_limit, size_t* bytes, std::string* why) {
  CoalescePlan plan;
  if (!plan_coalesce(n, 1, row_limit, &plan, why)) return false;
  if (n == 0) {
    *bytes = 0;
    return true;
  }
  CoalesceLayout layout;
  if (!layout_for(n, row_limit, nullptr, &layout, why)) return false;
  *bytes = layout.total;
  return true;
}

bool device_coalesce(const DeviceCoalesceArgs& a, std::string* why) {
  CoalescePlan plan;
  if (!check_coalesce_args(a, &plan, why)) return false;
  auto stream = static_cast<cudaStream_t>(a.stream);
  cudaError_t err;
  if (a.n == 0) {
    if ((err = cudaMemsetAsync(a.out_unique, 0, sizeof(int64_t), stream)) != cudaSuccess ||
        (a.out_first_bad &&
         (err = cudaMemsetAsync(a.out_first_bad, 0xff, sizeof(int64_t), stream)) != cudaSuccess))
      return cuda_failed(why, "gpu coalesce: memset", err);
    return true;
  }
  CoalesceLayout l;
  if (!layout_for(a.n, a.row_limit, stream, &l, why)) return false;
  if (!a.scratch || a.scratch_bytes < l.total) {
    if (why)
      *why = "gpu coalesce: " + std::to_string(a.n) + " entries need " + std::to_string(l.total) +
             " bytes of scratch, given " + std::to_string(a.scratch ? a.scratch_bytes : 0);
    return false;
  }
  char* base = static_cast<char*>(a.scratch);
  auto* sorted_keys = reinterpret_cast<int64_t*>(base + l.sorted_keys);
  auto* positions = reinterpret_cast<uint32_t*>(base + l.positions);
  auto* sorted_positions = reinterpret_cast<uint32_t*>(base + l.sorted_positions);
  auto* counts = reinterpret_cast<uint32_t*>(base + l.counts);
  auto* offsets = reinterpret_cast<uint32_t*>(base + l.offsets);
  auto* num_runs = reinterpret_cast<int64_t*>(base + l.num_runs);
  auto* first_bad = reinterpret_cast<ull*>(base + l.first_bad);
  void* temp = base + l.cub_temp;
  size_t temp_bytes = l.total - l.cub_temp;
  int items = static_cast<int>(a.n);
  const LaunchGeometry& e = plan.entries;

  if ((err = cudaMemsetAsync(first_bad, 0xff, sizeof(ull), stream)) != cudaSuccess ||
      (err = cudaMemsetAsync(counts, 0, a.n * sizeof(uint32_t), stream)) != cudaSuccess)
    return cuda_failed(why, "gpu coalesce: memset", err);
  if (a.row_limit > 0) {
    check_kernel<<<e.blocks, e.threads, 0, stream>>>(a.indices, a.n, a.row_limit, first_bad);
    if ((err = cudaGetLastError()) != cudaSuccess)
      return cuda_failed(why, "gpu coalesce: index check", err);
  }
  iota_kernel<<<e.blocks, e.threads, 0, stream>>>(positions, a.n);
  if ((err = cudaGetLastError()) != cudaSuccess)
    return cuda_failed(why, "gpu coalesce: positions", err);
  if ((err = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, a.indices, sorted_keys, positions,
                                             sorted_positions, items, 0, plan.end_bit, stream)) !=
      cudaSuccess)
    return cuda_failed(why, "gpu coalesce: sort", err);
  if ((err = cub::DeviceRunLengthEncode::Encode(temp, temp_bytes, sorted_keys, a.out_indices,
                                                counts, num_runs, items, stream)) != cudaSuccess)
    return cuda_failed(why, "gpu coalesce: run-length encoding", err);
  if ((err = cub::DeviceScan::ExclusiveSum(temp, temp_bytes, counts, offsets, items, stream)) !=
      cudaSuccess)
    return cuda_failed(why, "gpu coalesce: scan", err);
  const LaunchGeometry& s = plan.segments;
  segment_sum_kernel<<<s.blocks, s.threads, 0, stream>>>(
      num_runs, offsets, counts, sorted_positions, a.grads, a.dim, a.out_grads);
  if ((err = cudaGetLastError()) != cudaSuccess)
    return cuda_failed(why, "gpu coalesce: segment sum", err);
  finish_kernel<<<1, 1, 0, stream>>>(num_runs, first_bad, a.out_unique, a.out_first_bad);
  if ((err = cudaGetLastError()) != cudaSuccess)
    return cuda_failed(why, "gpu coalesce: finish", err);
  return true;
}

}  // namespace px::gpu
