// Inputs for the host and GPU tests of the fp8 store's quotient (kvrope/detail/append/formats.cuh: float(x) /
// scale as fp32's division rounds it, taken as an fp64 product): scales of every awkward kind, and fp32 values
// where the codes vary; every bf16 and fp16 value.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

namespace kvrope::testing {

//! `count` scales (at least 19): the suites', awkward significands (all ones, one past a power of two), powers
//! of two, extremes (a subnormal, FLT_MAX), a negative one, then random ones over 2^-40 .. 2^40.
inline std::vector<float> fp8_store_scales(size_t count, uint32_t seed) {
  std::vector<float> s = {1.0f,   0.0125f, 0.015f,        0.02f,         1.0f / 3.0f,    0.7f,     1.1f,
                          3.0f,   448.0f,  0x1.fffffep0f, 0x1.000002p0f, 0x1.fffffep-1f, 0x1p-20f, 0x1p20f,
                          1e-30f, 1e30f,   1e-40f,        3.4e38f,       -0.5f};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-40.0f, 40.0f);
  while (s.size() < count) s.push_back(std::exp2(exponent(rng)));
  return s;
}

//! `count` fp32 values of random sign and significand, exponents over 2^-30 .. 2^30 (where the fp8 codes vary).
inline std::vector<float> fp8_store_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
  std::vector<float> f;
  while (f.size() < count) {
    const float m = 1.0f + static_cast<float>(bits(rng) >> 9) * 0x1p-23f;
    f.push_back((bits(rng) & 1 ? -m : m) * std::exp2(std::floor(exponent(rng))));
  }
  return f;
}

//! Every value of a 16-bit T (__nv_bfloat16 or __half): its 65,536 bit patterns in order, NaNs included.
template <typename T>
inline std::vector<T> every_16bit_value() {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "every_16bit_value: bf16 or fp16");
  using Raw = std::conditional_t<std::is_same_v<T, __half>, __half_raw, __nv_bfloat16_raw>;
  std::vector<T> v;
  v.reserve(0x10000);
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    Raw raw;
    raw.x = static_cast<unsigned short>(bits);
    v.push_back(T(raw));
  }
  return v;
}

}  // namespace kvrope::testing
