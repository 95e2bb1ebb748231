// Random NVFP4 blocks for the host and GPU tests of kvrope/detail/common/nvfp4.cuh: 16 fp32 values and a
// global scale each, of several kinds (magnitudes over many orders, bf16 values, zero blocks, one huge value,
// subnormals, NaN and Inf elements, exact ties of the e2m1 rounding, quotients at e4m3 rounding boundaries).
#pragma once

#include <kvrope/core/dtype.cuh>
#include <kvrope/reference/cpu_nvfp4.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace kvrope::testing {

struct Nvfp4Case {
  float x[16];
  float g;
  int kind;
};

inline constexpr int kNvfp4CaseKinds = 9;
inline constexpr const char* kNvfp4CaseKindNames[kNvfp4CaseKinds] = {
    "spread", "bf16", "zero", "one huge", "subnormal", "ties", "NaN/Inf", "e4m3 edges", "normal"};

namespace nvfp4_detail {
inline float bits_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline float to_bf16(float x) { return to_float(from_float<__nv_bfloat16>(x)); }
}  // namespace nvfp4_detail

//! A global scale: mostly log-uniform in [1e-3, 1e3], else a power of two in [2^-10, 2^10] or 1. With
//! `extremes`, sometimes one outside FlashInfer's domain (which traps on g <= 0, NaN or Inf): 0, -1, a
//! subnormal, NaN, Inf, 2^-126, 1e-30, 1e30, 2^125.
inline float nvfp4_random_scale(std::mt19937_64& rng, bool extremes) {
  const int pick = static_cast<int>(rng() % 100);
  if (extremes && pick < 6) {
    const float edge[] = {0.0f, -1.0f, 1e-39f, std::nanf(""), INFINITY, 1.17549435e-38f, 1e-30f, 1e30f, 4.2535296e37f};
    return edge[rng() % (sizeof(edge) / sizeof(edge[0]))];
  }
  if (pick < 20) return std::ldexp(1.0f, static_cast<int>(rng() % 21) - 10);
  if (pick < 25) return 1.0f;
  return static_cast<float>(std::pow(10.0, std::uniform_real_distribution<double>(-3.0, 3.0)(rng)));
}

//! `count` random blocks (seeded): each kind in turn, so every kind is well represented.
inline std::vector<Nvfp4Case> nvfp4_random_cases(uint64_t seed, int count, bool extremes) {
  using nvfp4_detail::bits_float;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  auto uniform_int = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1)); };
  auto sign = [&] { return rng() & 1 ? -1.0f : 1.0f; };
  std::vector<Nvfp4Case> cases(count);
  for (int n = 0; n < count; ++n) {
    Nvfp4Case& c = cases[n];
    c.kind = n % kNvfp4CaseKinds;
    c.g = nvfp4_random_scale(rng, extremes);
    float* x = c.x;
    switch (c.kind) {
      case 0:    // magnitudes over many orders, within the block and between blocks
      case 1: {  // the same, in bf16 (what the kernel widens): fewer bits, more exact ties
        const int base = uniform_int(-40, 40);
        for (int i = 0; i < 16; ++i) x[i] = normal(rng) * std::ldexp(1.0f, base + uniform_int(-12, 12));
        if (c.kind == 1)
          for (int i = 0; i < 16; ++i) x[i] = nvfp4_detail::to_bf16(x[i]);
        break;
      }
      case 2:  // zeros of either sign, sometimes with one subnormal
        for (int i = 0; i < 16; ++i) x[i] = sign() * 0.0f;
        if (rng() & 1) x[rng() % 16] = sign() * bits_float(1u + static_cast<uint32_t>(rng() % 0x7FFFFF));
        break;
      case 3: {  // small values and one huge one
        for (int i = 0; i < 16; ++i) x[i] = normal(rng);
        const int e = uniform_int(10, 127);
        x[rng() % 16] = sign() * (e == 127 ? 3.40282347e38f : std::ldexp(1.0f + (rng() % 1000) / 1000.0f, e));
        break;
      }
      case 4:  // subnormals, and values just above 2^-126
        for (int i = 0; i < 16; ++i) {
          const uint32_t mag = rng() % 4 ? static_cast<uint32_t>(rng() % 0x7FFFFF) + 1u  // subnormal
                                         : 0x00800000u + static_cast<uint32_t>(rng() % 0x2000000);
          x[i] = sign() * bits_float(mag);
        }
        break;
      case 5: {  // exact ties: g = 2^k, q = 2^j exact, so x·r lands exactly on e2m1 values and midpoints
        c.g = std::ldexp(1.0f, uniform_int(-20, 20));
        const int j = uniform_int(-9, 8);
        const float unit = std::ldexp(c.g, j);  // s·g
        const float points[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
        for (int i = 0; i < 16; ++i) x[i] = sign() * points[rng() % 14] * unit;
        x[rng() % 16] = sign() * 6.0f * unit;  // amax = 6·2^j·g: q = 2^j
        break;
      }
      case 6: {  // NaN (either sign) and ±Inf elements among normal ones
        for (int i = 0; i < 16; ++i) x[i] = normal(rng) * std::ldexp(1.0f, uniform_int(-10, 10));
        const int specials = uniform_int(1, 3);
        for (int s = 0; s < specials; ++s) {
          const int at = static_cast<int>(rng() % 16);
          x[at] = rng() % 3
                      ? bits_float((rng() & 1 ? 0xFFC00000u : 0x7FC00000u) | static_cast<uint32_t>(rng() % 0x3FFFFF))
                      : sign() * INFINITY;
        }
        break;
      }
      case 7: {  // amax / fl(6·g) within a few ulp of an e4m3 rounding boundary, the largest value and the
                 // underflow threshold 2^-10 included
        const double boundaries[] = {448.0,        464.0,        480.0, 1.0625, 0.015625, 0.0146484375,
                                     0.0009765625, 0.0029296875, 1.0,   17.0,   3.75};
        const double b = rng() % 2 ? boundaries[rng() % 11]
                                   : std::ldexp(1.0 + (2 * uniform_int(0, 7) + 1) / 16.0, uniform_int(-6, 8));
        const float divisor = static_cast<float>(6.0 * c.g);
        float amax = static_cast<float>(b * divisor);
        for (int steps = uniform_int(-3, 3); steps != 0; steps += steps > 0 ? -1 : 1)
          amax = std::nextafter(amax, steps > 0 ? INFINITY : 0.0f);
        for (int i = 0; i < 16; ++i) x[i] = std::fmod(normal(rng), 1.0f) * amax;
        x[rng() % 16] = sign() * amax;
        break;
      }
      default:  // plain normal values
        for (int i = 0; i < 16; ++i) x[i] = normal(rng);
        break;
    }
  }
  return cases;
}

}  // namespace kvrope::testing
