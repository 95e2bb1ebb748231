// How a head row splits into units (two chunks a lane handles) under each rotary style and partial rotary.
#pragma once

#include <cstdint>

#include "../../core/rotary.cuh"

namespace kvrope::detail {

//! Where unit u of a row lies: chunks of N elements at `lo` and `hi`; `rotated` unless it is in the
//! pass-through part; `cross`: the pairs span the two chunks (rotate-half, or interleaved with N = 1),
//! else each chunk holds whole pairs (interleaved). The chunks of consecutive units are consecutive, so a
//! warp's access to a row is contiguous in every style. `pair_lo` / `pair_hi`: the table-cache column of
//! each chunk's first element.
struct UnitPlace {
  int lo, hi, pair_lo, pair_hi;  // (validate: D < 2^31)
  bool rotated, cross;
};

template <int N>
__host__ __device__ __forceinline__ UnitPlace unit_place(RotaryStyle style, int64_t rotary_dim, int64_t head_dim,
                                                         int rotary_units, int u) {
  const int r = static_cast<int>(rotary_dim), d = static_cast<int>(head_dim);
  if (u >= rotary_units) {
    const int at = r + (u - rotary_units) * N;
    return {at, at + (d - r) / 2, 0, 0, false, false};
  }
  if (style == RotaryStyle::kInterleaved && N == 1) return {2 * u, 2 * u + 1, u, u, true, true};
  const int at = u * N;
  if (style == RotaryStyle::kRotateHalf) return {at, at + r / 2, at, at, true, true};
  return {at, at + r / 2, at / 2, (at + r / 2) / 2, true, false};
}

}  // namespace kvrope::detail
