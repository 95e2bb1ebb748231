// A test and benchmark hook, not part of the installed library: the backward launched with a launch
// policy of the caller's (tuning studies, tests of paths the device's own policy does not take).
#pragma once

#include <kvrope/backward.cuh>
#include <kvrope/detail/backward/launch.cuh>
#include <kvrope/detail/backward/plan.cuh>
#include <kvrope/detail/backward/policy.cuh>

namespace kvrope::experimental {

//! The launch values the planner sizes a call with (detail/backward/policy.cuh documents each).
using LaunchPolicy = detail::LaunchPolicy;
//! A launch in full: the public plan and the kernel's inner choices.
using LaunchConfig = detail::LaunchConfig;

//! The policy the library uses on a device of compute capability cc_major.x.
constexpr LaunchPolicy default_policy(int cc_major) { return detail::policy_for(cc_major); }

//! kv_cache_rope_backward with `policy` instead of the device's own.
template <typename Dims = CompiledHeadDims, typename Params>
Status kv_cache_rope_backward(const Params& params, const LaunchPolicy& policy, cudaStream_t stream = nullptr) {
  return detail::run_backward<Dims>(params, &policy, stream, nullptr, false);
}

//! The launch kv_cache_rope_backward(params, policy) would make (policy null: the device's own).
template <typename Dims = CompiledHeadDims, typename Params>
Status plan_backward(const Params& params, const LaunchPolicy* policy, LaunchConfig* config) {
  return detail::run_backward<Dims>(params, policy, nullptr, config, true);
}

}  // namespace kvrope::experimental
