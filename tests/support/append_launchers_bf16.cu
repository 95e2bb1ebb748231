// The tests' and the benchmark's append launchers for __nv_bfloat16 (append_launchers.cuh).
#include "support/append_launchers.cuh"

namespace kvrope::testing {

template <typename T, typename C, typename Pos>
Status AppendLaunchers<T, C, Pos>::append(const AppendParams<T, C, Pos>& p, cudaStream_t stream) {
  return kv_cache_rope_append(p, stream);
}
template <typename T, typename C, typename Pos>
Status AppendLaunchers<T, C, Pos>::plan(const AppendParams<T, C, Pos>& p, AppendPlan* plan) {
  return plan_append(p, plan);
}

template struct AppendLaunchers<__nv_bfloat16, __nv_bfloat16, int32_t>;
template struct AppendLaunchers<__nv_bfloat16, __nv_bfloat16, int64_t>;
template struct AppendLaunchers<__nv_bfloat16, __nv_fp8_e4m3, int32_t>;
template struct AppendLaunchers<__nv_bfloat16, __nv_fp8_e4m3, int64_t>;
template struct AppendLaunchers<__nv_bfloat16, __nv_fp8_e5m2, int32_t>;
template struct AppendLaunchers<__nv_bfloat16, __nv_fp8_e5m2, int64_t>;

}  // namespace kvrope::testing
