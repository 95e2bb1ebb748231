// The append's planner: small pure functions from a call's shape and a few device facts to the launch.
// No CUDA calls: tested on the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../../append_params.cuh"
#include "args.cuh"
#include "policy.cuh"

namespace kvrope::detail {

//! The kernel's view of a call: q's and k's outputs resolved, the table source folded into one pointer.
template <typename T, typename C, typename Pos>
AppendArgs<T, C> append_args(const AppendParams<T, C, Pos>& p) {
  AppendArgs<T, C> a{};
  a.tokens = p.tokens;
  a.heads = p.heads;
  a.q_heads = p.query_heads;
  a.head_dim = p.head_dim;
  a.rotary_dim = effective_rotary_dim(p.rotary_dim, p.head_dim);
  a.style = p.style;
  a.q = p.query;
  a.k = p.key;
  a.v = p.value;
  a.q_out = p.query_out.data != nullptr ? p.query_out : p.query;
  a.k_out = p.key_out;
  if (p.key_in_place) a.k_back = p.key;
  a.positions = p.positions;
  a.positions_are_int64 = sizeof(Pos) == 8;
  a.table_f32 = p.cos_sin_cache_f32 != nullptr;
  a.table = a.table_f32 ? static_cast<const void*>(p.cos_sin_cache_f32) : p.cos_sin_cache;
  a.max_position = p.max_position;
  a.q_norm = p.query_norm_weight;
  a.k_norm = p.key_norm_weight;
  a.norm_eps = p.norm_eps;
  a.norm_offset = p.norm_weight_plus_one ? 1.0f : 0.0f;
  a.k_cache = p.key_cache;
  a.v_cache = p.value_cache;
  a.slots = p.slot_mapping;
  a.num_slots = p.num_pages * p.page_size;
  a.div_page = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.page_size, 1)));
  a.k_scale = p.key_scale;
  a.v_scale = p.value_scale;
  a.scale_per_head = p.scale_per_head;
  a.error_flag = p.error_flag;
  return a;
}

template <typename V>
bool aligned_to(const V& v, int64_t bytes, int64_t elem) {
  return reinterpret_cast<uintptr_t>(v.data) % bytes == 0 && (v.token_stride * elem) % bytes == 0 &&
         (v.head_stride * elem) % bytes == 0;
}
template <typename C>
bool cache_aligned_to(const PagedCache<C>& c, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(c.data) % bytes == 0 && (c.page_stride * int64_t{sizeof(C)}) % bytes == 0 &&
         (c.offset_stride * int64_t{sizeof(C)}) % bytes == 0 && (c.head_stride * int64_t{sizeof(C)}) % bytes == 0;
}

//! Whether chunks of 16 bytes of T fit every row: R / 2 and (D - R) / 2 whole chunks, every row of q,
//! k, v and their outputs and the norm weights 16-byte aligned, the cache rows aligned to a chunk of C.
template <typename T, typename C>
bool append_vectorizable(const AppendArgs<T, C>& a) {
  constexpr int64_t kWide = 16 / sizeof(T), kT = sizeof(T);
  const int64_t cache_bytes = kWide * int64_t{sizeof(C)};
  return a.head_dim % (2 * kWide) == 0 && a.rotary_dim % (2 * kWide) == 0 && aligned_to(a.q, 16, kT) &&
         aligned_to(a.k, 16, kT) && aligned_to(a.v, 16, kT) && aligned_to(a.q_out, 16, kT) &&
         aligned_to(a.k_out, 16, kT) && aligned_to(a.k_back, 16, kT) &&
         reinterpret_cast<uintptr_t>(a.q_norm) % 16 == 0 && reinterpret_cast<uintptr_t>(a.k_norm) % 16 == 0 &&
         cache_aligned_to(a.k_cache, cache_bytes) && cache_aligned_to(a.v_cache, cache_bytes);
}

//! Lanes a row for `units` units: the power of two that holds them, or 32 (each lane then loops).
inline int append_lanes(int units) {
  int lanes = 1;
  while (lanes < units && lanes < 32) lanes *= 2;
  return lanes;
}

//! Bytes a copy of one table row moves: the widest of 16, 8, 4 that divides the row and its start (2:
//! an element at a time).
template <typename T, typename C>
int append_table_copy_bytes(const AppendArgs<T, C>& a) {
  const int64_t row = append_table_bytes(a);
  const auto base = reinterpret_cast<uintptr_t>(a.table);
  for (int bytes : {16, 8, 4})
    if (row % bytes == 0 && base % bytes == 0) return bytes;
  return 2;
}

//! Shared bytes of the row rings: kAppendRowStages rows of two 16-byte chunks a thread, on the vector
//! path of one unit a lane (chunks of 16 bytes); 0 elsewhere (rows held in registers).
template <typename T>
int append_ring_bytes(int n, bool single) {
  return append_has_rings<T>(n, single) ? kAppendRowStages * 2 * 16 * kAppendBlockThreads : 0;
}

//! Most tokens a tile whose staged state fits kAppendSharedBudget: a power of two, at most
//! kAppendTileMaxTokens.
inline int append_tile_max_tokens(int table_row_bytes, bool has_cache_rows) {
  int tokens = kAppendTileMaxTokens;
  while (tokens > 1 &&
         append_shared_layout(tokens, has_cache_rows ? 2 * tokens : 0, table_row_bytes).bytes > kAppendSharedBudget)
    tokens /= 2;
  return tokens;
}

//! Fills the plan part of `a` for chunks of `n` elements, `sms` SMs and `resident` blocks a SM: tiles
//! of consecutive tokens, as few tokens a tile as fill one wave of blocks.
template <typename T, typename C>
void plan_append_launch(AppendArgs<T, C>& a, int n, int sms, int resident, AppendPlan& plan) {
  a.units = static_cast<int>(a.head_dim / (2 * n));
  a.rotary_units = static_cast<int>(a.rotary_dim / (2 * n));
  a.lanes = append_lanes(a.units);
  const int64_t per_token = a.q_heads + 2 * a.heads;
  a.rows = a.tokens * per_token;
  a.div_rows = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(per_token, 1)));
  a.table_row_bytes = static_cast<int>((append_table_bytes(a) + 15) / 16 * 16);
  a.table_copy_bytes = append_table_copy_bytes(a);
  const int64_t capacity = int64_t{sms} * std::max(resident, 1);
  const int64_t wave = (a.tokens + capacity - 1) / capacity;
  a.tile_tokens =
      static_cast<int>(std::clamp<int64_t>(wave, 1, append_tile_max_tokens(a.table_row_bytes, a.heads > 0)));
  // A small call's one-token tiles split over blocks so that a group finishes its rows in one pass
  // (decode at Hq = 64: 80 rows, two passes of one block's 64).
  const bool single = a.units <= 32;
  const int64_t rows_per_pass = kAppendBlockThreads / a.lanes * (single ? kAppendRowsInFlight : 1);
  const int64_t passes = (per_token + rows_per_pass - 1) / rows_per_pass;
  a.row_splits = a.tile_tokens == 1
                     ? static_cast<int>(std::clamp<int64_t>(capacity / a.tokens, 1, std::max<int64_t>(passes, 1)))
                     : 1;
  a.split_rows =
      static_cast<int>(a.row_splits > 1 ? (per_token + a.row_splits - 1) / a.row_splits : a.tile_tokens * per_token);
  a.tiles = (a.tokens + a.tile_tokens - 1) / a.tile_tokens * a.row_splits;
  int hash = 1;
  while (hash < 2 * a.tile_tokens) hash *= 2;
  a.hash_slots = a.heads > 0 ? hash : 0;
  plan.launched = true;
  plan.vec_width = n;
  plan.lanes = a.lanes;
  plan.block = kAppendBlockThreads;
  plan.tile_tokens = a.tile_tokens;
  plan.grid = static_cast<int>(std::clamp<int64_t>(a.tiles, 1, capacity));
  a.ring_bytes = append_ring_bytes<T>(n, single);
  // Few tokens on the vector path with whole 16-byte table runs: a warp a token's rows, nothing staged.
  const bool wide = n * int64_t{sizeof(T)} == 16 && a.table_copy_bytes == 16;
  a.token_warps = 0;
  if (single && wide && a.tokens <= kAppendTokenMaxTokens) {
    const int rows_per_warp = 32 / a.lanes;
    a.token_warps = static_cast<int>((per_token + rows_per_warp - 1) / rows_per_warp);
    a.div_token_warps = FastDivmod(static_cast<uint32_t>(a.token_warps));
    constexpr int kWarps = kAppendTokenBlockThreads / 32;
    plan.block = kAppendTokenBlockThreads;
    plan.grid = static_cast<int>((a.tokens * a.token_warps + kWarps - 1) / kWarps);
    plan.tile_tokens = 1;
  }
  plan.token_warps = a.token_warps;
}

//! Dynamic shared memory of a launch: a tile's staged state, then the row rings (rounded to 16 bytes).
template <typename T, typename C>
int append_shared_bytes(const AppendArgs<T, C>& a) {
  return append_ring_offset(append_shared_layout(a.tile_tokens, a.hash_slots, a.table_row_bytes).bytes) + a.ring_bytes;
}

//! The most dynamic shared memory a tile of this call can take (the occupancy the tile is sized from).
template <typename T, typename C>
int append_most_shared_bytes(const AppendArgs<T, C>& a) {
  const int tokens = append_tile_max_tokens(a.table_row_bytes, a.heads > 0);
  return append_ring_offset(append_shared_layout(tokens, a.heads > 0 ? 2 * tokens : 0, a.table_row_bytes).bytes) +
         a.ring_bytes;
}

}  // namespace kvrope::detail
