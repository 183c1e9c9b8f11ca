// Element types and reduce operations shared by the client library, the daemon and the
// collectives. Values match px_dtype / px_reduce_op in include/parallax_c.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace px {

enum class DType : uint32_t { kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3, kI32 = 4, kI64 = 5 };
enum class ReduceOp : uint32_t { kSum = 0, kMean = 1, kMin = 2, kMax = 3, kProd = 4 };

constexpr uint32_t kDTypeCount = 6;
constexpr uint32_t kReduceOpCount = 5;

inline bool valid_dtype(uint32_t v) {
  return v < kDTypeCount;
}
inline bool valid_reduce_op(uint32_t v) {
  return v < kReduceOpCount;
}

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  static const char* const names[] = {"f32", "f64", "f16", "bf16", "i32", "i64"};
  return static_cast<uint32_t>(t) < kDTypeCount ? names[static_cast<uint32_t>(t)] : "?";
}

inline const char* reduce_op_name(ReduceOp op) {
  static const char* const names[] = {"sum", "mean", "min", "max", "prod"};
  return static_cast<uint32_t>(op) < kReduceOpCount ? names[static_cast<uint32_t>(op)] : "?";
}

}  // namespace px
