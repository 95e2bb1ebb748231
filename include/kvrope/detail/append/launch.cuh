// The append's launch: validates, converts once, picks the path from the shape, asks the device only
// what that path needs (cached), plans, launches.
#pragma once

#include <cuda_runtime_api.h>

#include "../../append_params.cuh"
#include "../../core/dtype.cuh"
#include "../../core/status.cuh"
#include "../common/device.cuh"
#include "kernels.cuh"
#include "plan.cuh"
#include "validate.cuh"

namespace kvrope::detail {

//! The kernel of `path` for chunks of N elements, one unit a lane or looping (kSingle).
template <typename T, typename C, int N, bool kSingle>
auto append_kernel(AppendPath path) {
  return path == AppendPath::kToken ? append_token_kernel<T, C, N, kSingle> : append_tile_kernel<T, C, N, kSingle>;
}

template <typename T, typename C>
Status launch_append(const AppendArgs<T, C>& a, cudaStream_t stream, AppendPlan* plan_out, bool plan_only) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  constexpr int kWide = 16 / sizeof(T);
  const AppendPath path = append_path(a.tokens, a.q_heads + 2 * a.heads);
  AppendGeometry g{};
  AppendPlan plan{};
  if (path == AppendPath::kNone) {
    if (plan_out) *plan_out = plan;
    return {};
  }
  // 16-byte chunks when every row allows them and a lane holds one unit (D <= 32 x 2 N); rows of more
  // units loop over them a lane, an element pair at a time (no wide looping instance: such D are rare).
  const bool wide = append_vectorizable(a) && a.head_dim / (2 * kWide) <= 32;
  const int n = wide ? kWide : 1;
  const bool single = a.head_dim / (2 * n) <= 32;
  using Kernel = void (*)(AppendArgs<T, C>, AppendGeometry);
  const Kernel kernel = wide     ? append_kernel<T, C, kWide, true>(path)
                        : single ? append_kernel<T, C, 1, true>(path)
                                 : append_kernel<T, C, 1, false>(path);
  int sms = 0, resident = 0;
  if (path == AppendPath::kTile) {
    int device = 0;
    if (Status s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s) return s;
    if (Status s = multiprocessors(device, &sms); !s) return s;
    const int most_shared = append_tile_shared_bytes(kAppendTileMaxTokens, true);
    if (Status s = resident_blocks(kernel, device, kAppendBlockThreads, most_shared, 0, &resident); !s) return s;
  }
  plan_append_geometry(a, path, n, sms, resident, g, plan);
  if (plan_out) *plan_out = plan;
  if (plan_only) return {};
  kernel<<<plan.grid, plan.block, plan.shared_bytes, stream>>>(a, g);
  return cuda_status(cudaGetLastError(), "kernel launch");
}

//! Validates an append call, plans it on the current device and launches it unless `plan_only`.
template <typename T, typename C, typename Pos>
Status run_append(const AppendParams<T, C, Pos>& params, cudaStream_t stream, AppendPlan* plan, bool plan_only) {
  if (Status s = validate_append(params); !s) return s;
  return launch_append(append_args(params), stream, plan, plan_only);
}

}  // namespace kvrope::detail
