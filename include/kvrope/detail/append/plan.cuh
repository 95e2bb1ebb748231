// The append's planner: small pure functions from a call's shape and two device facts (SMs, and the tile
// kernel's resident blocks a SM) to the launch. The path follows from the shape alone. No CUDA calls:
// tested on the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../../append_params.cuh"
#include "args.cuh"
#include "policy.cuh"
#include "tile.cuh"

namespace kvrope::detail {

//! The kernels' view of a call: q's and k's outputs resolved, the table source folded into one pointer.
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
  a.q_out_fp8 = p.query_out_fp8;
  a.q_scale = p.query_scale;
  if (p.query_out_fp8.data == nullptr) a.q_out = p.query_out.data != nullptr ? p.query_out : p.query;
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
  a.k_cache = {p.key_cache, p.key_scale, p.scale_per_head};
  a.v_cache = {p.value_cache, p.value_scale, p.scale_per_head};
  a.slots = p.slot_mapping;
  a.num_slots = p.num_pages * p.page_size;
  a.div_page = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.page_size, 1)));
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
//! k, v and their outputs and the norm weights 16-byte aligned, the fp8 rows and the cache rows aligned
//! to a chunk of their element type.
template <typename T, typename C>
bool append_vectorizable(const AppendArgs<T, C>& a) {
  constexpr int64_t kWide = 16 / sizeof(T), kT = sizeof(T);
  const int64_t cache_bytes = kWide * int64_t{sizeof(C)};
  return a.head_dim % (2 * kWide) == 0 && a.rotary_dim % (2 * kWide) == 0 && aligned_to(a.q, 16, kT) &&
         aligned_to(a.k, 16, kT) && aligned_to(a.v, 16, kT) && aligned_to(a.q_out, 16, kT) &&
         aligned_to(a.q_out_fp8, kWide, 1) && aligned_to(a.k_out, 16, kT) && aligned_to(a.k_back, 16, kT) &&
         reinterpret_cast<uintptr_t>(a.q_norm) % 16 == 0 && reinterpret_cast<uintptr_t>(a.k_norm) % 16 == 0 &&
         cache_aligned_to(a.k_cache.rows, cache_bytes) && cache_aligned_to(a.v_cache.rows, cache_bytes);
}

//! Lanes a row for `units` units: the power of two that holds them, or 32 (each lane then loops).
inline int append_lanes(int units) {
  int lanes = 1;
  while (lanes < units && lanes < 32) lanes *= 2;
  return lanes;
}

//! The path of a call of `tokens` tokens with rows to write: few tokens take the few-token path.
inline AppendPath append_path(int64_t tokens, int64_t rows_a_token) {
  if (tokens == 0 || rows_a_token == 0) return AppendPath::kNone;
  return tokens <= kAppendTokenMaxTokens ? AppendPath::kToken : AppendPath::kTile;
}

//! Shared bytes of a tile of `tile_tokens` tokens (its slot table only when the call writes cache rows).
inline int append_tile_shared_bytes(int tile_tokens, bool has_cache_rows) {
  int hash = 1;
  while (hash < 2 * tile_tokens) hash *= 2;
  return tile_layout(tile_tokens, has_cache_rows ? hash : 0).bytes;
}

//! The plan of a call on path `path` (append_path) for chunks of `n` elements; the tile path also needs
//! `sms` SMs and `resident` tile blocks a SM. Fills the kernels' geometry `g` and the reported `plan`.
template <typename T, typename C>
void plan_append_geometry(const AppendArgs<T, C>& a, AppendPath path, int n, int sms, int resident, AppendGeometry& g,
                 AppendPlan& plan) {
  g = AppendGeometry{};
  plan = AppendPlan{};
  plan.path = path;
  if (path == AppendPath::kNone) return;
  g.units = static_cast<int>(a.head_dim / (2 * n));
  g.rotary_units = static_cast<int>(a.rotary_dim / (2 * n));
  g.lanes = append_lanes(g.units);
  g.per_token = static_cast<int>(a.q_heads + 2 * a.heads);
  g.table_row_bytes = static_cast<int>(a.rotary_dim * (a.table_f32 ? 4 : int64_t{sizeof(T)}));
  g.table_runs = n == 1 || (reinterpret_cast<uintptr_t>(a.table) % 16 == 0 && g.table_row_bytes % 16 == 0);
  const int warp_groups = 32 / g.lanes;
  plan.launched = true;
  plan.vec_width = n;
  plan.lanes = g.lanes;
  if (path == AppendPath::kToken) {
    // A group a row (kAppendTokenRowsPerGroup), a token's groups whole warps.
    const int groups = (g.per_token + kAppendTokenRowsPerGroup - 1) / kAppendTokenRowsPerGroup;
    g.slices = (groups + warp_groups - 1) / warp_groups * warp_groups;
    g.div_slices = FastDivmod(static_cast<uint32_t>(g.slices));
    const int64_t threads = a.tokens * g.slices * g.lanes;
    plan.block = kAppendTokenBlockThreads;
    plan.grid = static_cast<int>((threads + plan.block - 1) / plan.block);
    plan.tile_tokens = 1;
  } else {
    // Tiles of consecutive tokens, as few tokens a tile as fill one wave of blocks; a block's groups
    // dealt over the tile's tokens (several a token when the tile has fewer tokens than groups).
    const int64_t capacity = int64_t{sms} * std::max(resident, 1);
    const int64_t wave = (a.tokens + capacity - 1) / capacity;
    g.tile_tokens = static_cast<int>(std::clamp<int64_t>(wave, 1, kAppendTileMaxTokens));
    int tile = 1;
    while (tile < g.tile_tokens) tile *= 2;
    g.tile_tokens = tile;
    g.tiles = (a.tokens + g.tile_tokens - 1) / g.tile_tokens;
    const int groups = kAppendBlockThreads / g.lanes;
    int slices = 1;
    while (slices * g.tile_tokens < groups && slices < g.per_token) slices *= 2;
    g.slices = slices;
    g.div_slices = FastDivmod(static_cast<uint32_t>(slices));
    int hash = 1;
    while (hash < 2 * g.tile_tokens) hash *= 2;
    g.hash_slots = a.heads > 0 ? hash : 0;
    plan.block = kAppendBlockThreads;
    plan.grid = static_cast<int>(std::clamp<int64_t>(g.tiles, 1, capacity));
    plan.shared_bytes = tile_layout(g.tile_tokens, g.hash_slots).bytes;
    plan.tile_tokens = g.tile_tokens;
  }
  plan.slices = g.slices;
}

}  // namespace kvrope::detail
