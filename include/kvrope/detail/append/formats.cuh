// How a finished unit of a row is stored, by the element type of its destination: the one store path of
// every output (q out, k out, the caches). T stores as is; fp8 divides by the scale and saturates; NVFP4
// quantizes blocks of 16 that neighbouring lanes hold (docs/spec.md §6.4).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../append_params.cuh"
#include "../../core/vec.cuh"
#include "../common/nvfp4.cuh"
#include "../common/rotary_units.cuh"
#include "args.cuh"

namespace kvrope::detail {

//! A unit's two chunks (at UnitPlace lo and hi), in T.
template <typename T, int N>
struct UnitChunks {
  Vec<T, N> lo, hi;
};

//! The scale a row is stored with (fp8: the divisor; NVFP4: the global scale g).
struct StoreScale {
  float scale = 1.0f;
};

__device__ __forceinline__ StoreScale store_scale(float scale) { return {scale}; }

//! 1 / scale in fp64, within a unit or two of fp64: rcp.approx's estimate, then a cubic and a quadratic Newton
//! step (the steps fp64 division takes to its reciprocal). No range check: a float's value is a normal fp64
//! number or 0, Inf or NaN, whose estimate is their exact reciprocal. Computed where a chunk is stored, after
//! the row's loads: one in the kernel's first lines waited there for the scale's load.
__device__ __forceinline__ double fp64_reciprocal(float scale) {
  const double s = scale;
  double r0;
  asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r0) : "d"(s));
  double e = fma(-s, r0, 1.0);
  double r = fma(r0, fma(e, e, e), r0);
  e = fma(-s, r, 1.0);
  r = fma(r, e, r);
  return isfinite(r0) && r0 != 0.0 ? r : r0;
}

//! float(x) / scale as fp32's IEEE division rounds it, from one fp64 product with `inverse` within two units of
//! fp64 of 1 / scale (fp64_reciprocal): the product is within 2^-50 (relative) of the quotient, and a quotient
//! of two fp32 values at or above fp32's least normal is never within 2^-49 of a midpoint between fp32 values
//! (below it, where midpoints come closer, every fp8 code is zero), so the product rounds to fp32 as the
//! quotient does (tests: test_append_reference.cu on the host, test_append.cu on the GPU). A division took
//! some ten instructions a value, a reciprocal and a range check with its slow path (docs/performance-log.md #54).
__host__ __device__ __forceinline__ float scaled_quotient(float x, double inverse) {
  return static_cast<float>(static_cast<double>(x) * inverse);
}

//! N values of T stored at `dst` as one access in E: E = T as they are; fp8 as
//! fp8_satfinite(float(x) / scale) (docs/spec.md: the scale divides, in fp32), two values a conversion.
template <typename E, typename T, int N>
__device__ __forceinline__ void store_chunk(E* dst, const Vec<T, N>& x, const StoreScale& s) {
  if constexpr (std::is_same_v<E, T>) {
    store_vec(dst, x);
  } else {
    static_assert(kIsFp8<E>, "kvrope: a row is stored in T or fp8");
    constexpr __nv_fp8_interpretation_t kKind = std::is_same_v<E, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    float f[N];
    x.to_float(f);
    const double inverse = fp64_reciprocal(s.scale);
    if constexpr (N == 1) {
      *reinterpret_cast<uint8_t*>(dst) = __nv_cvt_float_to_fp8(scaled_quotient(f[0], inverse), __NV_SATFINITE, kKind);
    } else {
      uint8_t bytes[N];
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(
            make_float2(scaled_quotient(f[i], inverse), scaled_quotient(f[i + 1], inverse)), __NV_SATFINITE, kKind);
        bytes[i] = static_cast<uint8_t>(two & 0xff);  // (.x, the first, in the low byte)
        bytes[i + 1] = static_cast<uint8_t>(two >> 8);
      }
      using Raw = typename RawWord<N>::type;
      Raw raw;
      memcpy(&raw, bytes, N);
      *reinterpret_cast<Raw*>(dst) = raw;
    }
  }
}

//! A unit stored into the row at `row` (elements of E).
template <typename E, typename T, int N>
__device__ __forceinline__ void store_unit(E* row, const UnitPlace& pl, const UnitChunks<T, N>& x,
                                           const StoreScale& s) {
  store_chunk<E>(row + pl.lo, x.lo, s);
  store_chunk<E>(row + pl.hi, x.hi, s);
}

//! An NVFP4 cache row's destination: its codes (D / 2 bytes) and its block scales (D / 16 e4m3 bytes).
struct Nvfp4Row {
  nvfp4_e2m1x2* codes;
  __nv_fp8_e4m3* scales;
};

//! A unit stored into an NVFP4 row under the global scale g = s.scale (docs/spec.md §6.4; the block rule of
//! common/nvfp4.cuh). A block of 16 values is the same chunk (lo or hi) of 16 / N neighbouring lanes
//! (N = 8: lane and lane ^ 1; N = 4: four lanes), aligned in the warp: validate asks D and R to be multiples
//! of 32, so a block never straddles the rotated and pass-through parts or the two halves of a row, and the
//! vector path. Its amax is one shuffle a halving among those lanes; each lane stores its N / 2 code bytes,
//! the block's first lane the scale byte. Every lane of a block calls it together: they hold one row, so
//! they share `active`, the row's context and its cache row (finish_row).
template <typename T, int N>
__device__ __forceinline__ void store_unit(const Nvfp4Row& row, const UnitPlace& pl, const UnitChunks<T, N>& x,
                                           const StoreScale& s) {
  static_assert(N == 4 || N == 8, "kvrope: NVFP4 caches are stored from 16-byte chunks of T");
  constexpr int kLanes = kNvfp4BlockSize / N;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const unsigned mask = ((1u << kLanes) - 1u) << (lane & ~(kLanes - 1));
  float lo[N], hi[N];
  x.lo.to_float(lo);
  x.hi.to_float(hi);
  float amax_lo = nvfp4_amax<N>(lo), amax_hi = nvfp4_amax<N>(hi);
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) {
    amax_lo = fmaxf(amax_lo, __shfl_xor_sync(mask, amax_lo, offset));
    amax_hi = fmaxf(amax_hi, __shfl_xor_sync(mask, amax_hi, offset));
  }
  const Nvfp4Scale scale_lo = nvfp4_block_scale(amax_lo, s.scale), scale_hi = nvfp4_block_scale(amax_hi, s.scale);
  unsigned char* codes = reinterpret_cast<unsigned char*>(row.codes);
  auto store_codes = [&](int at, uint32_t word) {  // N / 2 bytes at element `at` (aligned to them: the vector path)
    if constexpr (N == 8)
      *reinterpret_cast<uint32_t*>(codes + at / 2) = word;
    else
      *reinterpret_cast<uint16_t*>(codes + at / 2) = static_cast<uint16_t>(word);
  };
  store_codes(pl.lo, nvfp4_pack<N>(lo, scale_lo.inv));
  store_codes(pl.hi, nvfp4_pack<N>(hi, scale_hi.inv));
  unsigned char* scales = reinterpret_cast<unsigned char*>(row.scales);
  if (pl.lo % kNvfp4BlockSize == 0) scales[pl.lo / kNvfp4BlockSize] = static_cast<unsigned char>(scale_lo.code);
  if (pl.hi % kNvfp4BlockSize == 0) scales[pl.hi / kNvfp4BlockSize] = static_cast<unsigned char>(scale_hi.code);
}

//! The scale of head `head`'s rows in a cache (1 for caches in T and for a null scale).
template <typename C>
__device__ __forceinline__ float head_scale(const CacheRows<C>& c, int head) {
  if constexpr (kIsQuantized<C>) {
    if (c.scale != nullptr) return c.scale[c.per_head ? head : 0];
  }
  return 1.0f;
}

}  // namespace kvrope::detail
