// The definitions behind append_launchers.cuh, included by append_launchers_<dtype>.cu only, and the
// instances one dtype compiles.
#pragma once

#include "verify/append_launchers.cuh"

namespace kvrope::testing {

template <typename T, typename C, typename Pos>
Status AppendLaunchers<T, C, Pos>::append(const AppendParams<T, C, Pos>& p, cudaStream_t stream) {
  return kv_cache_rope_append(p, stream);
}
template <typename T, typename C, typename Pos>
Status AppendLaunchers<T, C, Pos>::plan(const AppendParams<T, C, Pos>& p, AppendPlan* plan) {
  return plan_append(p, plan);
}

}  // namespace kvrope::testing

//! The launchers of element type T: every cache type (T, fp8 e4m3, fp8 e5m2, NVFP4) and position type.
#define KVROPE_APPEND_LAUNCHERS(T)                                                    \
  template struct kvrope::testing::AppendLaunchers<T, T, int32_t>;                    \
  template struct kvrope::testing::AppendLaunchers<T, T, int64_t>;                    \
  template struct kvrope::testing::AppendLaunchers<T, __nv_fp8_e4m3, int32_t>;        \
  template struct kvrope::testing::AppendLaunchers<T, __nv_fp8_e4m3, int64_t>;        \
  template struct kvrope::testing::AppendLaunchers<T, __nv_fp8_e5m2, int32_t>;        \
  template struct kvrope::testing::AppendLaunchers<T, __nv_fp8_e5m2, int64_t>;        \
  template struct kvrope::testing::AppendLaunchers<T, kvrope::nvfp4_e2m1x2, int32_t>; \
  template struct kvrope::testing::AppendLaunchers<T, kvrope::nvfp4_e2m1x2, int64_t>
