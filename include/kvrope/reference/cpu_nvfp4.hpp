// The float64 CPU reference of NVFP4 quantization (docs/spec.md §6.4): FlashInfer 0.7.4's rule for an NVFP4
// cache row, written from the rule's statement (the device functions, to check against, are
// kvrope/detail/common/nvfp4.cuh, whose header states the rule step by step). Blocks of 16 values: one e4m3
// scale byte and 8 bytes of e2m1 codes (element 2j in the low nibble of byte j) under a global decode scale g.
//
// Every value is computed in double where that is exact, and rounded to fp32 where FlashInfer's arithmetic
// rounds (its fp32 operations, in its order), each such rounding a conversion of an exact or correctly
// rounded double to float:
//   - 6·g and s·g: exact double products (24 and 4 significant bits times 3 or 24), one rounding to fp32.
//   - amax / fl(6·g) and 1 / fl(s·g): a double quotient, then fp32. The double rounding is innocuous: a
//     quotient of fp32 numbers rounded to 53 bits, then to 24, is the quotient rounded to 24 (53 >= 2·24 + 2).
//   - x·r: an exact double product (24 + 24 bits), one rounding to fp32: the e2m1 rounding reads that fp32
//     value, so a product rounded onto a midpoint is a tie.
// FlashInfer's build flushes subnormals (FTZ) and takes the division and the reciprocal from the GPU's
// approximations (div.approx, within 2 ulp; rcp.approx, within 1 ulp). The reference rounds them correctly;
// a GPU's result, given its quotient and reciprocal (Nvfp4Approx), is reproduced exactly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.hpp"  // fp8_encode, fp8_decode

namespace kvrope::reference {

// ---------------------------------------------------------------------------------------------------
// e2m1 (OCP FP4): 1 sign, 2 exponent bits (bias 1), 1 mantissa bit; no Inf, no NaN. Magnitudes of codes
// 0..7: 0, 0.5 (the one subnormal), 1, 1.5, 2, 3, 4, 6.
// ---------------------------------------------------------------------------------------------------

inline constexpr double kE2m1Magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

//! The value of an e2m1 code (low 4 bits; code 8 is -0).
inline double e2m1_decode(uint8_t code) {
  const double m = kE2m1Magnitudes[code & 7];
  return code & 8 ? -m : m;
}

//! The e2m1 code of x from the format's definition: the magnitude nearest |x|, on a tie the one with the even
//! code (its mantissa bit 0), |x| above 6 (Inf too) saturating to 6; the sign bit is x's; NaN gives 0 (the
//! positive zero: what a GPU's canonical NaN, sign clear, becomes). The distances are exact in double for
//! |x| >= 2^-29; below, 0 is the nearest by far whatever their rounding.
inline uint8_t e2m1_encode(double x) {
  if (std::isnan(x)) return 0;
  const double a = std::min(std::fabs(x), 6.0);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - kE2m1Magnitudes[c]), d_best = std::fabs(a - kE2m1Magnitudes[best]);
    if (d < d_best || (d == d_best && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>((std::signbit(x) ? 8 : 0) | best);
}

// ---------------------------------------------------------------------------------------------------
// A block.
// ---------------------------------------------------------------------------------------------------

inline constexpr int kNvfp4Block = 16;

//! A quantized block as stored: the e4m3 scale byte and the 8 code bytes.
struct Nvfp4Block {
  uint8_t scale = 0;
  uint8_t packed[8] = {};
};

//! What a GPU computed for a block's two approximate operations: the quotient q = amax / fl(6·g) (before its
//! e4m3 rounding) and the reciprocal r = 1 / fl(s·g). With them the reference reproduces the GPU's block.
struct Nvfp4Approx {
  float quotient = 0.0f;
  float inv = 0.0f;
};

namespace detail {
inline constexpr double kMinNormal = 1.1754943508222875e-38;  // 2^-126

//! fp32's FTZ: a subnormal becomes a zero of its sign.
inline float ftz(float x) { return std::fabs(x) < kMinNormal ? std::copysign(0.0f, x) : x; }
}  // namespace detail

//! The block's amax (NaN skipped, exact) and whether it is "live": amax and g both at least 2^-126 (FTZ reads
//! a subnormal as 0).
inline double nvfp4_amax(const float* x) {
  double amax = 0.0;
  for (int i = 0; i < kNvfp4Block; ++i)
    if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  return amax;
}

//! The quotient amax / fl(6·g), correctly rounded to fp32 (FTZ), of a live block; 0 otherwise. Beyond 2^126
//! the divisor gives 0 (NaN for an infinite amax), as div.approx does.
inline float nvfp4_quotient(double amax, float global_scale) {
  if (!(amax >= detail::kMinNormal && global_scale >= detail::kMinNormal)) return 0.0f;
  const float divisor = static_cast<float>(6.0 * static_cast<double>(global_scale));  // fp32 step
  if (divisor > std::ldexp(1.0, 126)) return std::isinf(amax) ? std::nanf("") : 0.0f;
  return detail::ftz(static_cast<float>(amax / static_cast<double>(divisor)));  // fp32 step
}

//! The reciprocal 1 / fl(s·g), correctly rounded to fp32 (FTZ: a product below 2^-126 reads as 0, giving
//! Inf), for a live block with s > 0; 0 otherwise.
inline float nvfp4_inverse(double amax, double s, float global_scale) {
  if (!(amax >= detail::kMinNormal && global_scale >= detail::kMinNormal && s > 0.0)) return 0.0f;
  const float denominator = detail::ftz(static_cast<float>(s * static_cast<double>(global_scale)));  // fp32 step
  return detail::ftz(static_cast<float>(1.0 / static_cast<double>(denominator)));                    // fp32 step
}

//! The rule for one block of 16 values (in fp32, as the kernel widens them) under the global scale g. With
//! `gpu`, its quotient and reciprocal replace the correctly rounded ones.
inline Nvfp4Block nvfp4_quantize_block(const float* x, float global_scale, const Nvfp4Approx* gpu = nullptr) {
  Nvfp4Block b;
  const double amax = nvfp4_amax(x);
  const float q = gpu ? gpu->quotient : nvfp4_quotient(amax, global_scale);
  b.scale = fp8_encode(q, Fp8Format::kE4M3);  // RNE, satfinite, NaN 0x7F
  const double s = fp8_decode(b.scale, Fp8Format::kE4M3);
  const float r = gpu ? gpu->inv : nvfp4_inverse(amax, s, global_scale);
  for (int i = 0; i < kNvfp4Block; ++i) {
    const double product = static_cast<double>(detail::ftz(x[i])) * static_cast<double>(r);  // exact (or NaN)
    const float y = static_cast<float>(product);                                             // fp32 step
    b.packed[i / 2] |= static_cast<uint8_t>(e2m1_encode(y) << (4 * (i % 2)));
  }
  return b;
}

//! A row of D values (D a multiple of 16) quantized: `codes` gets D / 2 bytes, `scales` D / 16.
inline void nvfp4_quantize_row(const float* row, int64_t d, float global_scale, uint8_t* codes, uint8_t* scales) {
  for (int64_t blk = 0; blk < d / kNvfp4Block; ++blk) {
    const Nvfp4Block b = nvfp4_quantize_block(row + blk * kNvfp4Block, global_scale);
    scales[blk] = b.scale;
    std::memcpy(codes + blk * (kNvfp4Block / 2), b.packed, sizeof(b.packed));
  }
}

//! The value element i of a quantized row stands for (what NVFP4 attention reads): e2m1 · s · g.
inline double nvfp4_dequantize(const uint8_t* codes, const uint8_t* scales, float global_scale, int64_t i) {
  const uint8_t code = static_cast<uint8_t>(codes[i / 2] >> (4 * (i % 2))) & 0xF;
  return e2m1_decode(code) * fp8_decode(scales[i / kNvfp4Block], Fp8Format::kE4M3) * global_scale;
}

}  // namespace kvrope::reference
