// The MLA append's planner: pure functions from a call's shape and pointers to its kernel instance and launch.
// No CUDA calls: tested on the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../../mla_append_params.cuh"
#include "../append/plan.cuh"  // append_lanes, aligned_to
#include "args.cuh"

namespace kvrope::detail {

//! The kernel's view of a call: q's outputs resolved, the table source folded into one pointer.
template <typename T, typename C, typename Pos>
MlaArgs<T, C> mla_args(const MlaAppendParams<T, C, Pos>& p) {
  MlaArgs<T, C> a{};
  a.tokens = p.tokens;
  a.q_heads = p.query_heads;
  a.nope_dim = p.nope_dim;
  a.rotary_dim = p.rotary_dim;
  a.latent_dim = p.latent_dim;
  a.style = p.style;
  a.q_pe = p.query_pe;
  a.q_nope = p.query_nope;
  a.q_scale = p.query_scale;
  const int64_t n = p.nope_dim;
  if (p.query_out_fp8.data != nullptr) {
    a.q_rot8 = {p.query_out_fp8.data + n, p.query_out_fp8.token_stride, p.query_out_fp8.head_stride};
    if (p.write_query_nope && n > 0) a.q_copy8 = p.query_out_fp8;
  } else if (p.query_out.data != nullptr) {
    a.q_rot = {p.query_out.data + n, p.query_out.token_stride, p.query_out.head_stride};
    if (p.write_query_nope && n > 0) a.q_copy = p.query_out;
  } else {
    a.q_rot = p.query_pe;  // in place
  }
  a.kv_c = p.kv_c;
  a.kv_c_stride = p.kv_c_stride;
  a.k_pe = p.k_pe;
  a.k_pe_stride = p.k_pe_stride;
  a.positions = p.positions;
  a.positions_are_int64 = sizeof(Pos) == 8;
  a.table_f32 = p.cos_sin_cache_f32 != nullptr;
  a.table = a.table_f32 ? static_cast<const void*>(p.cos_sin_cache_f32) : p.cos_sin_cache;
  a.max_position = p.max_position;
  a.latent = p.latent_cache;
  a.rope = p.rope_cache;
  a.kv_scale = p.kv_scale;
  a.slots = p.slot_mapping;
  a.num_slots = p.num_pages * p.page_size;
  a.div_page = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.page_size, 1)));
  a.error_flag = p.error_flag;
  return a;
}

template <typename C>
bool mla_rows_aligned_to(const MlaCacheRows<C>& c, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(c.data) % bytes == 0 && (c.page_stride * int64_t{sizeof(C)}) % bytes == 0 &&
         (c.offset_stride * int64_t{sizeof(C)}) % bytes == 0;
}

//! What keeps chunks of 16 bytes of T from fitting every row, or null: R / 2 and L (and N, where q's rows are
//! written at +N or q_nope copied) whole chunks; every row of q_pe, q_nope, the q outputs, kv_c and k_pe and
//! the table 16-byte aligned; the fp8 q rows and the cache rows aligned to a chunk of their element type.
template <typename T, typename C>
const char* mla_scalar_cause(const MlaArgs<T, C>& a) {
  constexpr int64_t kWide = 16 / sizeof(T), kT = sizeof(T);
  const bool q_out = a.q_rot8.data != nullptr || a.q_rot.data != a.q_pe.data;
  if (a.rotary_dim % (2 * kWide) != 0) return "rotary_dim";
  if (a.latent_dim % kWide != 0) return "latent_dim";
  if (q_out && a.q_heads > 0 && a.nope_dim % kWide != 0) return "nope_dim";
  if (!aligned_to(a.q_pe, 16, kT)) return "query_pe";
  if (!aligned_to(a.q_nope, 16, kT) && (a.q_copy.data != nullptr || a.q_copy8.data != nullptr)) return "query_nope";
  if (!aligned_to(a.q_rot, 16, kT)) return "query_out";
  if (!aligned_to(a.q_rot8, kWide, 1)) return "query_out_fp8";
  if (reinterpret_cast<uintptr_t>(a.kv_c) % 16 != 0 || (a.kv_c_stride * kT) % 16 != 0) return "kv_c";
  if (reinterpret_cast<uintptr_t>(a.k_pe) % 16 != 0 || (a.k_pe_stride * kT) % 16 != 0) return "k_pe";
  if (reinterpret_cast<uintptr_t>(a.table) % 16 != 0) return a.table_f32 ? "cos_sin_cache_f32" : "cos_sin_cache";
  if (!mla_rows_aligned_to(a.latent, kWide * int64_t{sizeof(C)})) return "latent_cache";
  if (!mla_rows_aligned_to(a.rope, kWide * int64_t{sizeof(C)})) return "rope_cache";
  return nullptr;
}

//! Elements a chunk: 16 bytes of T when every row allows them (mla_scalar_cause), else one.
template <typename T, typename C>
int mla_chunk(const MlaArgs<T, C>& a) {
  return mla_scalar_cause(a) == nullptr ? static_cast<int>(16 / sizeof(T)) : 1;
}

//! Whether the call takes the instance compiled for L = 512, R = 64 (on the vector path).
template <typename T, typename C>
bool mla_fixed_dims(const MlaArgs<T, C>& a, int n) {
  return n * int64_t{sizeof(T)} == 16 && a.latent_dim == kMlaFixedLatentDim && a.rotary_dim == kMlaFixedRotaryDim;
}

//! The plan of a call for chunks of `n` elements: fills the kernel's geometry `g` and the reported `plan`.
template <typename T, typename C>
void plan_mla_geometry(const MlaArgs<T, C>& a, int n, MlaGeometry& g, MlaPlan& plan) {
  g = MlaGeometry{};
  plan = MlaPlan{};
  if (a.tokens == 0) return;
  g.rot_units = static_cast<int>(a.rotary_dim / (2 * n));
  g.nope_chunks = a.q_copy.data != nullptr || a.q_copy8.data != nullptr ? static_cast<int>(a.nope_dim / n) : 0;
  g.latent_chunks = static_cast<int>(a.latent_dim / n);
  g.q_lanes = append_lanes(g.rot_units);
  constexpr int kWarps = kMlaBlockThreads / 32;
  const int64_t rows_per_warp = 32 / g.q_lanes;
  g.query_warps = static_cast<int>((a.q_heads + rows_per_warp - 1) / rows_per_warp);
  g.div_query_warps = FastDivmod(static_cast<uint32_t>(std::max(g.query_warps, 1)));
  g.tile_tokens = kWarps;
  while (g.tile_tokens < kMlaTileTokens && (a.tokens + g.tile_tokens - 1) / g.tile_tokens > kMlaLatentTiles)
    g.tile_tokens *= 2;
  g.latent_blocks = static_cast<int>((a.tokens + g.tile_tokens - 1) / g.tile_tokens);
  g.query_blocks = static_cast<int>((a.tokens * g.query_warps + kWarps - 1) / kWarps);
  g.div_heads = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(a.q_heads, 1)));
  const int64_t q_rows = a.tokens * a.q_heads;
  g.copy_rows = q_rows <= kMlaCopyOneRowMax ? 1 : kMlaCopyRows;
  const int64_t copy_warps = g.nope_chunks > 0 ? (q_rows + g.copy_rows - 1) / g.copy_rows : 0;
  plan.launched = true;
  plan.vec_width = n;
  plan.fixed_dims = mla_fixed_dims(a, n);
  plan.q_lanes = g.q_lanes;
  plan.query_warps = g.query_warps;
  plan.tile_tokens = g.tile_tokens;
  plan.latent_blocks = g.latent_blocks;
  plan.query_blocks = g.query_blocks;
  plan.copy_rows = g.copy_rows;
  plan.copy_blocks = static_cast<int>((copy_warps + kWarps - 1) / kWarps);
  plan.block = kMlaBlockThreads;
  plan.grid = plan.latent_blocks + plan.query_blocks + plan.copy_blocks;
}

}  // namespace kvrope::detail
