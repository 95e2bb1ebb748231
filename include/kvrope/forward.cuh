// The forward: RoPE'd keys and values written into a static KV cache at cache_position, optionally
// RoPE(k) and q rotated in the same launch (docs/spec.md §2): the entry points.
#pragma once

#include <cuda_runtime_api.h>

#include "core/status.cuh"
#include "detail/forward/launch.cuh"
#include "detail/forward/validate.cuh"
#include "error_flag.cuh"
#include "forward_params.cuh"

namespace kvrope {

//! Checks a forward call without touching the device: sizes, rotary_dim, one table source, required
//! pointers, strides, outputs whose rows do not overlap, outputs clear of every input and of each other.
template <typename T, typename Pos>
Status validate(const ForwardParams<T, Pos>& params) {
  return detail::validate_forward(params);
}

//! The forward in one kernel launch on `stream`. Validates first and launches nothing when the
//! parameters are invalid. Allocates nothing, does not synchronize: graph-capturable. Repeated
//! positions: the last token naming a row writes it. Out-of-range positions and position ids are
//! reported through params.error_flag (error_flag.cuh).
template <typename T, typename Pos>
Status kv_cache_rope_forward(const ForwardParams<T, Pos>& params, cudaStream_t stream = nullptr) {
  return detail::run_forward(params, stream, nullptr, false);
}

//! Fills `plan` with what kv_cache_rope_forward(params) would launch on the current device, launching nothing.
template <typename T, typename Pos>
Status plan_forward(const ForwardParams<T, Pos>& params, ForwardPlan* plan) {
  return detail::run_forward(params, nullptr, plan, true);
}

}  // namespace kvrope
