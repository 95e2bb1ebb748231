// The MLA append's launch: validates, converts once, picks the instance from the shape, plans, launches. Nothing
// asked of the device.
#pragma once

#include <cuda_runtime_api.h>

#include "../../core/dtype.cuh"
#include "../../core/status.cuh"
#include "../../mla_append_params.cuh"
#include "../common/dependent_launch.cuh"
#include "kernel.cuh"
#include "plan.cuh"
#include "validate.cuh"

namespace kvrope::detail {

template <typename T, typename C>
Status launch_mla(const MlaArgs<T, C>& a, cudaStream_t stream, bool dependent, MlaPlan* plan_out, bool plan_only) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  constexpr int kWide = 16 / sizeof(T);
  const int n = mla_chunk(a);
  MlaGeometry g{};
  MlaPlan plan{};
  plan_mla_geometry(a, n, g, plan);
  if (plan_out) *plan_out = plan;
  if (plan_only || !plan.launched) return {};
  // Three instances a (T, C): the vector path with L = 512, R = 64 compiled in, the vector path for any sizes,
  // the scalar path (unaligned rows, odd sizes).
  using Kernel = void (*)(MlaArgs<T, C>, MlaGeometry);
  const Kernel kernel = n != kWide        ? mla_append_kernel<T, C, 1, 0, 0>
                        : plan.fixed_dims ? mla_append_kernel<T, C, kWide, kMlaFixedLatentDim, kMlaFixedRotaryDim>
                                          : mla_append_kernel<T, C, kWide, 0, 0>;
  return cuda_status(launch_kernel(kernel, plan.grid, plan.block, 0, stream, dependent, a, g), "kernel launch");
}

//! Validates an MLA append call, plans it and launches it unless `plan_only`.
template <typename T, typename C, typename Pos>
Status run_mla(const MlaAppendParams<T, C, Pos>& params, cudaStream_t stream, MlaPlan* plan, bool plan_only) {
  if (Status s = validate_mla(params); !s) return s;
  return launch_mla(mla_args(params), stream, params.enable_pdl, plan, plan_only);
}

}  // namespace kvrope::detail
