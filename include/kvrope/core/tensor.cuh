// Strided views of the tensors the ops take: raw device pointers plus int64 element strides.
#pragma once

#include <cstdint>
#include <type_traits>

namespace kvrope {

//! A [B, H, L, D] tensor of head rows (the caches, key/value states and their gradients).
//! The last dimension is contiguous; the other three strides are in elements and may be anything
//! non-negative, so BHSD (Hugging Face static cache) and BSHD (FlashAttention, vLLM) both fit.
template <typename T>
struct HeadRows {
  T* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t seq_stride = 0;

  __host__ __device__ T* row(int64_t b, int64_t h, int64_t s) const {
    return data + b * batch_stride + h * head_stride + s * seq_stride;
  }
  //! The same view through a pointer to const.
  template <typename U = T, typename = std::enable_if_t<!std::is_const_v<U>>>
  __host__ __device__ operator HeadRows<const U>() const {
    return {data, batch_stride, head_stride, seq_stride};
  }
};

//! A [B, S, D] tensor of token rows (cos, sin and their gradients). batch_stride 0 broadcasts one
//! table over the batch (inputs only).
template <typename T>
struct TokenRows {
  T* data = nullptr;
  int64_t batch_stride = 0;
  int64_t seq_stride = 0;

  __host__ __device__ T* row(int64_t b, int64_t s) const { return data + b * batch_stride + s * seq_stride; }
  template <typename U = T, typename = std::enable_if_t<!std::is_const_v<U>>>
  __host__ __device__ operator TokenRows<const U>() const {
    return {data, batch_stride, seq_stride};
  }
};

//! A contiguous [B, H, L, D] tensor (BHSD).
template <typename T>
HeadRows<T> bhsd(T* data, int64_t heads, int64_t len, int64_t head_dim) {
  return {data, heads * len * head_dim, len * head_dim, head_dim};
}
//! A contiguous [B, L, H, D] tensor (BSHD) seen as [B, H, L, D].
template <typename T>
HeadRows<T> bshd(T* data, int64_t heads, int64_t len, int64_t head_dim) {
  return {data, len * heads * head_dim, head_dim, heads * head_dim};
}
//! A contiguous [B, S, D] table; with broadcast, one [S, D] table shared by the whole batch.
template <typename T>
TokenRows<T> bsd(T* data, int64_t len, int64_t head_dim, bool broadcast = false) {
  return {data, broadcast ? 0 : len * head_dim, head_dim};
}

}  // namespace kvrope
