// The definitions behind launch.h: kvrope's own launchers. Included by launch_{bf16,fp16,fp32}.cu only.
#pragma once

#include <kvrope/append.cuh>
#include <kvrope/backward.cuh>
#include <kvrope/forward.cuh>

#include "launch.h"

namespace kvrope_torch {

template <typename T, typename Pos>
kvrope::Status launch_forward(const kvrope::ForwardParams<T, Pos>& p, cudaStream_t stream) {
  return kvrope::kv_cache_rope_forward(p, stream);
}
template <typename T, typename Pos>
kvrope::Status launch_backward(const kvrope::BackwardParams<T, Pos>& p, cudaStream_t stream) {
  return kvrope::kv_cache_rope_backward(p, stream);
}
template <typename T, typename Pos>
kvrope::Status launch_backward(const kvrope::BackwardInPlaceParams<T, Pos>& p, cudaStream_t stream) {
  return kvrope::kv_cache_rope_backward(p, stream);
}
template <typename T, typename C, typename Pos>
kvrope::Status launch_append(const kvrope::AppendParams<T, C, Pos>& p, cudaStream_t stream) {
  return kvrope::kv_cache_rope_append(p, stream);
}

}  // namespace kvrope_torch
