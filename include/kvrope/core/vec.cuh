// Vec<T, N>: N elements moved as one aligned access, loaded and stored through CUB's cache modifiers.
#pragma once

#include <cub/thread/thread_load.cuh>
#include <cub/thread/thread_store.cuh>

#include <cstdint>
#include <cstring>

#include "config.cuh"
#include "dtype.cuh"

namespace kvrope {

namespace detail {
// The unsigned word CUB moves for an access of `Bytes` bytes (its cache-modifier paths exist for these).
template <int Bytes> struct RawWord;
template <> struct RawWord<16> { using type = uint4; };
template <> struct RawWord<8> { using type = uint2; };
template <> struct RawWord<4> { using type = unsigned int; };
template <> struct RawWord<2> { using type = unsigned short; };
}  // namespace detail

//! N consecutive elements of T held in registers, aligned to their total size (16 bytes for the
//! vector paths: 8 bf16/fp16 or 4 fp32; N = 1 for the scalar fallback).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  static constexpr int kSize = N;
  T v[N];

  __host__ __device__ static Vec zeros() {
    Vec out;
KVROPE_UNROLL
    for (int i = 0; i < N; ++i) out.v[i] = kvrope::from_float<T>(0.0f);
    return out;
  }
  //! Widens to fp32.
  __host__ __device__ void to_float(float (&out)[N]) const {
KVROPE_UNROLL
    for (int i = 0; i < N; ++i) out[i] = kvrope::to_float(v[i]);
  }
  //! Rounds fp32 values to T.
  __host__ __device__ static Vec from_float(const float (&in)[N]) {
    Vec out;
KVROPE_UNROLL
    for (int i = 0; i < N; ++i) out.v[i] = kvrope::from_float<T>(in[i]);
    return out;
  }
};

//! Loads a Vec from `ptr` (which must be aligned to sizeof(Vec)) with CUB cache modifier M.
template <cub::CacheLoadModifier M = cub::LOAD_DEFAULT, typename T, int N = 1>
__device__ __forceinline__ Vec<T, N> load_vec(const T* ptr) {
  using Raw = typename detail::RawWord<sizeof(T) * N>::type;
  Raw raw = cub::ThreadLoad<M>(reinterpret_cast<Raw*>(const_cast<T*>(ptr)));
  Vec<T, N> out;
  memcpy(&out, &raw, sizeof(out));
  return out;
}

//! Stores a Vec to `ptr` (aligned to sizeof(Vec)) with CUB cache modifier M.
template <cub::CacheStoreModifier M = cub::STORE_DEFAULT, typename T, int N>
__device__ __forceinline__ void store_vec(T* ptr, const Vec<T, N>& value) {
  using Raw = typename detail::RawWord<sizeof(T) * N>::type;
  Raw raw;
  memcpy(&raw, &value, sizeof(raw));
  cub::ThreadStore<M>(reinterpret_cast<Raw*>(ptr), raw);
}

}  // namespace kvrope
