// Host-side checks behind kvrope::validate_mla_append (docs/spec.md §6.6).
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

#include "../../mla_append_params.cuh"
#include "../append/validate.cuh"  // token_heads_layout
#include "../common/checks.cuh"

namespace kvrope::detail {

//! Most query heads, and most elements of N, R or L (rows, units and chunks are numbered in 32 bits).
inline constexpr int64_t kMlaMaxDim = int64_t{1} << 30;

// [T] rows of `row` elements, token t at data + t stride (kv_c, k_pe).
template <typename T>
Layout token_rows_layout(const char* name, const char* stride_name, const T* data, int64_t stride, int64_t tokens,
                         int64_t row) {
  return Layout{name, data,           int64_t{sizeof(T)}, row,
                1,    {tokens, 1, 1}, {stride, 0, 0},     {stride_name, nullptr, nullptr}};
}
// [pages, P] rows of `row` elements (a latent or rope cache).
template <typename C>
Layout mla_cache_layout(const char* name, const char* const (&strides)[2], const MlaCacheRows<C>& c, int64_t pages,
                        int64_t page_size, int64_t row) {
  return Layout{name,
                c.data,
                int64_t{sizeof(C)},
                row,
                2,
                {pages, page_size, 1},
                {c.page_stride, c.offset_stride, 0},
                {strides[0], strides[1], nullptr}};
}

//! The two caches as the checks see them. Rows that share a slot's memory (vLLM's one cache: the rope part at +L
//! of the latent part, or any placement of the two parts side by side in rows of the same strides) are one output
//! of rows spanning both, named latent_cache (rope_cache then has no rows); any other pair is two outputs.
template <typename C>
std::array<Layout, 2> mla_cache_layouts(const MlaCacheRows<C>& latent, const MlaCacheRows<C>& rope, int64_t pages,
                                        int64_t page_size, int64_t latent_dim, int64_t rotary_dim) {
  std::array<Layout, 2> l{mla_cache_layout("latent_cache", {"latent_cache.page_stride", "latent_cache.offset_stride"},
                                           latent, pages, page_size, latent_dim),
                          mla_cache_layout("rope_cache", {"rope_cache.page_stride", "rope_cache.offset_stride"}, rope,
                                           pages, page_size, rotary_dim)};
  const bool meet = l[0].elements() > 0 && l[1].elements() > 0 && l[0].lo() < l[1].hi() && l[1].lo() < l[0].hi();
  if (!meet || latent.data == nullptr || rope.data == nullptr || latent.page_stride != rope.page_stride ||
      latent.offset_stride != rope.offset_stride)
    return l;
  const auto bytes = static_cast<int64_t>(l[1].lo() - l[0].lo());  // (wraps to the signed distance)
  if (bytes % int64_t{sizeof(C)} != 0) return l;
  const int64_t delta = bytes / int64_t{sizeof(C)};  // rope's elements from latent's
  if (delta >= latent_dim) {
    l[0].row = delta + rotary_dim;  // [latent | ... | rope]
  } else if (-delta >= rotary_dim) {
    l[0].data = rope.data;  // [rope | ... | latent]
    l[0].row = latent_dim - delta;
  } else {
    return l;  // the parts overlap: two outputs, which the checks report
  }
  l[1].extent[0] = 0;
  return l;
}

template <typename T, typename C, typename Pos>
Status check_mla_sizes(const MlaAppendParams<T, C, Pos>& p) {
  if (p.tokens < 0) return fail(StatusCode::kInvalidSize, "tokens");
  if (p.query_heads < 0) return fail(StatusCode::kInvalidSize, "query_heads");
  if (p.nope_dim < 0) return fail(StatusCode::kInvalidSize, "nope_dim");
  if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0) return fail(StatusCode::kInvalidRotaryDim, "rotary_dim");
  if (p.latent_dim <= 0) return fail(StatusCode::kInvalidSize, "latent_dim");
  if (p.style != RotaryStyle::kRotateHalf && p.style != RotaryStyle::kInterleaved)
    return fail(StatusCode::kInvalidStyle, "style");
  if (p.max_position < 0) return fail(StatusCode::kInvalidSize, "max_position");
  if (p.page_size <= 0) return fail(StatusCode::kInvalidSize, "page_size");
  if (p.num_pages < 0) return fail(StatusCode::kInvalidSize, "num_pages");
  if (p.query_heads > kMlaMaxDim) return fail(StatusCode::kTooLarge, "query_heads");
  if (p.nope_dim > kMlaMaxDim) return fail(StatusCode::kTooLarge, "nope_dim");
  if (p.rotary_dim > kMlaMaxDim) return fail(StatusCode::kTooLarge, "rotary_dim");
  if (p.latent_dim > kMlaMaxDim) return fail(StatusCode::kTooLarge, "latent_dim");
  if (p.page_size > kMaxRows) return fail(StatusCode::kTooLarge, "page_size");
  if (static_cast<double>(p.num_pages) * static_cast<double>(p.page_size) > 0x1p62)
    return fail(StatusCode::kTooLarge, "num_pages");
  // Warps are numbered in 32 bits inside the kernel (each role's from its first block): fewer than T (Hq + 1)
  // of them; the grid's blocks, at most T / 4 + T Hq / 4 + T Hq / 16 + 3, then fit 31 bits.
  if (static_cast<double>(p.tokens) * static_cast<double>(p.query_heads + 1) > static_cast<double>(kMaxRows - 3))
    return fail(StatusCode::kTooLarge, "tokens");
  if (p.cos_sin_cache != nullptr && p.cos_sin_cache_f32 != nullptr)
    return fail(StatusCode::kConflictingFields, "cos_sin_cache", "cos_sin_cache_f32");
  if (p.query_out_fp8.data != nullptr && p.query_out.data != nullptr)
    return fail(StatusCode::kConflictingFields, "query_out_fp8", "query_out");
  // (an fp8 query_out with no rows, T = 0 or Hq = 0, may have no data: torch gives an empty tensor none)
  if (p.query_scale != nullptr && p.query_out_fp8.data == nullptr && p.tokens > 0 && p.query_heads > 0)
    return fail(StatusCode::kConflictingFields, "query_scale", "query_out_fp8");
  if (p.write_query_nope && p.query_out.data == nullptr && p.query_out_fp8.data == nullptr && p.tokens > 0 &&
      p.query_heads > 0)
    return fail(StatusCode::kConflictingFields, "write_query_nope", "query_out");
  if constexpr (!kIsFp8<C>) {
    if (p.kv_scale != nullptr) return fail(StatusCode::kConflictingFields, "kv_scale", "latent_cache");
  }
  return {};
}

// Checks an MLA append call without touching the device: sizes, one table source, the scales' use, required
// pointers, strides, q's output rows disjoint, outputs clear of every input and of each other (q_pe in place is an
// output only; caches whose parts share rows, as vLLM's one cache, one output: mla_cache_layouts).
template <typename T, typename C, typename Pos>
Status validate_mla(const MlaAppendParams<T, C, Pos>& p) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  static_assert(std::is_same_v<C, T> || kIsFp8<C>,
                "kvrope: the MLA caches' type C must be T, __nv_fp8_e4m3 or "
                "__nv_fp8_e5m2");
  if (Status s = check_mla_sizes(p); !s) return s;
  const int64_t N = p.nope_dim, R = p.rotary_dim, L = p.latent_dim, tokens = p.tokens;
  const bool f32 = p.cos_sin_cache_f32 != nullptr;
  if (tokens > 0 && p.cos_sin_cache == nullptr && !f32) return fail(StatusCode::kNullPointer, "cos_sin_cache");
  const bool q_fp8 = p.query_out_fp8.data != nullptr;
  const bool q_in_place = p.query_out.data == nullptr && !q_fp8;
  const int64_t q_tokens = p.query_heads > 0 ? tokens : 0;
  const bool nope_read = p.write_query_nope && !q_in_place && N > 0;
  const std::array<Layout, 2> caches = mla_cache_layouts(p.latent_cache, p.rope_cache, p.num_pages, p.page_size, L, R);
  const std::array<Layout, 9> in{
      token_heads_layout("query_pe", {"query_pe.token_stride", "query_pe.head_stride"}, TokenHeads<const T>(p.query_pe),
                         q_in_place ? 0 : q_tokens, p.query_heads, R),
      token_heads_layout("query_nope", {"query_nope.token_stride", "query_nope.head_stride"}, p.query_nope,
                         nope_read ? q_tokens : 0, p.query_heads, N),
      token_rows_layout("kv_c", "kv_c_stride", p.kv_c, p.kv_c_stride, tokens, L),
      token_rows_layout("k_pe", "k_pe_stride", p.k_pe, p.k_pe_stride, tokens, R),
      flat_layout("positions", p.positions, sizeof(Pos), tokens),
      flat_layout(f32 ? "cos_sin_cache_f32" : "cos_sin_cache",
                  f32 ? static_cast<const void*>(p.cos_sin_cache_f32) : p.cos_sin_cache, f32 ? 4 : sizeof(T),
                  tokens > 0 ? p.max_position * R : 0),
      flat_layout("slot_mapping", p.slot_mapping, sizeof(int64_t), tokens),
      flat_layout("kv_scale", p.kv_scale, 4, p.kv_scale ? 1 : 0),
      flat_layout("query_scale", p.query_scale, 4, p.query_scale ? 1 : 0)};
  const std::array<Layout, 4> out{
      q_in_place ? token_heads_layout("query_pe", {"query_pe.token_stride", "query_pe.head_stride"}, p.query_pe,
                                      q_tokens, p.query_heads, R)
      : q_fp8    ? token_heads_layout("query_out_fp8", {"query_out_fp8.token_stride", "query_out_fp8.head_stride"},
                                      p.query_out_fp8, q_tokens, p.query_heads, N + R)
                 : token_heads_layout("query_out", {"query_out.token_stride", "query_out.head_stride"}, p.query_out,
                                      q_tokens, p.query_heads, N + R),
      caches[0], caches[1],
      // (the flag too: no output may overlap it)
      flat_layout("error_flag", p.error_flag, 4, p.error_flag ? 1 : 0)};
  return check_tensors(in, out);
}

}  // namespace kvrope::detail
