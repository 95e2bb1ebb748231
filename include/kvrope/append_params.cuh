// Parameters of the serving forward (docs/spec.md §6): ragged tokens rotated and appended to a paged
// (or flat, or contiguous) KV cache in T, fp8 or NVFP4. Plain structs of pointers and int64 strides, and the
// plan a call launches.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.cuh"  // kIsFp8
#include "core/rotary.cuh"
#include "error_flag.cuh"

namespace kvrope {

//! A [tokens, heads, D] tensor of head rows: q, k or v of a ragged batch. The last dim is contiguous;
//! token and head strides are in elements, so q, k and v may be views of one fused projection
//! qkv [tokens, (Hq + 2 H) D] (token_stride (Hq + 2 H) D, head_stride D).
template <typename T>
struct TokenHeads {
  T* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;

  __host__ __device__ T* row(int64_t token, int64_t head) const {
    return data + token * token_stride + head * head_stride;
  }
  template <typename U = T, typename = std::enable_if_t<!std::is_const_v<U>>>
  __host__ __device__ operator TokenHeads<const U>() const {
    return {data, token_stride, head_stride};
  }
};

//! A contiguous [tokens, heads, D] tensor.
template <typename T>
TokenHeads<T> thd(T* data, int64_t heads, int64_t head_dim) {
  return {data, heads * head_dim, head_dim};
}

//! A KV cache whose rows are addressed by slot: slot s is page s / P, offset s % P (P the page size),
//! and its row of head h starts at data + page * page_stride + offset * offset_stride + h * head_stride
//! (elements of C). One description covers NHD pages [pages, P, H, D] (offset_stride H D, head_stride
//! D), HND pages [pages, H, P, D] (offset_stride D, head_stride P D), a flat pool [slots, H, D] (P = 1)
//! and a contiguous per-sequence cache (P = S_max).
template <typename C>
struct PagedCache {
  C* data = nullptr;
  int64_t page_stride = 0;
  int64_t offset_stride = 0;
  int64_t head_stride = 0;

  __host__ __device__ C* row(int64_t page, int64_t offset, int64_t head) const {
    return data + page * page_stride + offset * offset_stride + head * head_stride;
  }
};

//! Contiguous NHD pages [pages, P, H, D] (vLLM, FlashInfer's default).
template <typename C>
PagedCache<C> nhd_pages(C* data, int64_t page_size, int64_t heads, int64_t head_dim) {
  return {data, page_size * heads * head_dim, heads * head_dim, head_dim};
}
//! Contiguous HND pages [pages, H, P, D] (FlashInfer's other layout).
template <typename C>
PagedCache<C> hnd_pages(C* data, int64_t page_size, int64_t heads, int64_t head_dim) {
  return {data, page_size * heads * head_dim, head_dim, page_size * head_dim};
}

//! The element of an NVFP4 cache (docs/spec.md §6.4; FlashInfer's packed NVFP4 KV cache, a uint8 tensor):
//! one byte holding two e2m1 codes, the even element in the low nibble. A cache of this type has rows of
//! D / 2 of them (strides count bytes) and, beside it, block scales: one e4m3 byte a block of 16 values.
struct nvfp4_e2m1x2 {
  uint8_t bits;
};

template <typename C>
inline constexpr bool kIsNvfp4 = std::is_same_v<C, nvfp4_e2m1x2>;
//! Cache types quantized with a scale (key_scale, value_scale): fp8 and NVFP4.
template <typename C>
inline constexpr bool kIsQuantized = kIsFp8<C> || kIsNvfp4<C>;
//! True for the cache element types: T itself, fp8 or NVFP4 (quantized on write).
template <typename T, typename C>
inline constexpr bool kIsCacheTypeFor = std::is_same_v<C, T> || kIsFp8<C> || kIsNvfp4<C>;

//! The serving forward: for each of `tokens` tokens, q (Hq heads) and k (H heads) optionally RMS-normed
//! per head, rotated (RoPE, table cache indexed by positions), q written in place or to query_out, k
//! to key_out and/or in place if asked, and RoPE(k) and v written to the cache rows of slot_mapping,
//! quantized when C is fp8 or NVFP4.
//!
//! @tparam T   element type of q, k, v, the outputs and the norm weights: __nv_bfloat16, __half or float
//! @tparam C   element type of the caches: T, __nv_fp8_e4m3, __nv_fp8_e5m2 or nvfp4_e2m1x2
//! @tparam Pos type of positions: int64_t or int32_t
template <typename T, typename C = T, typename Pos = int64_t>
struct AppendParams {
  int64_t tokens = 0;       //!< T, new tokens of the ragged batch
  int64_t heads = 0;        //!< H, KV heads
  int64_t query_heads = 0;  //!< Hq, heads of q (0: no q)
  int64_t head_dim = 0;     //!< D, positive and even
  int64_t rotary_dim = 0;   //!< R, even, 0 < R <= D (0: R = D); elements R..D-1 pass through
  RotaryStyle style = RotaryStyle::kRotateHalf;

  TokenHeads<T> query;      //!< q [T, Hq, D]: read, rotated in place unless query_out or query_out_fp8 is given
  TokenHeads<T> query_out;  //!< optional [T, Hq, D]: the rotated q, q left as it was
  //! Optional [T, Hq, D] in fp8 e4m3, what fp8 attention reads: the rotated q (its pass-through dims
  //! too) as fp8_satfinite(x / query_scale), x rounded to T first; q left as it was. Excludes query_out.
  TokenHeads<__nv_fp8_e4m3> query_out_fp8;
  const float* query_scale = nullptr;  //!< device float: query_out_fp8's per-tensor scale; null means 1
  TokenHeads<T> key;                   //!< k [T, H, D]: read; written only with key_in_place
  TokenHeads<T> key_out;               //!< optional [T, H, D]: the rotated k
  bool key_in_place = false;           //!< write the rotated k back into key (vLLM); excludes key_out
  TokenHeads<const T> value;           //!< v [T, H, D]

  const Pos* positions = nullptr;            //!< [T] device array: each token's row of the table cache (mRoPE: [3, T])
  const T* cos_sin_cache = nullptr;          //!< table cache [max_position, R] in T (cos in [0, R/2), sin in [R/2, R))
  const float* cos_sin_cache_f32 = nullptr;  //!< the same in fp32 (one of the two exactly)
  int64_t max_position = 0;                  //!< rows of the table cache

  //! Optional multimodal rotary positions (mRoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL; docs/spec.md §6.2): positions
  //! is then [3, T], three streams (temporal, height, width; stream j at positions + j position_stream_stride),
  //! and pair i (i < R/2, either style) takes cos and sin from the row of stream s(i). Contiguous sections:
  //! s(i) = 0 for i < s0, 1 for i < s0 + s1, else 2. Interleaved (mrope_interleaved, Qwen3-VL): s(i) = 1 when
  //! i % 3 == 1 and i < 3 s1, 2 when i % 3 == 2 and i < 3 s2, else 0. A token any of whose three positions is
  //! outside [0, max_position) writes nothing. All zero: no mRoPE, positions [T]; else non-negative, sum R/2.
  int64_t mrope_section[3] = {0, 0, 0};
  bool mrope_interleaved = false;      //!< interleaved sections (Qwen3-VL); else contiguous (Qwen2-VL, Qwen2.5-VL)
  int64_t position_stream_stride = 0;  //!< with mRoPE: elements from one stream of positions to the next (0 or more)

  //! Optional per-head RMSNorm before the rotation, in fp32: x * rsqrt(mean(x^2) + norm_eps) * w over
  //! the D elements of each head row, with w = weight (or 1 + weight with norm_weight_plus_one, Gemma).
  const T* query_norm_weight = nullptr;  //!< [D], or null: q not normed
  const T* key_norm_weight = nullptr;    //!< [D], or null: k not normed
  float norm_eps = 1e-6f;                //!< non-negative (validate: kInvalidSize otherwise)
  bool norm_weight_plus_one = false;

  PagedCache<C> key_cache;                //!< gets RoPE(k) (quantized unless C is T) at each token's slot
  PagedCache<C> value_cache;              //!< gets v at each token's slot
  int64_t page_size = 0;                  //!< P, slots a page
  int64_t num_pages = 0;                  //!< pages of each cache: slots [0, num_pages P) exist
  const int64_t* slot_mapping = nullptr;  //!< [T] device array (H > 0): a token's slot; negative: no cache write

  //! fp8 and NVFP4 caches only: device decode scales; null means 1. One float, or H (one a head) with
  //! scale_per_head. fp8: stored = fp8_satfinite(x / scale). NVFP4: the global scale g of docs/spec.md §6.4
  //! (element = e2m1 code x block scale x g; FlashInfer's k_scale / v_scale).
  const float* key_scale = nullptr;
  const float* value_scale = nullptr;
  bool scale_per_head = false;

  //! NVFP4 caches only (C = nvfp4_e2m1x2): the block scales, rows of D / 16 e4m3 bytes (one a block of 16
  //! values along D) at the same slots and heads as the caches' rows, with strides of their own (in bytes;
  //! FlashInfer's kv_cache_sf). NVFP4 needs D and R multiples of 32 and the 16-byte vector path (docs/api.md).
  PagedCache<__nv_fp8_e4m3> key_block_scales;
  PagedCache<__nv_fp8_e4m3> value_block_scales;

  //! Optional device int (error_flag.cuh): a slot at or above num_pages P ORs kErrorSlotOutOfRange (the
  //! token writes no cache row; q and k are still written), a position outside [0, max_position) ORs
  //! kErrorPositionIdOutOfRange (the token writes nothing at all).
  int* error_flag = nullptr;

  //! Programmatic dependent launch (sm_90+; FlashInfer's enable_pdl): the kernel may start while the
  //! kernel before it in the stream (the QKV projection, say) finishes, and waits for that kernel's writes
  //! before its first read; it also lets the kernel after it start early the same way. Off: an ordinary
  //! launch, which starts once the kernel before has ended.
  bool enable_pdl = false;
};

//! Whether an append call uses multimodal rotary positions (mRoPE): some mrope_section non-zero.
template <typename T, typename C, typename Pos>
constexpr bool has_mrope(const AppendParams<T, C, Pos>& p) {
  return p.mrope_section[0] != 0 || p.mrope_section[1] != 0 || p.mrope_section[2] != 0;
}

//! The kernel an append call launches (docs/design.md, "The serving forward"): chosen from the call's
//! shape alone.
enum class AppendPath : int {
  kNone,   //!< nothing to read or write
  kToken,  //!< few tokens: a warp a few rows of one token, nothing staged
  kTile,   //!< more tokens: a block stages a tile of tokens' table rows and slots, its groups take its rows
};

//! What an append call launches, as plan_append reports it without launching.
struct AppendPlan {
  AppendPath path = AppendPath::kNone;
  bool launched = false;  //!< false: nothing to read or write
  int vec_width = 0;      //!< elements per access (16 bytes, or 1 for unaligned rows)
  int lanes = 0;          //!< lanes a head row (a power of two, at most 32)
  int grid = 0;           //!< blocks
  int block = 0;          //!< threads per block
  int shared_bytes = 0;   //!< dynamic shared memory a block
  int tile_tokens = 0;    //!< consecutive tokens a block stages at a time (kToken: 1)
  int token_warps = 0;    //!< kToken: warps a token's rows take
};

}  // namespace kvrope
