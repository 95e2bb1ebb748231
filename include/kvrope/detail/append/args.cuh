// The append kernel's arguments.
#pragma once

#include <cstdint>

#include "../../append_params.cuh"
#include "../../core/rotary.cuh"
#include "../common/divmod.cuh"

namespace kvrope::detail {

//! The append as its kernel sees it. A token's rows are numbered j in [0, Hq + 2 H): q heads, then k
//! heads, then v heads, so that one walk over rows covers every row a token writes.
template <typename T, typename C>
struct AppendArgs {
  int64_t tokens, heads, q_heads, head_dim, rotary_dim;
  RotaryStyle style;
  TokenHeads<const T> q, k, v;
  TokenHeads<T> q_out;   // q's rotated rows: query_out, or query itself
  TokenHeads<T> k_out;   // or null
  TokenHeads<T> k_back;  // key itself with key_in_place, else null
  const void* positions;
  bool positions_are_int64;
  const void* table;  // [max_position, R] in T or fp32
  bool table_f32;
  int64_t max_position;
  const T* q_norm;  // [D] or null
  const T* k_norm;
  float norm_eps;
  float norm_offset;  // 1 with norm_weight_plus_one, else 0
  PagedCache<C> k_cache, v_cache;
  const int64_t* slots;
  int64_t num_slots;  // num_pages P
  FastDivmod div_page;
  const float* k_scale;  // fp8 caches: null (1), one float, or [H]
  const float* v_scale;
  bool scale_per_head;
  int* error_flag;
  // The plan (plan.cuh):
  int units;            // units a row: D / (2 N), N the elements of a chunk
  int rotary_units;     // units of the rotated part: R / (2 N)
  int lanes;            // lanes a row: a power of two, at most 32
  int64_t rows;         // T (Hq + 2 H)
  int64_t mask_words;   // 32-bit words of each repeat bitmask (0: no repeat check)
  FastDivmod div_rows;  // row -> (token, j)
};

}  // namespace kvrope::detail
