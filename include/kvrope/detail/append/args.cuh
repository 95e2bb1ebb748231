// The append as its kernels see it: the call's tensors (AppendArgs) and the plan's geometry
// (AppendGeometry), two separate kernel parameters.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "../../append_params.cuh"
#include "../../core/rotary.cuh"
#include "../common/divmod.cuh"

namespace kvrope::detail {

//! Rows of a cache addressed by slot, with the scale its values are divided by: the cache format.
//! C = T stores the rows as they are; fp8 quantizes (formats.cuh: the one store path).
template <typename C>
struct CacheRows {
  PagedCache<C> rows;
  const float* scale = nullptr;  // fp8: null (1), one float, or [H] with per_head
  bool per_head = false;
};

//! The call's tensors, q's and k's outputs resolved. A token's rows are numbered j in [0, Hq + 2 H):
//! q heads, then k heads, then v heads.
template <typename T, typename C>
struct AppendArgs {
  int64_t tokens, heads, q_heads, head_dim, rotary_dim;
  RotaryStyle style;
  TokenHeads<const T> q, k, v;
  TokenHeads<T> q_out;                  // q's rotated rows in T: query_out, query itself, or null (fp8 out)
  TokenHeads<__nv_fp8_e4m3> q_out_fp8;  // or q's rotated rows in fp8
  const float* q_scale;                 // q_out_fp8's scale (null: 1)
  TokenHeads<T> k_out;                  // or null
  TokenHeads<T> k_back;                 // key itself with key_in_place, else null
  const void* positions;
  bool positions_are_int64;
  const void* table;  // [max_position, R] in T or fp32
  bool table_f32;
  int64_t max_position;
  const T* q_norm;  // [D] or null
  const T* k_norm;
  float norm_eps;
  float norm_offset;  // 1 with norm_weight_plus_one, else 0
  CacheRows<C> k_cache, v_cache;
  const int64_t* slots;
  int64_t num_slots;  // num_pages P
  FastDivmod div_page;
  int* error_flag;
};

//! The plan's geometry (plan.cuh), what the kernels need of it.
struct AppendGeometry {
  int units;         // units a row: D / (2 N), N the elements of a chunk
  int rotary_units;  // units of the rotated part: R / (2 N)
  int lanes;         // lanes a row (a group): a power of two, at most 32
  int per_token;     // rows a token: Hq + 2 H
  int slices;        // groups a token's rows are dealt over: slice s takes rows s, s + slices, ...
  FastDivmod div_slices;  // kToken: a group's index -> (token, slice)
  int table_row_bytes;    // bytes of a table row: R elements of fp32 or T
  bool table_runs;        // the table rows allow whole aligned runs (vector loads) of a unit's angles
  int tile_tokens;        // kTile: tokens a tile, a block's unit of work
  int64_t tiles;          // kTile: ceil(T / tile_tokens)
  int hash_slots;         // kTile: entries of a tile's slot table, a power of two >= 2 tile_tokens (0: no cache rows)
};

}  // namespace kvrope::detail
