// Run-time head dim -> compile-time instance: one function template, one dispatch site per launcher.
#pragma once

#include <cstdint>
#include <type_traits>

namespace kvrope {

//! A set of head dims to compile kernel instances for. A launcher instantiated with a smaller set
//! compiles faster; every other positive even head dim still runs, on the generic instance.
template <int... kDims>
struct HeadDims {
  static_assert(((kDims > 0 && kDims % 2 == 0) && ...), "kvrope: compiled head dims must be positive and even");
};

//! The head dims the launchers compile by default (docs/spec.md §3).
using CompiledHeadDims = HeadDims<64, 80, 96, 128, 256>;

namespace detail {
template <typename F, int kFirst, int... kRest>
decltype(auto) dispatch_head_dim_in(int64_t head_dim, F&& f) {
  if (head_dim == kFirst) return f(std::integral_constant<int, kFirst>{});
  if constexpr (sizeof...(kRest) > 0) {
    return dispatch_head_dim_in<F, kRest...>(head_dim, static_cast<F&&>(f));
  } else {
    return f(std::integral_constant<int, 0>{});
  }
}
template <typename F, int... kDims>
decltype(auto) dispatch_head_dim_over(int64_t head_dim, F&& f, HeadDims<kDims...>) {
  if constexpr (sizeof...(kDims) > 0) {
    return dispatch_head_dim_in<F, kDims...>(head_dim, static_cast<F&&>(f));
  } else {
    return f(std::integral_constant<int, 0>{});
  }
}
}  // namespace detail

//! Calls f(std::integral_constant<int, D>) when head_dim is D of `Dims`, else
//! f(std::integral_constant<int, 0>) (the generic instance, D read at run time).
template <typename Dims = CompiledHeadDims, typename F>
decltype(auto) dispatch_head_dim(int64_t head_dim, F&& f) {
  return detail::dispatch_head_dim_over(head_dim, static_cast<F&&>(f), Dims{});
}

}  // namespace kvrope
