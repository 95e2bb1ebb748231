// kvrope's launchers as kvrope_torch calls them: plain parameter structs and a stream, no ATen, so the
// CUDA files (launch_{bf16,fp16,fp32}.cu, launch_append_*.cu, launch_mla.cu) compile without torch's headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <kvrope/append_params.cuh>
#include <kvrope/backward_params.cuh>
#include <kvrope/core/dtype.cuh>
#include <kvrope/core/status.cuh>
#include <kvrope/forward_params.cuh>
#include <kvrope/mla_append_params.cuh>

namespace kvrope_torch {

template <typename T, typename Pos>
kvrope::Status launch_forward(const kvrope::ForwardParams<T, Pos>& p, cudaStream_t stream);
template <typename T, typename Pos>
kvrope::Status launch_backward(const kvrope::BackwardParams<T, Pos>& p, cudaStream_t stream);
template <typename T, typename Pos>
kvrope::Status launch_backward(const kvrope::BackwardInPlaceParams<T, Pos>& p, cudaStream_t stream);
template <typename T, typename C, typename Pos>
kvrope::Status launch_append(const kvrope::AppendParams<T, C, Pos>& p, cudaStream_t stream);
template <typename T, typename C, typename Pos>
kvrope::Status launch_mla_append(const kvrope::MlaAppendParams<T, C, Pos>& p, cudaStream_t stream);

}  // namespace kvrope_torch

//! The launchers of element type T for both position types, instantiated in one CUDA file a dtype.
#define KVROPE_TORCH_LAUNCHERS(T)                                                                                 \
  template kvrope::Status kvrope_torch::launch_forward(const kvrope::ForwardParams<T, int64_t>&, cudaStream_t);   \
  template kvrope::Status kvrope_torch::launch_forward(const kvrope::ForwardParams<T, int32_t>&, cudaStream_t);   \
  template kvrope::Status kvrope_torch::launch_backward(const kvrope::BackwardParams<T, int64_t>&, cudaStream_t); \
  template kvrope::Status kvrope_torch::launch_backward(const kvrope::BackwardParams<T, int32_t>&, cudaStream_t); \
  template kvrope::Status kvrope_torch::launch_backward(const kvrope::BackwardInPlaceParams<T, int64_t>&,         \
                                                        cudaStream_t);                                            \
  template kvrope::Status kvrope_torch::launch_backward(const kvrope::BackwardInPlaceParams<T, int32_t>&, cudaStream_t)

#define KVROPE_TORCH_APPEND_LAUNCHER(T, C)                                                                       \
  template kvrope::Status kvrope_torch::launch_append(const kvrope::AppendParams<T, C, int64_t>&, cudaStream_t); \
  template kvrope::Status kvrope_torch::launch_append(const kvrope::AppendParams<T, C, int32_t>&, cudaStream_t)

//! The append launchers of element type T for its four cache types and both position types, in a
//! CUDA file of their own a dtype (launch_append_*.cu), so that they compile beside the others.
#define KVROPE_TORCH_APPEND_LAUNCHERS(T)          \
  KVROPE_TORCH_APPEND_LAUNCHER(T, T);             \
  KVROPE_TORCH_APPEND_LAUNCHER(T, __nv_fp8_e4m3); \
  KVROPE_TORCH_APPEND_LAUNCHER(T, __nv_fp8_e5m2); \
  KVROPE_TORCH_APPEND_LAUNCHER(T, kvrope::nvfp4_e2m1x2)

#define KVROPE_TORCH_MLA_LAUNCHER(T, C)                                                                  \
  template kvrope::Status kvrope_torch::launch_mla_append(const kvrope::MlaAppendParams<T, C, int64_t>&, \
                                                          cudaStream_t);                                 \
  template kvrope::Status kvrope_torch::launch_mla_append(const kvrope::MlaAppendParams<T, C, int32_t>&, cudaStream_t)

//! The MLA append launchers of element type T for its three cache types (T, fp8 e4m3, fp8 e5m2) and both
//! position types (the kernels do not depend on the positions' type: three a (T, C), docs/design.md).
#define KVROPE_TORCH_MLA_LAUNCHERS(T)          \
  KVROPE_TORCH_MLA_LAUNCHER(T, T);             \
  KVROPE_TORCH_MLA_LAUNCHER(T, __nv_fp8_e4m3); \
  KVROPE_TORCH_MLA_LAUNCHER(T, __nv_fp8_e5m2)
