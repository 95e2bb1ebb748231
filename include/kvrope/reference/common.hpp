// What the float64 CPU references of the three ops share (cpu_forward.hpp, cpu_backward.hpp,
// cpu_append.hpp): a gold value with the sum of |products| its tolerance needs (docs/spec.md §1.7), the
// cos and sin of a rotation, the position wrap (§1.6) and an element read in double.
#pragma once

#include <cstdint>

#include "../core/dtype.cuh"
#include "../core/rotary.cuh"

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

}  // namespace kvrope::reference
