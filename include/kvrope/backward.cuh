// The backward of "write RoPE'd keys and values into a static KV cache" (docs/spec.md §1): validation,
// planning and the launchers.
#pragma once

#include <cuda_runtime_api.h>

#include "backward_params.cuh"
#include "core/dispatch.cuh"
#include "core/status.cuh"
#include "detail/launch.cuh"
#include "detail/validate.cuh"
#include "forward_params.cuh"  // kErrorPositionIdOutOfRange: the error flag is shared by both ops

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

namespace detail {
template <typename T, typename Pos>
ProblemArgs<T> problem_args(const BackwardParams<T, Pos>& p) {
  return problem_args<T, Pos>(p, p.grad_key_cache, p.grad_value_cache, p.grad_key_cache_input, p.grad_value_cache_input,
                              false);
}
template <typename T, typename Pos>
ProblemArgs<T> problem_args(const BackwardInPlaceParams<T, Pos>& p) {
  return problem_args<T, Pos>(p, p.grad_key_cache, p.grad_value_cache, p.grad_key_cache, p.grad_value_cache, true);
}
template <typename T, typename Pos>
unsigned int* workspace_of(const BackwardParams<T, Pos>& p) {
  return static_cast<unsigned int*>(p.workspace);
}
template <typename T, typename Pos>
unsigned int* workspace_of(const BackwardInPlaceParams<T, Pos>&) {
  return nullptr;
}
template <typename T, typename Pos>
RotarySpec rotary_spec(const BackwardCommon<T, Pos>& p) {
  const bool shared =
      (p.grad_cos.data && p.grad_cos.batch_stride == 0) || (p.grad_sin.data && p.grad_sin.batch_stride == 0);
  return RotarySpec{p.rotary_dim, p.style, shared && p.batch > 1};
}
template <typename Dims, typename Params>
Status run_backward(const Params& params, const LaunchPolicy* policy, cudaStream_t stream, LaunchConfig* config,
                    bool plan_only) {
  if (Status s = validate(params); !s) return s;
  return launch_backward<Dims>(problem_args(params), rotary_spec(params), workspace_of(params), policy, stream, config,
                               plan_only);
}
}  // namespace detail

//! The backward in one kernel launch on `stream`, out of place (BackwardParams) or in place
//! (BackwardInPlaceParams). Validates first and launches nothing when the parameters are invalid.
//! Allocates nothing, does not synchronize and reads no device memory on the host: graph-capturable.
//! Out-of-range positions are reported through params.error_flag (read_error_flag).
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

//! Zeroes an error flag on `stream` (asynchronous; capturable).
inline Status reset_error_flag(int* flag, cudaStream_t stream = nullptr) {
  return detail::cuda_status(cudaMemsetAsync(flag, 0, sizeof(int), stream), "cudaMemsetAsync");
}

//! Zeroes a workspace (BackwardParams::workspace) on `stream`, once after allocating it: each call
//! leaves it zero (asynchronous; capturable).
inline Status reset_workspace(void* workspace, cudaStream_t stream = nullptr) {
  return detail::cuda_status(cudaMemsetAsync(workspace, 0, kBackwardWorkspaceBytes, stream), "cudaMemsetAsync");
}

//! Reads an error flag written by earlier launches on `stream`; synchronizes the stream, so call it
//! outside graph capture. Returns kPositionIdOutOfRange (field "position_ids") when only a forward's
//! position id was out of range, and kPositionOutOfRange (field "cache_position") if a position was out
//! of range, success otherwise.
inline Status read_error_flag(const int* flag, cudaStream_t stream = nullptr) {
  int value = 0;
  if (Status s = detail::cuda_status(cudaMemcpyAsync(&value, flag, sizeof(int), cudaMemcpyDeviceToHost, stream),
                                     "cudaMemcpyAsync");
      !s)
    return s;
  if (Status s = detail::cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); !s) return s;
  if (value & kErrorPositionOutOfRange) return detail::fail(StatusCode::kPositionOutOfRange, "cache_position");
  if (value & kErrorPositionIdOutOfRange) return detail::fail(StatusCode::kPositionIdOutOfRange, "position_ids");
  return {};
}

}  // namespace kvrope
