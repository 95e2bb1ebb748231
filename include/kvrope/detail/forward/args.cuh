// The forward kernel's arguments, and how a head row splits into units (two chunks a lane handles).
#pragma once

#include <cstdint>

#include "../../core/divmod.cuh"
#include "../../core/rotary.cuh"
#include "../../core/tensor.cuh"

namespace kvrope::detail {

//! The forward as its kernel sees it. Heads [0, heads) carry k and v, heads [heads, heads + q_heads)
//! carry q, so that one walk over "heads" covers every row a token writes.
template <typename T>
struct ForwardArgs {
  int64_t batch, heads, seq_len, cache_len, head_dim, rotary_dim;
  RotaryStyle style;
  HeadRows<const T> k, v;
  HeadRows<T> k_cache, v_cache, k_out;
  int64_t q_heads;
  HeadRows<const T> q;
  HeadRows<T> q_out;
  TokenRows<const T> cos, sin;  // per-token tables, or null
  const void* table_cache;      // [max_position, R], or null
  bool table_f32;               // the table cache holds fp32 (else T)
  int64_t max_position;
  const void* position_ids;  // with the table cache
  int64_t position_ids_batch_stride;
  const void* positions;  // cache_position
  bool positions_are_int64;
  int* error_flag;
  int units;             // units a row: D / (2 N), N the elements of a chunk
  int rotary_units;      // units of the rotated part: R / (2 N)
  int64_t items;         // B S (H + Hq) units: a thread's work is one item at a time
  int64_t mask_words;    // 32-bit words of each repeat bitmask (0: no repeat check)
  FastDivmod div_units;  // item -> (rest, unit)
  FastDivmod div_heads;  // rest -> (token, head)
  FastDivmod div_seq;    // token -> (b, t)
};

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
