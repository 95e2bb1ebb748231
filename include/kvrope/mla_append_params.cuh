// Parameters of the MLA latent-cache append (docs/spec.md §6.6: multi-head latent attention, DeepSeek-V2/V3, Kimi
// K2): per token, the rotary part of each query head rotated, and the latent row [kv_c | RoPE(k_pe)] written to a
// paged cache. Plain structs of pointers and int64 strides, and the plan a call launches.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "append_params.cuh"  // TokenHeads, kIsCacheTypeFor
#include "core/rotary.cuh"
#include "error_flag.cuh"

namespace kvrope {

//! The rows of one MLA cache: slot s (page s / P, offset s % P) at data + page * page_stride + offset *
//! offset_stride (elements of C), its elements contiguous.
template <typename C>
struct MlaCacheRows {
  C* data = nullptr;
  int64_t page_stride = 0;
  int64_t offset_stride = 0;

  __host__ __device__ C* row(int64_t page, int64_t offset) const {
    return data + page * page_stride + offset * offset_stride;
  }
};

//! vLLM's layout (concat_and_cache_mla), one contiguous cache [pages, P, L + R]: its latent rows, kv_c in [0, L)...
template <typename C>
MlaCacheRows<C> mla_concat_latent(C* cache, int64_t page_size, int64_t latent_dim, int64_t rotary_dim) {
  return {cache, page_size * (latent_dim + rotary_dim), latent_dim + rotary_dim};
}
//! ... and its rope rows, RoPE(k_pe) in [L, L + R) of the same rows.
template <typename C>
MlaCacheRows<C> mla_concat_rope(C* cache, int64_t page_size, int64_t latent_dim, int64_t rotary_dim) {
  return {cache + latent_dim, page_size * (latent_dim + rotary_dim), latent_dim + rotary_dim};
}
//! FlashInfer's layout (append_paged_mla_kv_cache), two contiguous caches: ckv [pages, P, L] is
//! mla_cache_rows(ckv, P, L), kpe [pages, P, R] is mla_cache_rows(kpe, P, R).
template <typename C>
MlaCacheRows<C> mla_cache_rows(C* cache, int64_t page_size, int64_t width) {
  return {cache, page_size * width, width};
}

//! The MLA append: for each of `tokens` tokens whose position is in [0, max_position), q_pe (the last R dims of
//! each query head) rotated (RoPE, table cache indexed by positions) in place or into query_out / query_out_fp8
//! (q_nope copied beside it if asked), and the latent row [kv_c | RoPE(k_pe)] written to the slot of
//! slot_mapping in latent_cache (kv_c) and rope_cache (RoPE(k_pe)), quantized when C is fp8. Semantics:
//! docs/spec.md §6.6; reference: kvrope/reference/cpu_mla.hpp.
//!
//! @tparam T   element type of q, kv_c, k_pe and query_out: __nv_bfloat16, __half or float
//! @tparam C   element type of the caches: T, __nv_fp8_e4m3 or __nv_fp8_e5m2
//! @tparam Pos type of positions: int64_t or int32_t
template <typename T, typename C = T, typename Pos = int64_t>
struct MlaAppendParams {
  int64_t tokens = 0;                             //!< T, new tokens of the ragged batch
  int64_t query_heads = 0;                        //!< Hq, query heads (0: no q)
  int64_t nope_dim = 0;                           //!< N, the non-rotary dims of a query row (DeepSeek-V3: 128)
  int64_t rotary_dim = 0;                         //!< R, positive and even: q_pe's and k_pe's dims (DeepSeek-V3: 64)
  int64_t latent_dim = 0;                         //!< L, positive: kv_c's dims (DeepSeek-V3: 512)
  RotaryStyle style = RotaryStyle::kInterleaved;  //!< DeepSeek's checkpoints: interleaved (GPT-J)

  //! q_pe [T, Hq, R], the rotary part of q: read, rotated in place unless query_out or query_out_fp8 is given.
  //! A fused q [T, Hq, N + R] is query_nope = q and query_pe = q + N with q's strides.
  TokenHeads<T> query_pe;
  //! q_nope [T, Hq, N]: read only with write_query_nope (null otherwise allowed).
  TokenHeads<const T> query_nope;
  //! Optional rows [T, Hq, N + R]: RoPE(q_pe) in [N, N + R), q_nope copied into [0, N) with write_query_nope;
  //! q_pe left as it was.
  TokenHeads<T> query_out;
  //! Optional, the same rows in fp8 e4m3 (what fp8 attention reads): fp8_satfinite(x / query_scale), x the
  //! value rounded to T first. Excludes query_out.
  TokenHeads<__nv_fp8_e4m3> query_out_fp8;
  bool write_query_nope = false;       //!< with query_out or query_out_fp8: copy q_nope into [0, N) of each row
  const float* query_scale = nullptr;  //!< device float: query_out_fp8's per-tensor scale; null means 1

  const T* kv_c = nullptr;  //!< [T, L] (normed, not rotated), token t at kv_c + t kv_c_stride
  int64_t kv_c_stride = 0;
  const T* k_pe = nullptr;  //!< [T, R], token t at k_pe + t k_pe_stride (kv_c and k_pe may be views of one row)
  int64_t k_pe_stride = 0;

  const Pos* positions = nullptr;            //!< [T] device array: each token's row of the table cache
  const T* cos_sin_cache = nullptr;          //!< table cache [max_position, R] in T (cos in [0, R/2), sin in [R/2, R))
  const float* cos_sin_cache_f32 = nullptr;  //!< the same in fp32 (one of the two exactly)
  int64_t max_position = 0;                  //!< rows of the table cache

  //! Where a slot's latent row goes: kv_c to latent_cache's row, RoPE(k_pe) to rope_cache's. vLLM's one
  //! cache [pages, P, L + R]: mla_concat_latent and mla_concat_rope of it (rope at +L in the same rows);
  //! FlashInfer's ckv [pages, P, L] and kpe [pages, P, R]: mla_cache_rows of each.
  MlaCacheRows<C> latent_cache;
  MlaCacheRows<C> rope_cache;
  int64_t page_size = 0;                  //!< P, slots a page (positive)
  int64_t num_pages = 0;                  //!< pages of each cache: slots [0, num_pages P) exist
  const int64_t* slot_mapping = nullptr;  //!< [T] device array: a token's slot; negative: no cache write
  //! fp8 caches only: one device float, the decode scale of both caches; null means 1.
  //! stored = fp8_satfinite(x / kv_scale), x the value rounded to T first.
  const float* kv_scale = nullptr;

  //! Optional device int (error_flag.cuh): a slot at or above num_pages P ORs kErrorSlotOutOfRange (the token
  //! writes no cache row; q is still written), a position outside [0, max_position) ORs
  //! kErrorPositionIdOutOfRange (the token writes nothing at all).
  int* error_flag = nullptr;

  //! Programmatic dependent launch (sm_90+), as AppendParams::enable_pdl.
  bool enable_pdl = false;
};

//! What an MLA append call launches, as plan_mla_append reports it without launching.
struct MlaPlan {
  bool launched = false;    //!< false: nothing to read or write
  int vec_width = 0;        //!< elements per access (16 bytes of T, or 1 for unaligned rows or odd sizes)
  bool fixed_dims = false;  //!< the instance compiled for L = 512, R = 64 (DeepSeek-V3, Kimi K2)
  int q_lanes = 0;          //!< lanes a query row (a power of two, at most 32)
  int query_warps = 0;      //!< warps a token's query rows take
  int tile_tokens = 0;      //!< tokens a latent tile: 4 (a row a warp) up to 32, as T asks (detail/mla/plan.cuh)
  int latent_blocks = 0;    //!< the grid's first blocks: a latent tile each
  int query_blocks = 0;     //!< the blocks after them: query rows, query_warps warps a token
  int copy_rows = 0;        //!< rows of q_nope a copy warp: 1 for small calls, else 4 (detail/mla/args.cuh)
  int copy_blocks = 0;      //!< the last blocks: q_nope's copy (0 without one)
  int grid = 0;             //!< blocks: latent_blocks + query_blocks + copy_blocks
  int block = 0;            //!< threads per block
};

}  // namespace kvrope
