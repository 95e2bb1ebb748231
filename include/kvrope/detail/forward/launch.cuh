// The forward's launch: validates, picks the kernel instance, asks the device what the planner needs, launches.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "../../core/dtype.cuh"
#include "../../core/status.cuh"
#include "../../forward_params.cuh"
#include "../common/device.cuh"
#include "kernel.cuh"
#include "plan.cuh"
#include "validate.cuh"

namespace kvrope::detail {

template <typename T>
Status launch_forward(ForwardArgs<T> a, cudaStream_t stream, ForwardPlan* plan_out, bool plan_only) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  constexpr int kWide = 16 / sizeof(T);
  ForwardPlan plan{};
  if (a.batch * a.seq_len == 0 || a.heads + a.q_heads == 0) {
    if (plan_out) *plan_out = plan;
    return {};
  }
  const bool vec = forward_vectorizable(a);
  using Kernel = void (*)(ForwardArgs<T>);
  const auto instance = [&](auto n) -> Kernel {
    constexpr int kN = decltype(n)::value;
    if (a.table_cache == nullptr) return forward_kernel<T, kN, TableSource::kPerToken>;
    return a.table_f32 ? forward_kernel<T, kN, TableSource::kCacheF32> : forward_kernel<T, kN, TableSource::kCacheT>;
  };
  const Kernel kernel =
      vec ? instance(std::integral_constant<int, kWide>{}) : instance(std::integral_constant<int, 1>{});
  int device = 0, sms = 0, resident = 0;
  if (Status s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s) return s;
  if (Status s = device_attribute(cudaDevAttrMultiProcessorCount, device, &sms); !s) return s;
  // (The bitmasks take at most 16 KiB, within the default 48 KiB a block.)
  const int mask_bytes = 2 * static_cast<int>(kForwardMaskRows / 8);
  if (Status s = resident_blocks(kernel, device, forward_block_threads(a.seq_len), mask_bytes, 0, &resident); !s)
    return s;
  plan_forward_launch(a, vec ? kWide : 1, sms, resident, plan);
  if (plan_out) *plan_out = plan;
  if (plan_only) return {};
  kernel<<<plan.grid, plan.block, plan.shared_bytes, stream>>>(a);
  return cuda_status(cudaGetLastError(), "kernel launch");
}

//! Validates a forward call, plans it on the current device and launches it unless `plan_only`.
template <typename T, typename Pos>
Status run_forward(const ForwardParams<T, Pos>& params, cudaStream_t stream, ForwardPlan* plan, bool plan_only) {
  if (Status s = validate_forward(params); !s) return s;
  return launch_forward(forward_args(params), stream, plan, plan_only);
}

}  // namespace kvrope::detail
