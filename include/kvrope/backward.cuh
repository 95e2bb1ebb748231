// The backward of "write RoPE'd keys and values into a static KV cache" (docs/spec.md §1): the entry points.
#pragma once

#include <cuda_runtime_api.h>

#include "backward_params.cuh"
#include "core/dispatch.cuh"
#include "core/status.cuh"
#include "detail/backward/launch.cuh"
#include "detail/backward/validate.cuh"
#include "error_flag.cuh"

namespace kvrope {

//! Checks an out-of-place call without touching the device: sizes, required pointers (a tensor with no
//! elements may be null), non-negative strides, outputs whose rows do not overlap, outputs clear of every
//! input and of each other. Returns the first problem with the field's name.
template <typename T, typename Pos>
Status validate(const BackwardParams<T, Pos>& params) {
  return detail::validate_backward(params);
}

//! Checks an in-place call: as the out-of-place one, with gK and gV counted as outputs.
template <typename T, typename Pos>
Status validate(const BackwardInPlaceParams<T, Pos>& params) {
  return detail::validate_backward(params);
}

//! The backward in one kernel launch on `stream`, out of place (BackwardParams) or in place
//! (BackwardInPlaceParams). Validates first and launches nothing when the parameters are invalid.
//! Allocates nothing, does not synchronize and reads no device memory on the host: graph-capturable.
//! Out-of-range positions are reported through params.error_flag (error_flag.cuh).
//!
//! @tparam Dims    the head dims compiled as instances (others run on the generic instance); a smaller
//!                 set, for example HeadDims<128>, compiles faster
//! @param params   device pointers, sizes and strides
//! @param stream   the stream to launch on
//! @return         the first invalid field, a CUDA launch error, or success
template <typename Dims = CompiledHeadDims, typename Params>
Status kv_cache_rope_backward(const Params& params, cudaStream_t stream = nullptr) {
  return detail::run_backward<Dims>(params, nullptr, stream, nullptr, false);
}

//! Fills `plan` with what kv_cache_rope_backward<Dims>(params) would launch on the current device,
//! launching nothing.
template <typename Dims = CompiledHeadDims, typename Params>
Status plan_backward(const Params& params, BackwardPlan* plan) {
  detail::LaunchConfig config{};
  Status s = detail::run_backward<Dims>(params, nullptr, nullptr, &config, true);
  if (s && plan) *plan = config.plan;
  return s;
}

//! Zeroes a workspace (BackwardParams::workspace) on `stream`, once after allocating it: each call
//! leaves it zero (asynchronous; capturable).
inline Status reset_workspace(void* workspace, cudaStream_t stream = nullptr) {
  return detail::cuda_status(cudaMemsetAsync(workspace, 0, kBackwardWorkspaceBytes, stream), "cudaMemsetAsync");
}

}  // namespace kvrope
