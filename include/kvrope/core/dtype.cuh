// Element types kvrope supports and their conversions to and from fp32 (all arithmetic is fp32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

namespace kvrope {

//! True for the element types the ops are instantiated for: __nv_bfloat16, __half, float.
template <typename T>
inline constexpr bool kIsSupportedType =
    std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half> || std::is_same_v<T, float>;

//! True for the fp8 element types (caches and fp8 outputs: quantized on write).
template <typename C>
inline constexpr bool kIsFp8 = std::is_same_v<C, __nv_fp8_e4m3> || std::is_same_v<C, __nv_fp8_e5m2>;

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

//! Rounds an fp32 value to T (round to nearest even): the op's single rounding.
template <typename T>
__host__ __device__ inline T from_float(float x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return x;
  }
}

}  // namespace kvrope
