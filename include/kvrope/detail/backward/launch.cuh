// The backward's launch: validates, picks the kernel instance, asks the device what the planner needs
// (cached), launches.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "../../core/dispatch.cuh"
#include "../../core/dtype.cuh"
#include "../../core/status.cuh"
#include "../common/device.cuh"
#include "decode.cuh"
#include "fused/kernel.cuh"
#include "plan.cuh"
#include "policy.cuh"
#include "validate.cuh"

namespace kvrope::detail {

// Plans the call `a` (workspace: BackwardParams::workspace or null) on the current device with
// `policy` (null: the device's own) and launches it unless `plan_only`. `Dims`: the compiled head dims.
// A call with another rotation (RotarySpec::general) takes the general instance of the fused kernel.
// The variant is a template parameter (a.in_place holds the same): a caller of one variant compiles its
// kernel instances only.
template <typename Dims, bool kInPlace, typename T>
Status launch_backward(const ProblemArgs<T>& a, const RotarySpec& rotary, unsigned int* workspace,
                       const LaunchPolicy* policy, cudaStream_t stream, LaunchConfig* config_out, bool plan_only) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  constexpr int kWide = 16 / sizeof(T);
  LaunchConfig config{};
  const int64_t copy_elems = a.in_place ? 0 : 2 * a.batch * a.heads * a.cache_len * a.head_dim;
  if (a.batch == 0 || (a.batch * a.seq_len == 0 && copy_elems == 0)) {
    if (config_out) *config_out = config;
    return {};
  }
  const bool general = rotary.general(a.head_dim);
  const int64_t rotary_dim = effective_rotary_dim(rotary.rotary_dim, a.head_dim);
  const bool vec = vectorizable(a) && rotary_dim % (2 * kWide) == 0;
  BackwardPlan& plan = config.plan;
  int device = 0, major = 0;
  DeviceFacts facts{};
  if (Status s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s) return s;
  if (Status s = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device, &facts.shared_optin); !s) return s;
  if (Status s = device_attribute(cudaDevAttrMultiProcessorCount, device, &facts.sms); !s) return s;
  if (Status s = device_attribute(cudaDevAttrComputeCapabilityMajor, device, &major); !s) return s;
  const LaunchPolicy pol = policy ? *policy : policy_for(major);

  if (!general && takes_decode(a, pol, vec)) {
    using Kernel = void (*)(DecodeArgs<T>);
    const Kernel kernel = kvrope::dispatch_head_dim<Dims>(a.head_dim, [&](auto d) -> Kernel {
      constexpr int kD = decltype(d)::value;
      plan.head_dim_instance = kD > 0 && decode_head_dim_ok<T>(kD) ? kD : 0;
      if constexpr (kD > 0 && decode_head_dim_ok<T>(kD)) return decode_kernel<T, kD>;
      return decode_kernel<T, 0>;
    });
    plan.path = backward_path(true, plan.head_dim_instance);
    const int block = decode_block(a, pol);
    int resident = 0;
    if (Status s = resident_blocks(kernel, device, block, 0, 0, &resident); !s) return s;
    const DecodeArgs<T> args = plan_decode(a, block, facts.sms, resident, config);
    if (config_out) *config_out = config;
    if (plan_only) return {};
    kernel<<<plan.grid, plan.block, plan.shared_bytes, stream>>>(args);
    return cuda_status(cudaGetLastError(), "kernel launch");
  }

  using Kernel = void (*)(FusedArgs<T>);
  Kernel kernel = backward_kernel<T, 0, 1, kInPlace>;
  if (general) {
    kernel = vec ? backward_kernel<T, 0, kWide, kInPlace, true> : backward_kernel<T, 0, 1, kInPlace, true>;
  } else if (vec) {
    plan.head_dim_instance = kvrope::dispatch_head_dim<Dims>(a.head_dim, [&](auto d) {
      kernel = backward_kernel<T, decltype(d)::value, kWide, kInPlace>;
      return decltype(d)::value;
    });
  }
  plan.path = backward_path(vec, plan.head_dim_instance);
  if (major >= 9)
    if (Status s = kernel_has_sm90_code(kernel, device, &facts.sm90_code); !s) return s;
  FusedArgs<T> args = plan_fused_block(a, rotary, pol, facts, vec, config);
  int resident = 0;
  const int allowed_shared = static_cast<int>(std::min<int64_t>(kMaxSharedBytes, facts.shared_optin));
  if (Status s = resident_blocks(kernel, device, plan.block, plan.shared_bytes, allowed_shared, &resident); !s)
    return s;
  plan_fused_grid(args, pol, facts.sms, resident, workspace, config);
  if (config_out) *config_out = config;
  if (plan_only) return {};
  kernel<<<plan.grid, plan.block, plan.shared_bytes, stream>>>(args);
  return cuda_status(cudaGetLastError(), "kernel launch");
}

//! Validates a backward call (either variant), plans it on the current device with `policy` (null: the
//! device's own) and launches it unless `plan_only`.
template <typename Dims, typename Params>
Status run_backward(const Params& params, const LaunchPolicy* policy, cudaStream_t stream, LaunchConfig* config,
                    bool plan_only) {
  if (Status s = validate_backward(params); !s) return s;
  return launch_backward<Dims, kIsInPlace<Params>>(problem_args(params), rotary_spec(params), workspace_of(params),
                                                   policy, stream, config, plan_only);
}

}  // namespace kvrope::detail
