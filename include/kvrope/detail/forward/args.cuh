// The forward kernel's arguments.
#pragma once

#include <cstdint>

#include "../../core/rotary.cuh"
#include "../../core/tensor.cuh"
#include "../common/divmod.cuh"

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

}  // namespace kvrope::detail
