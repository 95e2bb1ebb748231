// The MLA append as its kernel sees it: the call's tensors, q's outputs resolved (MlaArgs), and the plan's
// geometry (MlaGeometry), two separate kernel parameters; the launch values.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "../../append_params.cuh"
#include "../../core/rotary.cuh"
#include "../../mla_append_params.cuh"
#include "../common/divmod.cuh"

namespace kvrope::detail {

//! Threads a block: 4 warps, so that a decode call's few warps still spread over many SMs.
inline constexpr int kMlaBlockThreads = 128;
//! Blocks a SM the launch bounds ask for: 80 registers a thread, 8 bytes spilled (a copy warp's row flags, once)
//! (the fp8 stores' fp64 quotients took 96 unbounded: 20 warps a SM, where prefill's copy and query rows want 24).
inline constexpr int kMlaBlocksPerSm = 6;
//! Most tokens a latent tile: a block stages their slots and a slot table and scans the later tokens' slots
//! once for all of them (a warp a token scanned every later slot: O(T^2) loads), then its warps write their
//! rows. A tile holds 4, 8, 16 or 32 tokens (plan.cuh): as few as keep the tiles at most kMlaLatentTiles.
inline constexpr int kMlaTileTokens = 32;
//! Latent tiles a call's tokens fill before a tile grows past a row a warp: a row a warp waits for its position
//! and then its table row (two round trips), so 32-token tiles of 8 rows a warp took 16 us for 2,048 tokens;
//! 512 tiles keep the scans of later slots at most T / 2 loads a block.
inline constexpr int kMlaLatentTiles = 512;
//! Entries of a latent tile's slot table (open addressing): a power of two, twice the tile's tokens.
inline constexpr int kMlaHashSlots = 2 * kMlaTileTokens;
static_assert(kMlaTileTokens <= kMlaBlockThreads, "a thread stages each token of a latent tile");
//! Rows of q_nope a copy warp takes, and chunks of each a lane loads before it stores any: DeepSeek's N = 512
//! in 16-bit T is 64 chunks a row, so a lane holds 8 chunks in flight, and a decode call's copy waits for its
//! positions and then its rows (in the query rows' warps, after their rotation, it took two round trips more:
//! 8.7 us a T = 1 call with q in fp8). A chunk a lane in one flat range of chunks, each finding its row and
//! position, made the copy issue-bound: 478 us at 8 x 512 tokens, Hq 128, against 349 (performance log #53).
inline constexpr int kMlaCopyRows = 4;
//! Most rows of q_nope (T Hq) copied a row a warp, else kMlaCopyRows a warp: a small call's conversions to fp8
//! spread over as many warps as rows (performance log #55: T = 1 -0.6 us; at 4,096 rows a row a warp lost).
inline constexpr int64_t kMlaCopyOneRowMax = 1024;
inline constexpr int kMlaCopyRowLoads = 2;
//! The sizes the fixed instance is compiled for (DeepSeek-V2/V3, Kimi K2): L = 512, R = 64.
inline constexpr int kMlaFixedLatentDim = 512;
inline constexpr int kMlaFixedRotaryDim = 64;

//! The call's tensors. q's outputs resolved: RoPE(q_pe) goes to q_rot (q_pe itself in place, or query_out + N)
//! or q_rot8 (query_out_fp8 + N), q_nope's copy to q_copy or q_copy8 (null: none).
template <typename T, typename C>
struct MlaArgs {
  int64_t tokens, q_heads, nope_dim, rotary_dim, latent_dim;
  RotaryStyle style;
  TokenHeads<const T> q_pe, q_nope;
  TokenHeads<T> q_rot, q_copy;
  TokenHeads<__nv_fp8_e4m3> q_rot8, q_copy8;
  const float* q_scale;  // q_rot8's scale (null: 1)
  const T* kv_c;
  int64_t kv_c_stride;
  const T* k_pe;
  int64_t k_pe_stride;
  const void* positions;
  bool positions_are_int64;
  const void* table;  // [max_position, R] in T or fp32
  bool table_f32;
  int64_t max_position;
  MlaCacheRows<C> latent, rope;
  const float* kv_scale;  // fp8 caches (null: 1)
  const int64_t* slots;
  int64_t num_slots;  // num_pages P
  FastDivmod div_page;
  int* error_flag;
};

//! The plan's geometry (plan.cuh), three roles by block: blocks [0, latent_blocks) take a latent tile each
//! (tile_tokens tokens); the warps of the next query_blocks take query rows, query_warps a token (its warp w
//! rows [w 32 / q_lanes, (w + 1) 32 / q_lanes), q_lanes lanes a row); the warps of the rest copy q_nope,
//! copy_rows rows each (rows token Hq + head).
struct MlaGeometry {
  int rot_units;      // units of a rotated row (q_pe, k_pe): R / (2 n), n the elements of a chunk
  int nope_chunks;    // chunks of q_nope a query row copies: N / n with a copy, else 0
  int latent_chunks;  // chunks of kv_c: L / n
  int q_lanes;        // lanes a query row: the power of two that holds its rot_units, at most 32
  int query_warps;    // ceil(Hq q_lanes / 32)
  int tile_tokens;    // tokens a latent tile: 4, 8, 16 or 32 (a row a warp up to 8 rows a warp)
  int latent_blocks;  // ceil(T / tile_tokens)
  int query_blocks;   // ceil(T query_warps / 4)
  int copy_rows;      // rows of q_nope a copy warp: 1 while T Hq <= kMlaCopyOneRowMax, else kMlaCopyRows
  FastDivmod div_query_warps;
  FastDivmod div_heads;  // a q_nope row (token Hq + head) to its token
};

//! Bytes of one row of the call's table cache: R elements of fp32 or T.
template <typename T, typename C>
__host__ __device__ inline int64_t mla_table_bytes(const MlaArgs<T, C>& a) {
  return a.rotary_dim * (a.table_f32 ? int64_t{4} : int64_t{sizeof(T)});
}

}  // namespace kvrope::detail
