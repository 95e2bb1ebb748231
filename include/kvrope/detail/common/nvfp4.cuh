// NVFP4 quantization of cache rows (docs/spec.md §6.4): the rounding of FlashInfer 0.7.4's
// nvfp4_quantize_append_paged_kv_cache_with_slot_mapping (flashinfer/data/include/flashinfer/page.cuh:
// nvfp4_append_quantize_block and nvfp4_append_quantize_e2m1), the layout its NVFP4 attention reads. A row of
// D values is cut into blocks of 16 along D; a block stores one e4m3 scale byte (scales [.., D/16]) and 8
// bytes of e2m1 codes, two a byte, the even element in the low nibble (values [.., D/2]); one global decode
// scale g (a device float) per cache: element ≈ e2m1 value · scale · g. The float64 reference is
// kvrope/reference/cpu_nvfp4.hpp; the host tests compile these functions as host code against it.
//
// The rule, in fp32 and in this order. FlashInfer JIT-builds its page module with -use_fast_math, so each
// fp32 operation flushes subnormal inputs and results to a zero of the same sign (FTZ), and its division
// and reciprocal are the approximate instructions; these functions issue the same PTX on the GPU:
//   1. amax = max(0, |x_0|, ..., |x_15|), exact in any order; a NaN element is skipped (fmaxf).
//   2. "live": amax and g are both >= 2^-126 (positive and normal: FTZ compares a subnormal as 0; a NaN g
//      fails). live: q = div.approx.ftz(amax, mul.ftz(6, g)), i.e. 6·g rounded to fp32 first, then amax
//      divided by it (the GPU's approximation, within 2 ulp; the host build rounds it correctly). Else q = 0.
//   3. The scale byte: e4m3 of q, round to nearest even, saturating to 448 (+Inf too; a NaN q gives 0x7F).
//      s = its value (exact in fp32).
//   4. live and s > 0: r = rcp.approx.ftz(mul.ftz(s, g)), i.e. 1 / fl(s·g) (the GPU's approximation,
//      within 1 ulp; the host build rounds it correctly). Else r = 0.
//   5. Each element: y = mul.ftz(x, r), the product rounded to fp32 (FTZ; a NaN product is the GPU's one
//      canonical NaN, sign clear), and its code = e2m1(y) (nvfp4_e2m1): to nearest of 0, .5, 1, 1.5, 2, 3,
//      4, 6, ties to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4),
//      above 5 (Inf too) 6; the sign bit is y's (-0 and small negatives give 0x8); NaN gives 0.
// So an all-zero block stores scale 0 and codes 0 (0x8 for -0); a block whose q is at most 2^-10 stores scale
// 0 and signed zero codes; an Inf element saturates the scale (448) and gives ±6; a NaN element gives 0 and
// leaves the rest of the block as if it were absent. FlashInfer's kernel traps unless g is finite and > 0
// (FTZ: normal); these functions do not look. FlashInfer converts to e2m1 with comparisons on every GPU;
// nvfp4_e2m1_pair uses the hardware conversion where there is one, with the same results.
//
// Layouts: one lane may hold a whole block (nvfp4_quantize_block), or two adjacent lanes 8 elements each
// (16 bytes of bf16): each takes nvfp4_amax of its 8, combines them with one shuffle
// (nvfp4_amax_pair: fmaxf with lane ^ 1's; max is exact, so the halves give the block's amax bit for bit),
// both call nvfp4_block_scale (same inputs, same result), each packs its 8 codes into a 4-byte word
// (nvfp4_pack8: bytes 4·(lane & 1) .. +3 of the block) and the even lane stores the scale byte. Four lanes
// of 4 (16 bytes of fp32) do the same with two shuffles and 2-byte words (nvfp4_pack<4>; the append's NVFP4
// caches, detail/append/formats.cuh).
#pragma once

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../../core/vec.cuh"
#include "../../core/config.cuh"  // (last: KVROPE_UNROLL, #undef at the end)

namespace kvrope::detail {

inline constexpr int kNvfp4BlockSize = 16;      // elements a block scale covers
inline constexpr float kNvfp4E2m1Max = 6.0f;    // the largest e2m1 magnitude
inline constexpr float kNvfp4E4m3Max = 448.0f;  // the largest e4m3 magnitude (the block scale saturates there)
inline constexpr float kNvfp4MinNormal = 1.17549435e-38f;  // 2^-126: below it FTZ reads a value as zero

// ---------------------------------------------------------------------------------------------------
// The fp32 operations of FlashInfer's fast-math build. On the GPU: the very instructions its build emits
// (inline PTX, whatever flags kvrope's user compiles with). On the host: the operation the instruction
// approximates, correctly rounded, with its FTZ and its canonical NaN.
// ---------------------------------------------------------------------------------------------------

//! x with a subnormal flushed to a zero of its sign (the FTZ of an input or a result).
__host__ __device__ __forceinline__ float nvfp4_ftz(float x) {
  return (x > -kNvfp4MinNormal && x < kNvfp4MinNormal) ? (bits_as<uint32_t>(x) >> 31 ? -0.0f : 0.0f) : x;
}

namespace nvfp4_host {
//! A NaN result as the GPU gives it: the one canonical NaN 0x7FFFFFFF (sign clear), whatever the inputs.
inline float canonical(float x) { return x != x ? bits_as<float>(0x7FFFFFFFu) : x; }
}  // namespace nvfp4_host

//! mul.rn.ftz.f32: a · b rounded to nearest even, FTZ.
__host__ __device__ __forceinline__ float nvfp4_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return nvfp4_ftz(nvfp4_host::canonical(nvfp4_ftz(a) * nvfp4_ftz(b)));
#endif
}

//! div.approx.ftz.f32 (what -use_fast_math makes of a / b): a · (1/b), within 2 ulp of a / b for |b| in
//! [2^-126, 2^126]; for |b| in (2^126, 2^128) 0, or NaN for an infinite a (PTX ISA, div). Host: a / b rounded
//! to nearest even (one fp32 rounding), FTZ, and the same beyond 2^126.
__host__ __device__ __forceinline__ float nvfp4_div(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  a = nvfp4_ftz(a), b = nvfp4_ftz(b);
  const float big = 8.50705917e37f;            // 2^126
  if ((b > big || b < -big) && b - b == 0.0f)  // (2^126, 2^128): a zero of the quotient's sign, NaN for an infinite a
    return a - a == 0.0f ? nvfp4_mul(a, b > 0.0f ? 0.0f : -0.0f) : bits_as<float>(0x7FFFFFFFu);
  return nvfp4_ftz(nvfp4_host::canonical(a / b));
#endif
}

//! rcp.approx.ftz.f32 (what -use_fast_math makes of 1.0f / x): within 1 ulp of 1 / x. Host: 1 / x rounded
//! to nearest even, FTZ (a subnormal x reads as ±0: ±Inf; beyond 2^126 the result flushes to ±0).
__host__ __device__ __forceinline__ float nvfp4_rcp(float x) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return nvfp4_ftz(nvfp4_host::canonical(1.0f / nvfp4_ftz(x)));
#endif
}

// ---------------------------------------------------------------------------------------------------
// e2m1 and e4m3 codes.
// ---------------------------------------------------------------------------------------------------

//! The e2m1 code (low 4 bits: sign, 2 exponent bits, 1 mantissa bit) of x: round to nearest of the
//! magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6, ties to the even code, saturating at 6 (Inf too); the sign bit is
//! x's (so -0 and small negatives give 0x8); NaN gives 0. The code counts the rounding boundaries |x|
//! lies above: each is the midpoint of two neighbours, taken (>=) when the upper neighbour's code is even.
//! This is the hardware cvt.rn.satfinite.e2m1x2.f32 except for NaN, which the hardware turns into +6.
__host__ __device__ __forceinline__ uint32_t nvfp4_e2m1(float x) {
  const float a = fabsf(x);
  const uint32_t magnitude = uint32_t{a > 0.25f} + uint32_t{a >= 0.75f} + uint32_t{a > 1.25f} + uint32_t{a >= 1.75f} +
                             uint32_t{a > 2.5f} + uint32_t{a >= 3.5f} + uint32_t{a > 5.0f};
  const uint32_t sign = (x == x) ? (bits_as<uint32_t>(x) >> 31) << 3 : 0u;
  return sign | magnitude;
}

//! The value of an e2m1 code (low 4 bits).
__host__ __device__ __forceinline__ float nvfp4_e2m1_value(uint32_t code) {
  const uint32_t m = code & 7u;
  const float magnitude =
      m < 4u ? 0.5f * static_cast<float>(m) : static_cast<float>(1u << (m / 2u - 1u)) * (m & 1u ? 1.5f : 1.0f);
  return code & 8u ? -magnitude : magnitude;
}

//! The e2m1 codes of two elements in one byte: `even` in the low nibble, `odd` in the high one. On the
//! GPUs with the conversion instruction (the sm_100 to sm_12x families, arch-specific targets such as
//! sm_100a) one cvt.rn.satfinite.e2m1x2.f32, after mapping NaN to 0 (the instruction would give +6);
//! elsewhere nvfp4_e2m1 twice.
__host__ __device__ __forceinline__ uint32_t nvfp4_e2m1_pair(float even, float odd) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && \
    __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
  even = even == even ? even : 0.0f;
  odd = odd == odd ? odd : 0.0f;
  unsigned short pair;
  asm("{ .reg .b8 p;\n cvt.rn.satfinite.e2m1x2.f32 p, %1, %2;\n mov.b16 %0, {p, 0}; }"
      : "=h"(pair)
      : "f"(odd), "f"(even));
  return pair;
#else
  return nvfp4_e2m1(even) | (nvfp4_e2m1(odd) << 4);
#endif
}

//! The value of an e4m3 code (exact in fp32); NaN for 0x7F and 0xFF.
__host__ __device__ __forceinline__ float nvfp4_e4m3_value(uint32_t code) {
  const uint32_t e = (code >> 3) & 15u, m = code & 7u, sign = (code & 0x80u) << 24;
  if (e == 15u && m == 7u) return bits_as<float>(0x7FFFFFFFu | sign);
  // Normal: 2^(e-7) (1 + m/8), fp32 exponent field e + 120. Subnormal (e = 0): m · 2^-9.
  const float magnitude = e ? bits_as<float>(((e + 120u) << 23) | (m << 20)) : static_cast<float>(m) * 0.001953125f;
  return bits_as<float>(bits_as<uint32_t>(magnitude) | sign);
}

// ---------------------------------------------------------------------------------------------------
// A block.
// ---------------------------------------------------------------------------------------------------

//! max(0, |x_0|, ..., |x_{N-1}|) with NaN skipped: one lane's part of a block's amax (N = 16: the whole
//! block; N = 8: half of it, see nvfp4_amax_pair).
template <int N>
__host__ __device__ __forceinline__ float nvfp4_amax(const float* x) {
  float amax = 0.0f;
  KVROPE_UNROLL
  for (int i = 0; i < N; ++i) amax = fmaxf(amax, fabsf(x[i]));
  return amax;
}

//! The amax of a block two adjacent lanes (lane ^ 1) hold half each: one shuffle. `mask` names the lanes
//! that take part (both lanes of a pair must).
__device__ __forceinline__ float nvfp4_amax_pair(float half_amax, unsigned mask = 0xFFFFFFFFu) {
  return fmaxf(half_amax, __shfl_xor_sync(mask, half_amax, 1));
}

//! What a block's scale gives: `code`, the e4m3 byte stored; `inv`, the factor r each element is multiplied
//! by before its e2m1 rounding; `quotient`, q before its e4m3 rounding (for tests).
struct Nvfp4Scale {
  float quotient;
  float inv;
  uint32_t code;
};

//! Steps 2 to 4 of the rule: the block scale of a block with this amax, under the global scale g.
__host__ __device__ __forceinline__ Nvfp4Scale nvfp4_block_scale(float amax, float global_scale) {
  const bool live = amax >= kNvfp4MinNormal && global_scale >= kNvfp4MinNormal;
  Nvfp4Scale s;
  s.quotient = live ? nvfp4_div(amax, nvfp4_mul(kNvfp4E2m1Max, global_scale)) : 0.0f;
  s.code = __nv_cvt_float_to_fp8(s.quotient, __NV_SATFINITE, __NV_E4M3);
  const float value = nvfp4_e4m3_value(s.code);
  s.inv = (live && value > 0.0f) ? nvfp4_rcp(nvfp4_mul(value, global_scale)) : 0.0f;
  return s;
}

//! Step 5 for K consecutive elements (K even, at most 8; a lane's chunk of a block): their codes in the low
//! K / 2 bytes of a word, byte j holding elements 2j (low nibble) and 2j + 1; little-endian, so storing
//! those bytes stores them in element order.
template <int K>
__host__ __device__ __forceinline__ uint32_t nvfp4_pack(const float* x, float inv) {
  static_assert(K % 2 == 0 && K <= 8, "nvfp4_pack: an even count of at most 8 elements");
  uint32_t word = 0;
  KVROPE_UNROLL
  for (int j = 0; j < K / 2; ++j)
    word |= nvfp4_e2m1_pair(nvfp4_mul(x[2 * j], inv), nvfp4_mul(x[2 * j + 1], inv)) << (8 * j);
  return word;
}

//! nvfp4_pack of 8 elements (half a block, or a whole block's first or last 8): a 4-byte word.
__host__ __device__ __forceinline__ uint32_t nvfp4_pack8(const float* x, float inv) { return nvfp4_pack<8>(x, inv); }

//! A quantized block: the scale byte and the 8 code bytes (as two words: elements 0-7 and 8-15).
struct Nvfp4Block {
  uint32_t scale;
  uint32_t packed[2];
};

//! The whole rule for a block of 16 values one lane holds (widened to fp32), under the global scale g.
__host__ __device__ __forceinline__ Nvfp4Block nvfp4_quantize_block(const float* x, float global_scale) {
  const Nvfp4Scale s = nvfp4_block_scale(nvfp4_amax<kNvfp4BlockSize>(x), global_scale);
  return {s.code, {nvfp4_pack8(x, s.inv), nvfp4_pack8(x + 8, s.inv)}};
}

}  // namespace kvrope::detail

#undef KVROPE_UNROLL
