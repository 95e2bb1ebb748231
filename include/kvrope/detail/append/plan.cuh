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
  if (has_mrope(p)) {
    // (validate: each section in [0, R/2]; a bound past the last pair changes nothing)
    const int64_t* s = p.mrope_section;
    const int64_t pairs = a.rotary_dim / 2;
    a.mrope.kind = p.mrope_interleaved ? MropeKind::kInterleaved : MropeKind::kContiguous;
    a.mrope.bound[0] = static_cast<int>(p.mrope_interleaved ? std::min(3 * s[1], pairs) : s[0]);
    a.mrope.bound[1] = static_cast<int>(p.mrope_interleaved ? std::min(3 * s[2], pairs) : s[0] + s[1]);
    a.position_stream_stride = p.position_stream_stride;
  }
  a.table_f32 = p.cos_sin_cache_f32 != nullptr;
  a.table = a.table_f32 ? static_cast<const void*>(p.cos_sin_cache_f32) : p.cos_sin_cache;
  a.max_position = p.max_position;
  a.q_norm = p.query_norm_weight;
  a.k_norm = p.key_norm_weight;
  a.norm_eps = p.norm_eps;
  a.norm_offset = p.norm_weight_plus_one ? 1.0f : 0.0f;
  a.k_cache.rows = p.key_cache;
  a.k_cache.scale = p.key_scale;
  a.v_cache.rows = p.value_cache;
  a.v_cache.scale = p.value_scale;
  a.k_cache.per_head = a.v_cache.per_head = p.scale_per_head;
  if constexpr (kIsNvfp4<C>) {
    a.k_cache.block_scales = p.key_block_scales;
    a.v_cache.block_scales = p.value_block_scales;
  }
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

//! Bytes of a chunk of 16 bytes of T as a cache row of C holds it (NVFP4: two values a byte).
template <typename T, typename C>
constexpr int64_t cache_chunk_bytes() {
  constexpr int64_t kWide = 16 / sizeof(T);
  return kIsNvfp4<C> ? kWide / 2 : kWide * int64_t{sizeof(C)};
}

//! What keeps chunks of 16 bytes of T from fitting every row, as validate names it (NVFP4 caches need
//! them), or null: R / 2 and (D - R) / 2 whole chunks, every row of q, k, v and their outputs and the norm
//! weights 16-byte aligned, the fp8 rows and the cache rows aligned to a chunk of their element type.
template <typename T, typename C>
const char* append_scalar_cause(const AppendArgs<T, C>& a) {
  constexpr int64_t kWide = 16 / sizeof(T), kT = sizeof(T);
  constexpr int64_t cache_bytes = cache_chunk_bytes<T, C>();
  if (a.head_dim % (2 * kWide) != 0) return "head_dim";
  if (a.rotary_dim % (2 * kWide) != 0) return "rotary_dim";
  if (!aligned_to(a.q, 16, kT)) return "query";
  if (!aligned_to(a.k, 16, kT)) return "key";
  if (!aligned_to(a.v, 16, kT)) return "value";
  if (!aligned_to(a.q_out, 16, kT)) return "query_out";
  if (!aligned_to(a.q_out_fp8, kWide, 1)) return "query_out_fp8";
  if (!aligned_to(a.k_out, 16, kT)) return "key_out";
  if (!aligned_to(a.k_back, 16, kT)) return "key";
  if (reinterpret_cast<uintptr_t>(a.q_norm) % 16 != 0) return "query_norm_weight";
  if (reinterpret_cast<uintptr_t>(a.k_norm) % 16 != 0) return "key_norm_weight";
  if (!cache_aligned_to(a.k_cache.rows, cache_bytes)) return "key_cache";
  if (!cache_aligned_to(a.v_cache.rows, cache_bytes)) return "value_cache";
  return nullptr;
}

template <typename T, typename C>
bool append_vectorizable(const AppendArgs<T, C>& a) {
  return append_scalar_cause(a) == nullptr;
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

//! Elements a chunk: 16 bytes of T when every row allows them and a lane holds one unit (D <= 64 x 16
//! bytes); else one, and rows of more than 32 units loop over them a lane.
template <typename T, typename C>
int append_chunk(const AppendArgs<T, C>& a) {
  constexpr int kWide = 16 / sizeof(T);
  return append_vectorizable(a) && a.head_dim / (2 * kWide) <= 32 ? kWide : 1;
}

//! The path of a call, from its shape alone (sizes, chunk, the table's alignment; nothing asked of the
//! device): few tokens on the vector path with whole 16-byte table runs take the few-token path.
template <typename T, typename C>
AppendPath append_path(const AppendArgs<T, C>& a, int n) {
  if (a.tokens == 0 || a.heads + a.q_heads == 0) return AppendPath::kNone;
  const bool wide = n * int64_t{sizeof(T)} == 16 && append_table_copy_bytes(a) == 16;
  return wide && a.tokens <= kAppendTokenMaxTokens ? AppendPath::kToken : AppendPath::kTile;
}

//! Shared bytes of the row rings: kAppendRowStages rows of two 16-byte chunks a thread, on the vector
//! path (chunks of 16 bytes); 0 elsewhere.
template <typename T>
int append_ring_bytes(int n) {
  return n * static_cast<int>(sizeof(T)) == 16 ? kAppendRowStages * 2 * 16 * kAppendBlockThreads : 0;
}

//! Most tokens a tile whose staged state fits kAppendSharedBudget: a power of two, at most
//! kAppendTileMaxTokens.
inline int append_tile_max_tokens(int table_row_bytes, bool has_cache_rows) {
  int tokens = kAppendTileMaxTokens;
  while (tokens > 1 &&
         tile_layout(tokens, has_cache_rows ? 2 * tokens : 0, table_row_bytes).bytes > kAppendSharedBudget)
    tokens /= 2;
  return tokens;
}

//! The most dynamic shared memory a tile of this call can take (the occupancy the tile is sized from).
template <typename T, typename C>
int append_most_shared_bytes(const AppendArgs<T, C>& a, int n) {
  const int row_bytes = static_cast<int>((append_table_bytes(a) + 15) / 16 * 16);
  const int tokens = append_tile_max_tokens(row_bytes, a.heads > 0);
  return ring_offset(tile_layout(tokens, a.heads > 0 ? 2 * tokens : 0, row_bytes).bytes) + append_ring_bytes<T>(n);
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
  const int64_t per_token = a.q_heads + 2 * a.heads;
  g.div_rows = FastDivmod(static_cast<uint32_t>(per_token));
  g.table_row_bytes = static_cast<int>((append_table_bytes(a) + 15) / 16 * 16);
  g.table_copy_bytes = append_table_copy_bytes(a);
  plan.launched = true;
  plan.vec_width = n;
  plan.lanes = g.lanes;
  if (path == AppendPath::kToken) {
    // A warp a token's 32 / lanes rows, nothing staged.
    const int rows_per_warp = 32 / g.lanes;
    g.token_warps = static_cast<int>((per_token + rows_per_warp - 1) / rows_per_warp);
    g.div_token_warps = FastDivmod(static_cast<uint32_t>(g.token_warps));
    constexpr int kWarps = kAppendTokenBlockThreads / 32;
    plan.block = kAppendTokenBlockThreads;
    plan.grid = static_cast<int>((a.tokens * g.token_warps + kWarps - 1) / kWarps);
    plan.tile_tokens = 1;
    plan.token_warps = g.token_warps;
    return;
  }
  // Tiles of consecutive tokens, as few tokens a tile as fill one wave of blocks.
  const int64_t capacity = int64_t{sms} * std::max(resident, 1);
  const int64_t wave = (a.tokens + capacity - 1) / capacity;
  g.tile_tokens =
      static_cast<int>(std::clamp<int64_t>(wave, 1, append_tile_max_tokens(g.table_row_bytes, a.heads > 0)));
  // A small call's one-token tiles split over blocks so that a group finishes its rows in one pass
  // (a one-token tile at Hq = 64: 80 rows, two blocks of 40).
  const bool single = g.units <= 32;
  const int64_t rows_per_pass = kAppendBlockThreads / g.lanes * (single ? kAppendGroupRowsAPass : 1);
  const int64_t passes = (per_token + rows_per_pass - 1) / rows_per_pass;
  g.row_splits = g.tile_tokens == 1
                     ? static_cast<int>(std::clamp<int64_t>(capacity / a.tokens, 1, std::max<int64_t>(passes, 1)))
                     : 1;
  g.split_rows =
      static_cast<int>(g.row_splits > 1 ? (per_token + g.row_splits - 1) / g.row_splits : g.tile_tokens * per_token);
  g.tiles = (a.tokens + g.tile_tokens - 1) / g.tile_tokens * g.row_splits;
  int hash = 1;
  while (hash < 2 * g.tile_tokens) hash *= 2;
  g.hash_slots = a.heads > 0 ? hash : 0;
  g.ring_bytes = single ? append_ring_bytes<T>(n) : 0;
  plan.block = kAppendBlockThreads;
  plan.tile_tokens = g.tile_tokens;
  plan.grid = static_cast<int>(std::clamp<int64_t>(g.tiles, 1, capacity));
  plan.shared_bytes = ring_offset(tile_layout(g.tile_tokens, g.hash_slots, g.table_row_bytes).bytes) + g.ring_bytes;
}

}  // namespace kvrope::detail
