// The append's launch: validates, converts once, picks the path from the shape, asks the device only
// what that path needs (cached), plans, launches.
#pragma once

#include <cuda_runtime_api.h>

#include "../../append_params.cuh"
#include "../../core/dtype.cuh"
#include "../../core/status.cuh"
#include "../common/dependent_launch.cuh"
#include "../common/device.cuh"
#include "kernels.cuh"
#include "plan.cuh"
#include "validate.cuh"

namespace kvrope::detail {

template <typename T, typename C>
Status launch_append(const AppendArgs<T, C>& a, cudaStream_t stream, bool dependent, AppendPlan* plan_out,
                     bool plan_only) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  constexpr int kWide = 16 / sizeof(T);
  const int n = append_chunk(a);
  const AppendPath path = append_path(a, n);
  AppendGeometry g{};
  AppendPlan plan{};
  int sms = 0, resident = 0;
  using Kernel = void (*)(AppendArgs<T, C>, AppendGeometry);
  // Instances by path and chunk, and on the vector paths whether q goes out in fp8; the scalar path
  // decides that at run time. NVFP4 caches: the vector path only (validate), one instance a path that
  // decides fp8 q at run time (a uniform branch a q row). mRoPE: one few-token instance that decides fp8
  // q at run time (the tile path stages composed table rows: its instances serve mRoPE as they are).
  const bool q8 = a.q_out_fp8.data != nullptr;
  const bool mrope = a.mrope.kind != MropeKind::kNone;
  Kernel kernel = nullptr;
  if (path == AppendPath::kToken && mrope) {
    kernel = append_token_kernel<T, C, kWide, true, true>;
  } else if constexpr (kIsNvfp4<C>) {
    kernel = path == AppendPath::kTile ? append_tile_kernel<T, C, kWide, true, true>
                                       : append_token_kernel<T, C, kWide, true, false>;
  } else if (path == AppendPath::kTile) {
    kernel = n != kWide ? append_tile_kernel<T, C, 1, false, true>
             : q8       ? append_tile_kernel<T, C, kWide, true, true>
                        : append_tile_kernel<T, C, kWide, true, false>;
  } else {
    kernel = q8 ? append_token_kernel<T, C, kWide, true, false> : append_token_kernel<T, C, kWide, false, false>;
  }
  if (path == AppendPath::kTile) {
    int device = 0;
    if (Status s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s) return s;
    if (Status s = multiprocessors(device, &sms); !s) return s;
    // The instance may take more than the default 48 KiB of shared memory with rings: its most for any
    // call, one value an instance, allowed on its first query.
    const int most = append_most_shared_bytes(a, n);
    const int allowed = n == kWide ? kAppendSharedBudget + append_ring_bytes<T>(n) : 0;
    if (Status s = resident_blocks(kernel, device, kAppendBlockThreads, most, allowed, &resident); !s) return s;
  }
  plan_append_geometry(a, path, n, sms, resident, g, plan);
  if (plan_out) *plan_out = plan;
  if (plan_only || path == AppendPath::kNone) return {};
  return cuda_status(launch_kernel(kernel, plan.grid, plan.block, plan.shared_bytes, stream, dependent, a, g),
                     "kernel launch");
}

//! Validates an append call, plans it on the current device and launches it unless `plan_only`.
template <typename T, typename C, typename Pos>
Status run_append(const AppendParams<T, C, Pos>& params, cudaStream_t stream, AppendPlan* plan, bool plan_only) {
  if (Status s = validate_append(params); !s) return s;
  return launch_append(append_args(params), stream, params.enable_pdl, plan, plan_only);
}

}  // namespace kvrope::detail
