// The serving forward: ragged tokens' q and k (optionally RMS-normed) rotated, and RoPE(k) and v
// appended to a paged, flat or contiguous KV cache in T, fp8 or NVFP4 (docs/spec.md §6): the entry points.
#pragma once

#include <cuda_runtime_api.h>

#include "append_params.cuh"
#include "core/status.cuh"
#include "detail/append/launch.cuh"
#include "detail/append/validate.cuh"
#include "error_flag.cuh"

namespace kvrope {

//! Checks an append call without touching the device: sizes, rotary_dim, mRoPE sections, one table
//! source, the scales' use, required pointers, strides, outputs whose rows do not overlap, outputs clear
//! of every input and of each other (q and k in place are outputs only), what an NVFP4 cache needs.
template <typename T, typename C, typename Pos>
Status validate(const AppendParams<T, C, Pos>& params) {
  return detail::validate_append(params);
}

//! The serving forward in one kernel launch on `stream`. Validates first and launches nothing when
//! the parameters are invalid. Allocates nothing, does not synchronize: graph-capturable. Repeated
//! slots: the last token naming a slot (of those whose position is in range) writes it. Negative
//! slots write no cache row. Out-of-range slots and positions are reported through params.error_flag
//! (error_flag.cuh).
template <typename T, typename C, typename Pos>
Status kv_cache_rope_append(const AppendParams<T, C, Pos>& params, cudaStream_t stream = nullptr) {
  return detail::run_append(params, stream, nullptr, false);
}

//! Fills `plan` with what kv_cache_rope_append(params) would launch on the current device, launching nothing.
template <typename T, typename C, typename Pos>
Status plan_append(const AppendParams<T, C, Pos>& params, AppendPlan* plan) {
  return detail::run_append(params, nullptr, plan, true);
}

}  // namespace kvrope
