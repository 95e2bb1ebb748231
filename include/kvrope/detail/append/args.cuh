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

//! An NVFP4 cache: its code rows (D / 2 bytes), its global scale g (as fp8's scale) and its block-scale
//! rows (D / 16 e4m3 bytes, at the same slot and head).
template <>
struct CacheRows<nvfp4_e2m1x2> {
  PagedCache<nvfp4_e2m1x2> rows;
  const float* scale = nullptr;
  bool per_head = false;
  PagedCache<__nv_fp8_e4m3> block_scales;
};

enum class MropeKind : int { kNone, kContiguous, kInterleaved };

//! Which stream of positions each rotary pair takes its angle from under mRoPE (AppendParams::mrope_section).
//! kContiguous: bound = {s0, s0 + s1}; kInterleaved: bound = {3 s1, 3 s2}, each at most R/2.
struct MropeRule {
  MropeKind kind = MropeKind::kNone;
  int bound[2] = {0, 0};

  //! The stream of pair i (i < R/2), with mRoPE.
  __host__ __device__ __forceinline__ int stream(int i) const {
    if (kind == MropeKind::kInterleaved) {
      const int m = i % 3;
      return m == 1 && i < bound[0] ? 1 : m == 2 && i < bound[1] ? 2 : 0;
    }
    return (i >= bound[0] ? 1 : 0) + (i >= bound[1] ? 1 : 0);
  }
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
  // mRoPE: mrope.kind other than kNone; positions [3, T], position_stream_stride elements a stream
  MropeRule mrope;
  int64_t position_stream_stride;
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

//! The plan's geometry (plan.cuh), what the kernels need of it. A token's rows are numbered j in
//! [0, Hq + 2 H); a tile's rows r = (token in the tile) (Hq + 2 H) + j.
struct AppendGeometry {
  int units;             // units a row: D / (2 N), N the elements of a chunk
  int rotary_units;      // units of the rotated part: R / (2 N)
  int lanes;             // lanes a row (a group): a power of two, at most 32
  FastDivmod div_rows;   // rows a token, Hq + 2 H: a tile's row -> (token, j)
  int table_row_bytes;   // shared bytes of one staged table row: R elements, rounded up to 16
  int table_copy_bytes;  // bytes one asynchronous copy of a table row moves: 16, 8, 4, or 2 (plain copies)
  // kTile:
  int tile_tokens;  // tokens a tile: a block's unit of work, its tables and slots staged
  int row_splits;   // blocks a tile's rows are split over (one-token tiles of a small call), else 1
  int split_rows;   // rows each of them takes
  int64_t tiles;    // ceil(T / tile_tokens) row_splits
  int hash_slots;   // entries of a tile's slot table, a power of two >= 2 tile_tokens (0: no cache rows)
  int ring_bytes;   // shared bytes of the groups' row rings after the staged state (0: none)
  // kToken:
  int token_warps;             // warps a token
  FastDivmod div_token_warps;  // a warp -> its token
};

//! Bytes of one row of the call's table cache: R elements of fp32 or T.
template <typename T, typename C>
__host__ __device__ inline int64_t append_table_bytes(const AppendArgs<T, C>& a) {
  return a.rotary_dim * (a.table_f32 ? int64_t{4} : int64_t{sizeof(T)});
}

}  // namespace kvrope::detail
