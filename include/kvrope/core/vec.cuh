// Vec<T, N>: N elements moved as one aligned access, loaded and stored through CUB's cache modifiers.
#pragma once

#include <cub/thread/thread_load.cuh>
#include <cub/thread/thread_store.cuh>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dtype.cuh"
#include "config.cuh"  // (last: KVROPE_UNROLL, #undef at the end)

namespace kvrope {

namespace detail {
// The unsigned word CUB moves for an access of `Bytes` bytes (its cache-modifier paths exist for these).
template <int Bytes>
struct RawWord;
template <>
struct RawWord<16> {
  using type = uint4;
};
template <>
struct RawWord<8> {
  using type = uint2;
};
template <>
struct RawWord<4> {
  using type = unsigned int;
};
template <>
struct RawWord<2> {
  using type = unsigned short;
};
}  // namespace detail

namespace detail {
// Bit casts between same-sized trivially copyable types (memcpy: registers, no memory, after inlining).
template <typename To, typename From>
__host__ __device__ __forceinline__ To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bits_as: sizes differ");
  To to;
  memcpy(&to, &from, sizeof(to));
  return to;
}

// Two 16-bit elements of T in one 32-bit word (element 0 in the low half) to fp32 and back.
template <typename T>
__host__ __device__ __forceinline__ void unpack2(uint32_t w, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // bf16 is the top half of an fp32: a shift or a mask, no conversion instruction.
    lo = bits_as<float>(w << 16);
    hi = bits_as<float>(w & 0xffff0000u);
  } else {
    const float2 f = __half22float2(bits_as<__half2>(w));
    lo = f.x;
    hi = f.y;
  }
}
template <typename T>
__host__ __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return bits_as<uint32_t>(__floats2bfloat162_rn(lo, hi));
  } else {
    return bits_as<uint32_t>(__floats2half2_rn(lo, hi));
  }
}
}  // namespace detail

//! N consecutive elements of T in registers, aligned to their size (16 bytes on the vector paths), kept as
//! the raw bits of one access so that a pair of 16-bit elements shares a 32-bit register.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  static constexpr int kSize = N;
  using Word = typename detail::RawWord<sizeof(T) * N>::type;
  Word raw;

  __host__ __device__ static Vec zeros() {
    Vec out;
    out.raw = Word{};  // all bits zero: +0 in every supported T
    return out;
  }
  //! Widens to fp32.
  __host__ __device__ void to_float(float (&out)[N]) const {
    if constexpr (sizeof(T) == 4 || N == 1) {
      T v[N];
      memcpy(v, &raw, sizeof(raw));
      KVROPE_UNROLL
      for (int i = 0; i < N; ++i) out[i] = kvrope::to_float(v[i]);
    } else {
      uint32_t w[N / 2];
      memcpy(w, &raw, sizeof(raw));
      KVROPE_UNROLL
      for (int i = 0; i < N / 2; ++i) detail::unpack2<T>(w[i], out[2 * i], out[2 * i + 1]);
    }
  }
  //! Rounds fp32 values to T.
  __host__ __device__ static Vec from_float(const float (&in)[N]) {
    Vec out;
    if constexpr (sizeof(T) == 4 || N == 1) {
      T v[N];
      KVROPE_UNROLL
      for (int i = 0; i < N; ++i) v[i] = kvrope::from_float<T>(in[i]);
      memcpy(&out.raw, v, sizeof(out.raw));
    } else {
      uint32_t w[N / 2];
      KVROPE_UNROLL
      for (int i = 0; i < N / 2; ++i) w[i] = detail::pack2<T>(in[2 * i], in[2 * i + 1]);
      memcpy(&out.raw, w, sizeof(out.raw));
    }
    return out;
  }
};

//! Loads a Vec from `ptr` (aligned to sizeof(Vec)) with CUB cache modifier M. LOAD_CS uses __ldcs (global
//! memory only): CUB's asm load kept a 64-bit address per access, which spilled (generic LD.E.EF in SASS).
template <cub::CacheLoadModifier M = cub::LOAD_DEFAULT, typename T, int N = 1>
__device__ __forceinline__ Vec<T, N> load_vec(const T* ptr) {
  using Raw = typename detail::RawWord<sizeof(T) * N>::type;
  Raw raw;
  if constexpr (M == cub::LOAD_CS) {
    raw = __ldcs(reinterpret_cast<const Raw*>(ptr));
  } else {
    raw = cub::ThreadLoad<M>(reinterpret_cast<Raw*>(const_cast<T*>(ptr)));
  }
  Vec<T, N> out;
  out.raw = raw;
  return out;
}

//! Stores a Vec to `ptr` (aligned to sizeof(Vec)) with CUB cache modifier M. STORE_CS takes the
//! global-memory intrinsic __stcs (`ptr` in global memory), as LOAD_CS does above.
template <cub::CacheStoreModifier M = cub::STORE_DEFAULT, typename T, int N>
__device__ __forceinline__ void store_vec(T* ptr, const Vec<T, N>& value) {
  using Raw = typename detail::RawWord<sizeof(T) * N>::type;
  const Raw raw = value.raw;
  if constexpr (M == cub::STORE_CS) {
    __stcs(reinterpret_cast<Raw*>(ptr), raw);
  } else {
    cub::ThreadStore<M>(reinterpret_cast<Raw*>(ptr), raw);
  }
}

}  // namespace kvrope

#undef KVROPE_UNROLL
