// The definitions behind launchers.cuh, included by launchers_<dtype>.cu only.
#pragma once

#include "verify/launchers.cuh"

namespace kvrope::testing {

template <typename T, typename Pos>
Status Launchers<T, Pos>::backward(const Out& p, cudaStream_t stream) {
  return kv_cache_rope_backward(p, stream);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::backward(const In& p, cudaStream_t stream) {
  return kv_cache_rope_backward(p, stream);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::backward(const Out& p, const Policy& policy, cudaStream_t stream) {
  return experimental::kv_cache_rope_backward(p, policy, stream);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::backward(const In& p, const Policy& policy, cudaStream_t stream) {
  return experimental::kv_cache_rope_backward(p, policy, stream);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::plan(const Out& p, BackwardPlan* plan) {
  return plan_backward(p, plan);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::plan(const In& p, BackwardPlan* plan) {
  return plan_backward(p, plan);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::plan(const Out& p, const Policy* policy, Config* config) {
  return experimental::plan_backward(p, policy, config);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::plan(const In& p, const Policy* policy, Config* config) {
  return experimental::plan_backward(p, policy, config);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::forward(const ForwardParams<T, Pos>& p, cudaStream_t stream) {
  return kv_cache_rope_forward(p, stream);
}
template <typename T, typename Pos>
Status Launchers<T, Pos>::plan(const ForwardParams<T, Pos>& p, ForwardPlan* plan) {
  return plan_forward(p, plan);
}

}  // namespace kvrope::testing
