// One element of the GPU reduction, as the kernel computes it: compiled by nvcc into the
// kernel (device_reduce.cu) and by the host compiler into its host emulation
// (device_reduce_host.cc), so the unit tests run the kernel's own arithmetic against
// reduce_buffers() on machines without a GPU.
//
// A reduction of nsrc sources runs in passes of at most kSourcesPerPass sources (the
// pointers travel in the kernel's parameters). Between passes each element's running value
// (its carry) waits in memory: in dst when that loses nothing (the element type is the
// accumulator type, or min/max of f16/bf16, whose values are f16/bf16 values exactly), else
// in a scratch array of the accumulator type (f32 for f16/bf16 sums and means, i64 for i32
// means). Sources are combined in order, the accumulator is the host's, and the mean divides
// once at the end: the result is reduce_buffers()'s, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "transport/kernels/cuda/float_rules.h"
#include "transport/kernels/dtype.h"
#include "transport/kernels/half.h"

namespace px::gpu {

// Source pointers one kernel launch carries by value: 32 x 8 bytes of parameters.
constexpr size_t kSourcesPerPass = 32;

struct SourceTable {
  const void* ptr[kSourcesPerPass];
};

// Element <-> accumulator conversions.
template <typename T>
struct Same {
  using Elem = T;
  using Acc = T;
  PX_HOST_DEVICE static Acc widen(Elem v) { return v; }
  PX_HOST_DEVICE static Elem narrow(Acc v) { return v; }
};
struct F16 {
  using Elem = uint16_t;
  using Acc = float;
  PX_HOST_DEVICE static Acc widen(Elem v) { return f16_to_float(v); }
  PX_HOST_DEVICE static Elem narrow(Acc v) { return float_to_f16(v); }
};
struct BF16 {
  using Elem = uint16_t;
  using Acc = float;
  PX_HOST_DEVICE static Acc widen(Elem v) { return bf16_to_float(v); }
  PX_HOST_DEVICE static Elem narrow(Acc v) { return float_to_bf16(v); }
};
// i32 means accumulate in i64, as the host's do.
struct I32Wide {
  using Elem = int32_t;
  using Acc = int64_t;
  PX_HOST_DEVICE static Acc widen(Elem v) { return v; }
  PX_HOST_DEVICE static Elem narrow(Acc v) { return static_cast<Elem>(v); }
};

// Combining steps: reduce.cc's, with host_add for floats (the host's NaN bits).
struct SumOp {
  template <typename T>
  PX_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return host_add(a, b);
    } else {  // integers wrap (two's complement), as reduce.cc's WrapSum
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    }
  }
};
struct ProdOp {
  template <typename T>
  PX_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return host_mul(a, b);
    } else {  // integers wrap, as reduce.cc's WrapProd (unsigned of at least int's width)
      using U =
          std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    }
  }
};
struct MinOp {
  template <typename T>
  PX_HOST_DEVICE static T apply(T a, T b) {
    return a != a ? a : (a < b ? a : b);  // a != a: NaN wins
  }
};
struct MaxOp {
  template <typename T>
  PX_HOST_DEVICE static T apply(T a, T b) {
    return a != a ? a : (a > b ? a : b);
  }
};

// One (dtype, op) of the reduction. kMean divides the total once, at the end.
template <typename Conv, typename Op, bool kMean>
struct ReducePolicy {
  using Elem = typename Conv::Elem;
  using Acc = typename Conv::Acc;
  // Carry in scratch (of Acc) when storing it as Elem would round it.
  static constexpr bool kCarryInScratch =
      !std::is_same_v<Elem, Acc> && !(std::is_same_v<Op, MinOp> || std::is_same_v<Op, MaxOp>);
  using Carry = std::conditional_t<kCarryInScratch, Acc, Elem>;

  PX_HOST_DEVICE static Acc widen(Elem v) { return Conv::widen(v); }
  PX_HOST_DEVICE static Elem narrow(Acc v) { return Conv::narrow(v); }
  PX_HOST_DEVICE static Acc combine(Acc a, Acc b) { return Op::apply(a, b); }
  PX_HOST_DEVICE static Acc finish(Acc acc, unsigned divisor) {
    if constexpr (!kMean) {
      return acc;
    } else if constexpr (std::is_floating_point_v<Acc>) {
      return host_div(acc, static_cast<Acc>(divisor));
    } else {  // integers truncate toward zero
      return static_cast<Acc>(acc / static_cast<Acc>(divisor));
    }
  }
  PX_HOST_DEVICE static Carry to_carry(Acc acc) {
    if constexpr (kCarryInScratch) {
      return acc;
    } else {
      return Conv::narrow(acc);
    }
  }
  PX_HOST_DEVICE static Acc from_carry(Carry c) {
    if constexpr (kCarryInScratch) {
      return c;
    } else {
      return Conv::widen(c);
    }
  }
};

// What one pass does to every element.
struct PassArgs {
  SourceTable src;          // this pass's sources
  unsigned nsrc = 0;        // 1..kSourcesPerPass used in src
  bool from_carry = false;  // start from the carry (a later pass), else from src.ptr[0]
  bool to_carry = false;    // leave the running value in the carry (not the last pass)
  void* carry = nullptr;    // Carry array: dst or scratch (kCarryInScratch)
  void* dst = nullptr;
  unsigned mean_divisor = 1;
};

template <typename P>
PX_HOST_DEVICE inline void reduce_element(const PassArgs& a, size_t i) {
  using Elem = typename P::Elem;
  using Acc = typename P::Acc;
  using Carry = typename P::Carry;
  Acc acc;
  unsigned k = 0;
  if (a.from_carry) {
    acc = P::from_carry(static_cast<const Carry*>(a.carry)[i]);
  } else {
    acc = P::widen(static_cast<const Elem*>(a.src.ptr[0])[i]);
    k = 1;
  }
  for (; k < a.nsrc; ++k)
    acc = P::combine(acc, P::widen(static_cast<const Elem*>(a.src.ptr[k])[i]));
  if (a.to_carry) {
    static_cast<Carry*>(a.carry)[i] = P::to_carry(acc);
  } else {
    static_cast<Elem*>(a.dst)[i] = P::narrow(P::finish(acc, a.mean_divisor));
  }
}

// Calls f.template operator()<Policy>() for the policy of (dtype, op); false if either is
// not a valid value.
template <typename F>
bool visit_reduce_policy(DType dtype, ReduceOp op, F&& f) {
  auto by_op = [&](auto conv, auto wide_mean) -> bool {
    using Conv = decltype(conv);
    using MeanConv = decltype(wide_mean);
    switch (op) {
      case ReduceOp::kSum:
        f.template operator()<ReducePolicy<Conv, SumOp, false>>();
        return true;
      case ReduceOp::kMean:
        f.template operator()<ReducePolicy<MeanConv, SumOp, true>>();
        return true;
      case ReduceOp::kMin:
        f.template operator()<ReducePolicy<Conv, MinOp, false>>();
        return true;
      case ReduceOp::kMax:
        f.template operator()<ReducePolicy<Conv, MaxOp, false>>();
        return true;
      case ReduceOp::kProd:
        f.template operator()<ReducePolicy<Conv, ProdOp, false>>();
        return true;
    }
    return false;
  };
  switch (dtype) {
    case DType::kF32:
      return by_op(Same<float>{}, Same<float>{});
    case DType::kF64:
      return by_op(Same<double>{}, Same<double>{});
    case DType::kF16:
      return by_op(F16{}, F16{});
    case DType::kBF16:
      return by_op(BF16{}, BF16{});
    case DType::kI32:
      return by_op(Same<int32_t>{}, I32Wide{});
    case DType::kI64:
      return by_op(Same<int64_t>{}, Same<int64_t>{});
  }
  return false;
}

}  // namespace px::gpu
