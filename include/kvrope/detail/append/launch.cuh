// The append's launch: validates, picks the kernel instance, asks the device what the planner needs, launches.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "../../append_params.cuh"
#include "../../core/dtype.cuh"
#include "../../core/status.cuh"
#include "../common/device.cuh"
#include "kernel.cuh"
#include "token_kernel.cuh"
#include "plan.cuh"
#include "validate.cuh"

namespace kvrope::detail {

template <typename T, typename C>
Status launch_append(AppendArgs<T, C> a, cudaStream_t stream, AppendPlan* plan_out, bool plan_only) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  constexpr int kWide = 16 / sizeof(T);
  AppendPlan plan{};
  if (a.tokens == 0 || a.heads + a.q_heads == 0) {
    if (plan_out) *plan_out = plan;
    return {};
  }
  const bool vec = append_vectorizable(a);
  const int n = vec ? kWide : 1;
  const bool single = a.head_dim / (2 * n) <= 32;
  using Kernel = void (*)(AppendArgs<T, C>);
  const Kernel kernel = vec ? (single ? append_kernel<T, C, kWide, true> : append_kernel<T, C, kWide, false>)
                            : (single ? append_kernel<T, C, 1, true> : append_kernel<T, C, 1, false>);
  int device = 0, sms = 0, resident = 0;
  if (Status s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s) return s;
  if (Status s = device_attribute(cudaDevAttrMultiProcessorCount, device, &sms); !s) return s;
  plan_append_launch(a, n, sms, kAppendBlocksPerSm, plan);  // the shape first: the table rows' size
  // With rings, the instance may take more than the default 48 KiB: its most for any call (the staged
  // state's budget and the rings), one value an instance.
  const int allowed = a.ring_bytes > 0 ? kAppendSharedBudget + a.ring_bytes : 0;
  if (Status s = resident_blocks(kernel, device, kAppendBlockThreads, append_most_shared_bytes(a), allowed, &resident);
      !s)
    return s;
  plan_append_launch(a, n, sms, resident, plan);
  if (plan_out) *plan_out = plan;
  if (plan_only) return {};
  if (a.token_warps > 0)
    append_token_kernel<T, C, kWide><<<plan.grid, plan.block, 0, stream>>>(a);
  else
    kernel<<<plan.grid, plan.block, append_shared_bytes(a), stream>>>(a);
  return cuda_status(cudaGetLastError(), "kernel launch");
}

//! Validates an append call, plans it on the current device and launches it unless `plan_only`.
template <typename T, typename C, typename Pos>
Status run_append(const AppendParams<T, C, Pos>& params, cudaStream_t stream, AppendPlan* plan, bool plan_only) {
  if (Status s = validate_append(params); !s) return s;
  return launch_append(append_args(params), stream, plan, plan_only);
}

}  // namespace kvrope::detail
