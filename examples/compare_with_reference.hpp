// The examples' comparison of bf16 outputs with the float64 reference (<kvrope/reference/>), which gives
// each output's exact value: a few lines to copy beside your own call of a reference.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <kvrope/reference/common.hpp>

// How many outputs are wrong. A computed output must lie within the tolerance of docs/spec.md §1.7:
// |out - gold| <= ulp_bf16(gold) + 2^-21 * abs_sum, abs_sum being the sum of |products| behind it (the
// reference gives it beside the value).
inline int64_t wrong_computed(const std::vector<__nv_bfloat16>& out, const std::vector<kvrope::reference::Gold>& gold) {
  int64_t wrong = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = __bfloat162float(out[i]), g = gold[i].value;
    const int exponent = g != 0.0 && std::isfinite(g) ? std::max(std::ilogb(g), -126) : -126;
    const double ulp = std::ldexp(1.0, exponent - 7);  // bf16: 7 mantissa bits, subnormals below 2^-126
    if (!(std::isfinite(o) && std::fabs(o - g) <= ulp + std::ldexp(gold[i].abs_sum, -21))) ++wrong;
  }
  return wrong;
}
// A copied output (a value moved as it is, a zeroed row) must be exact.
inline int64_t wrong_copied(const std::vector<__nv_bfloat16>& out, const std::vector<double>& gold) {
  int64_t wrong = 0;
  for (size_t i = 0; i < out.size(); ++i) wrong += __bfloat162float(out[i]) != gold[i] ? 1 : 0;
  return wrong;
}
