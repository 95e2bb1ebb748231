// What the float64 CPU references share (cpu_forward.hpp, cpu_backward.hpp, cpu_append.hpp, cpu_mla.hpp): a
// gold value with the sum of |products| its tolerance needs (docs/spec.md §1.7), the cos and sin of a rotation
// (from a table cache) and one rotated element, the position wrap (§1.6), an element read in double, the fp8
// encoder written from the formats' definition (what an fp8 cache stores), and the slots' rules of the
// appends (§6.4: which token writes a slot, which error bits a call may leave).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../core/dtype.cuh"
#include "../core/rotary.cuh"
#include "../error_flag.cuh"

namespace kvrope::reference {

//! A value of the reference and the sum of the absolute values of its products: what the tolerance of
//! docs/spec.md §1.7 bounds an output with, |out - value| <= ulp_T(value) + 2^-21 * abs_sum. A copy has
//! abs_sum 0 and a value exact in T.
struct Gold {
  double value = 0.0;
  double abs_sum = 0.0;
};

//! The cos and sin one element is rotated with.
struct Angle {
  double cos = 1.0;
  double sin = 0.0;
};

namespace detail {
//! A cache_position wrapped as in PyTorch indexing (docs/spec.md §1.6): the row, or -1 outside [-S_max, S_max).
inline int64_t wrap_row(int64_t position, int64_t cache_len) {
  if (position < 0) position += cache_len;
  return (position >= 0 && position < cache_len) ? position : -1;
}
}  // namespace detail

//! The rotary dim R of a call (forward or backward parameters): rotary_dim, or D when it is 0.
template <typename Params>
int64_t rotary_dim_of(const Params& p) {
  return effective_rotary_dim(p.rotary_dim, p.head_dim);
}

//! The row of the cache token t was (or is) written to, or -1 when its position is out of range (the
//! wrap of docs/spec.md §1.6); either op's parameters.
template <typename Params>
int64_t cache_row(const Params& p, int64_t t) {
  return detail::wrap_row(static_cast<int64_t>(p.cache_position[t]), p.cache_len);
}

//! True when every position is in [-S_max, S_max) (else the kernel must raise the error flag).
template <typename Params>
bool positions_in_range(const Params& p) {
  for (int64_t t = 0; t < p.seq_len; ++t)
    if (cache_row(p, t) < 0) return false;
  return true;
}

namespace detail {
template <typename T>
double at(const T* row, int64_t d) {
  return to_float(row[d]);
}
}  // namespace detail

//! The cos and sin of column c < R/2 of row `row` of a table cache [max_position, R] (cos in columns
//! [0, R/2), sin in [R/2, R)): from `table_f32` when it is not null, else from `table` (in T).
template <typename T>
Angle table_angle(const float* table_f32, const T* table, int64_t R, int64_t row, int64_t c) {
  if (table_f32) return {table_f32[row * R + c], table_f32[row * R + R / 2 + c]};
  return {detail::at(table + row * R, c), detail::at(table + row * R, R / 2 + c)};
}

//! Element e < R of the rotation of a row y (float64) by the angle `a` of its pair (docs/spec.md §2.4):
//! y[a]·cos − y[b]·sin for the first element a of the pair, y[b]·cos + y[a]·sin for the second; with
//! abs_sum the sum of |products|.
inline Gold rotated_element(RotaryStyle style, int64_t R, const double* y, int64_t e, Angle a) {
  const double yc = y[e] * a.cos;
  const double ys = y[rotary_partner(style, R, e)] * a.sin;
  return {rotary_first(style, R, e) ? yc - ys : yc + ys, std::fabs(yc) + std::fabs(ys)};
}

// ---------------------------------------------------------------------------------------------------
// fp8 (OCP 8-bit floating point: E4M3 of "fn" flavour, E5M2), from the formats' definition.
//   E4M3: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinity; S.1111.111 is NaN, so the
//         largest finite value is S.1111.110 = 1.75 * 2^8 = 448. Subnormals m * 2^-9, m = 1..7.
//   E5M2: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: exponent 31 is Inf / NaN,
//         the largest finite value is 1.75 * 2^15 = 57344. Subnormals m * 2^-16, m = 1..3.
// ---------------------------------------------------------------------------------------------------

enum class Fp8Format { kE4M3, kE5M2 };

//! The shape of an fp8 format.
struct Fp8Spec {
  int mantissa_bits;
  int bias;
  double max_finite;
};

constexpr Fp8Spec fp8_spec(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Fp8Spec{3, 7, 448.0} : Fp8Spec{2, 15, 57344.0};
}

template <typename C>
constexpr Fp8Format fp8_format_of() {
  static_assert(kIsFp8<C>, "C must be __nv_fp8_e4m3 or __nv_fp8_e5m2");
  return std::is_same_v<C, __nv_fp8_e4m3> ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
}

//! Encodes x in fp8 with round-to-nearest-even and saturation to the largest finite value (satfinite:
//! values beyond it, infinities included, become +-max). NaN becomes 0x7F (the canonical NaN the
//! hardware's cvt.rn.satfinite and CUDA's host conversion give). The sign of zero is kept.
inline uint8_t fp8_encode(float x, Fp8Format f) {
  if (std::isnan(x)) return 0x7F;
  const Fp8Spec s = fp8_spec(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));  // exact
  const int min_normal_exp = 1 - s.bias;
  // The quantum (spacing of the format) at a: 2^(e - m) in a normal binade, 2^(1 - bias - m) below.
  const int e = a >= std::ldexp(1.0, min_normal_exp) ? std::ilogb(a) : min_normal_exp;
  const double quantum = std::ldexp(1.0, e - s.mantissa_bits);
  double v = 0.0;
  if (std::isinf(a)) {
    v = s.max_finite;
  } else {
    const double m = a / quantum;  // exact: a power-of-two scaling of a value with 24 significant bits
    double r = std::floor(m);
    const double frac = m - r;
    if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;  // to nearest, ties to even
    v = std::min(r * quantum, s.max_finite);                                // satfinite
  }
  if (v == 0.0) return sign;
  const int ve = std::max(std::ilogb(v), min_normal_exp);
  const int exponent_field = v >= std::ldexp(1.0, min_normal_exp) ? ve + s.bias : 0;
  // Normal: v = (1 + mantissa / 2^m) 2^ve; subnormal: v = mantissa 2^(1 - bias - m).
  const double significand = std::ldexp(v, s.mantissa_bits - ve);
  const int mantissa_field = static_cast<int>(significand) - (exponent_field ? (1 << s.mantissa_bits) : 0);
  return static_cast<uint8_t>(sign | (exponent_field << s.mantissa_bits) | mantissa_field);
}

//! The value of an fp8 code (NaN for the NaN codes, +-Inf for E5M2's infinities).
inline double fp8_decode(uint8_t bits, Fp8Format f) {
  const Fp8Spec s = fp8_spec(f);
  const int mantissa_field = bits & ((1 << s.mantissa_bits) - 1);
  const int exponent_field = (bits & 0x7F) >> s.mantissa_bits;
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const int all_ones = (1 << (7 - s.mantissa_bits)) - 1;
  if (f == Fp8Format::kE4M3 && exponent_field == all_ones && mantissa_field == (1 << s.mantissa_bits) - 1)
    return std::nan("");
  if (f == Fp8Format::kE5M2 && exponent_field == all_ones) return mantissa_field ? std::nan("") : sign * HUGE_VAL;
  if (exponent_field == 0) return sign * std::ldexp(mantissa_field, 1 - s.bias - s.mantissa_bits);
  return sign * std::ldexp((1 << s.mantissa_bits) + mantissa_field, exponent_field - s.bias - s.mantissa_bits);
}

//! The code of an fp8 element.
template <typename C>
uint8_t fp8_bits(const C& c) {
  static_assert(sizeof(C) == 1, "an fp8 type");
  uint8_t b;
  std::memcpy(&b, &c, 1);
  return b;
}

//! What a cache of fp8 type C stores for a value x in T (docs/spec.md §6): fp8_satfinite(x / scale),
//! the quotient float(x) / scale taken in fp32 (IEEE division, one rounding), then encoded.
template <typename C, typename T>
uint8_t quantize(T x, float scale) {
  const volatile float q = to_float(x) / scale;  // volatile: one fp32 rounding, whatever the host flags
  return fp8_encode(q, fp8_format_of<C>());
}

//! The scale of head h: null means 1, else one float, or one a head with per_head.
inline float scale_of(const float* scale, bool per_head, int64_t h) {
  if (scale == nullptr) return 1.0f;
  return per_head ? scale[h] : scale[0];
}

//! The error flag's bits a call may leave: `required` ones it must set, and no bit outside `allowed`.
struct AppendFlag {
  int required = 0;
  int allowed = 0;
  bool accepts(int flag) const { return (flag & required) == required && (flag & ~allowed) == 0; }
};

namespace detail {
template <typename C>
double cache_value(const C& c) {
  if constexpr (kIsFp8<C>)
    return fp8_decode(fp8_bits(c), fp8_format_of<C>());
  else
    return to_float(c);
}
// A double rounded to T, to nearest (through fp32: exact for the small hand-made cases it serves).
template <typename T>
T round_to(double x) {
  return from_float<T>(static_cast<float>(x));
}

// The flag of an append over `tokens` tokens (docs/spec.md §6.4): a token whose position is not valid
// (valid(t) false) must set kErrorPositionIdOutOfRange; a valid token whose slot is at or above `slots`
// must set kErrorSlotOutOfRange; an invalid token with such a slot may set it or not (whether its slot
// is read is left open). Null slot_mapping: no slot is read.
template <typename Valid>
AppendFlag slots_flag(int64_t tokens, const int64_t* slot_mapping, int64_t slots, Valid valid) {
  AppendFlag f;
  for (int64_t t = 0; t < tokens; ++t) {
    const bool ok = valid(t);
    if (!ok) f.required |= kErrorPositionIdOutOfRange;
    if (slot_mapping && slot_mapping[t] >= slots) {
      f.allowed |= kErrorSlotOutOfRange;
      if (ok) f.required |= kErrorSlotOutOfRange;
    }
  }
  f.allowed |= f.required;
  return f;
}

// For each slot of [0, slots), the token that writes it last, or -1: the largest t naming it whose
// position is valid (a token writing nothing does not count). Negative and out-of-range slots name no
// slot. Null slot_mapping: none.
template <typename Valid>
std::vector<int64_t> last_writers(int64_t tokens, const int64_t* slot_mapping, int64_t slots, Valid valid) {
  std::vector<int64_t> writer(static_cast<size_t>(std::max<int64_t>(slots, 0)), -1);
  for (int64_t t = 0; t < tokens && slot_mapping; ++t) {
    const int64_t s = slot_mapping[t];
    if (s >= 0 && s < slots && valid(t)) writer[static_cast<size_t>(s)] = t;
  }
  return writer;
}
}  // namespace detail

}  // namespace kvrope::reference
