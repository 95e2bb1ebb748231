// The append kernel's arguments.
#pragma once

#include <cstdint>

#include "../../append_params.cuh"
#include "../../core/rotary.cuh"
#include "../common/divmod.cuh"

namespace kvrope::detail {

//! Where a tile's staged state lies in dynamic shared memory (byte offsets), and its size: the table
//! rows [tile_tokens][table_row_bytes], each token's slot to write, and the slot table (keys, the last
//! token of the tile naming each, whether a later token names it).
struct AppendShared {
  int table, slots, keys, last, later, bytes;
};

__host__ __device__ inline AppendShared append_shared_layout(int tile_tokens, int hash_slots, int table_row_bytes) {
  AppendShared s{};
  s.table = 0;
  s.slots = tile_tokens * table_row_bytes;  // (a multiple of 16)
  s.keys = s.slots + tile_tokens * 8;
  s.last = s.keys + hash_slots * 8;
  s.later = s.last + hash_slots * 4;
  s.bytes = s.later + hash_slots * 4;
  return s;
}

//! Whether the instance with chunks of N elements of T (single: one unit a lane) loads its rows through
//! rings in shared memory (16-byte chunks); else its rows are held in registers.
template <typename T>
__host__ __device__ constexpr bool append_has_rings(int n, bool single) {
  return single && n * static_cast<int>(sizeof(T)) == 16;
}

//! Where the row rings start: after the staged state, at a 16-byte boundary.
__host__ __device__ inline int append_ring_offset(int staged_bytes) { return (staged_bytes + 15) / 16 * 16; }

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
  int units;                   // units a row: D / (2 N), N the elements of a chunk
  int rotary_units;            // units of the rotated part: R / (2 N)
  int lanes;                   // lanes a row: a power of two, at most 32
  int64_t rows;                // T (Hq + 2 H)
  FastDivmod div_rows;         // a tile's row -> (token, j)
  int tile_tokens;             // tokens a tile: a block's unit of work, its tables and slots staged
  int row_splits;              // blocks a tile's rows are split over (one-token tiles of a small call), else 1
  int split_rows;              // rows each of them takes
  int64_t tiles;               // ceil(T / tile_tokens) row_splits
  int hash_slots;              // entries of a tile's slot table, a power of two >= 2 tile_tokens (0: no cache rows)
  int table_row_bytes;         // shared bytes of one staged table row: R elements, rounded up to 16
  int table_copy_bytes;        // bytes one asynchronous copy of a table row moves: 16, 8, 4, or 2 (plain copies)
  int ring_bytes;              // shared bytes of the groups' row rings after the staged state (0: none)
  int token_warps;             // the few-token path (token_kernel.cuh): warps a token, else 0 (tiles)
  FastDivmod div_token_warps;  // a warp -> its token
};

//! Bytes of one row of the call's table cache: R elements of fp32 or T.
template <typename T, typename C>
__host__ __device__ inline int64_t append_table_bytes(const AppendArgs<T, C>& a) {
  return a.rotary_dim * (a.table_f32 ? int64_t{4} : int64_t{sizeof(T)});
}

}  // namespace kvrope::detail
