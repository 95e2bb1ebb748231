// The append launchers the GPU tests and the benchmark call, compiled once a dtype
// (verify/append_launchers_<dtype>.cu, in the kvrope_launchers library): this header only declares them.
#pragma once

#include <kvrope/append.cuh>

namespace kvrope::testing {

//! kv_cache_rope_append and plan_append for element type T, cache type C (T, __nv_fp8_e4m3, __nv_fp8_e5m2
//! or nvfp4_e2m1x2) and position type Pos.
template <typename T, typename C, typename Pos>
struct AppendLaunchers {
  static Status append(const AppendParams<T, C, Pos>& p, cudaStream_t stream);
  static Status plan(const AppendParams<T, C, Pos>& p, AppendPlan* plan);
};

}  // namespace kvrope::testing
