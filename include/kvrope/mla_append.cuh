// The MLA latent-cache append (docs/spec.md §6.6: DeepSeek-V2/V3, Kimi K2): q_pe rotated, [kv_c | RoPE(k_pe)]
// appended to a paged latent cache (vLLM's one cache or FlashInfer's two), in T or fp8: the entry points.
#pragma once

#include <cuda_runtime_api.h>

#include "core/status.cuh"
#include "detail/mla/launch.cuh"
#include "detail/mla/validate.cuh"
#include "error_flag.cuh"
#include "mla_append_params.cuh"

namespace kvrope {

//! Checks an MLA append call without touching the device: sizes, one table source, the scales' use, required
//! pointers, strides, q's output rows disjoint, outputs clear of every input and of each other (q_pe in place is
//! an output only; vLLM's one cache, rope rows at +L of the latent rows with the same strides, one output).
template <typename T, typename C, typename Pos>
Status validate_mla_append(const MlaAppendParams<T, C, Pos>& params) {
  return detail::validate_mla(params);
}

//! The same, as the other ops' validate.
template <typename T, typename C, typename Pos>
Status validate(const MlaAppendParams<T, C, Pos>& params) {
  return detail::validate_mla(params);
}

//! The MLA append in one kernel launch on `stream`. Validates first and launches nothing when the parameters are
//! invalid. Allocates nothing, asks the device nothing, does not synchronize: graph-capturable. Repeated slots:
//! the last token naming a slot (of those whose position is in range) writes it. Negative slots write no cache
//! row. Out-of-range slots and positions are reported through params.error_flag (error_flag.cuh).
template <typename T, typename C, typename Pos>
Status mla_append(const MlaAppendParams<T, C, Pos>& params, cudaStream_t stream = nullptr) {
  return detail::run_mla(params, stream, nullptr, false);
}

//! Fills `plan` with what mla_append(params) would launch, launching nothing.
template <typename T, typename C, typename Pos>
Status plan_mla_append(const MlaAppendParams<T, C, Pos>& params, MlaPlan* plan) {
  return detail::run_mla(params, nullptr, plan, true);
}

}  // namespace kvrope
