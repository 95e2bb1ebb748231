// Host-side checks behind kvrope::validate for the append (docs/spec.md §6).
#pragma once

#include <array>
#include <cstdint>

#include "../../append_params.cuh"
#include "../common/checks.cuh"
#include "plan.cuh"

namespace kvrope::detail {

// A [tokens, heads, D] view as the checks see it.
template <typename T>
Layout token_heads_layout(const char* name, const char* const (&strides)[2], const TokenHeads<T>& v, int64_t tokens,
                          int64_t heads, int64_t head_dim) {
  return Layout{name,
                v.data,
                int64_t{sizeof(T)},
                head_dim,
                2,
                {tokens, heads, 1},
                {v.token_stride, v.head_stride, 0},
                {strides[0], strides[1], nullptr}};
}
// A paged cache as the checks see it: [pages, P, H] rows of D.
template <typename C>
Layout paged_layout(const char* name, const char* const (&strides)[3], const PagedCache<C>& c, int64_t pages,
                    int64_t page_size, int64_t heads, int64_t head_dim) {
  return Layout{name,
                c.data,
                int64_t{sizeof(C)},
                head_dim,
                3,
                {pages, page_size, heads},
                {c.page_stride, c.offset_stride, c.head_stride},
                {strides[0], strides[1], strides[2]}};
}

// positions as the checks see them: [T], or with mRoPE three streams of T, position_stream_stride apart.
template <typename T, typename C, typename Pos>
Layout positions_layout(const AppendParams<T, C, Pos>& p, int64_t tokens) {
  Layout l = flat_layout("positions", p.positions, sizeof(Pos), tokens);
  if (has_mrope(p)) {
    l.extent[0] = 3;
    l.stride[0] = p.position_stream_stride;
    l.stride_name[0] = "position_stream_stride";
  }
  return l;
}

template <typename T, typename C, typename Pos>
Status check_append_sizes(const AppendParams<T, C, Pos>& p) {
  if (p.tokens < 0) return fail(StatusCode::kInvalidSize, "tokens");
  if (p.heads < 0) return fail(StatusCode::kInvalidSize, "heads");
  if (p.query_heads < 0) return fail(StatusCode::kInvalidSize, "query_heads");
  if (p.max_position < 0) return fail(StatusCode::kInvalidSize, "max_position");
  if (p.page_size < 0 || (p.page_size == 0 && p.heads > 0)) return fail(StatusCode::kInvalidSize, "page_size");
  if (p.num_pages < 0) return fail(StatusCode::kInvalidSize, "num_pages");
  if (Status s = check_rotation(p.head_dim, p.rotary_dim, p.style); !s) return s;
  if (p.tokens > kMaxRows) return fail(StatusCode::kTooLarge, "tokens");
  if (p.page_size > kMaxRows) return fail(StatusCode::kTooLarge, "page_size");
  // Rows are numbered in 32 bits inside the kernel: T (Hq + 2 H) of them.
  if (static_cast<double>(p.tokens) * static_cast<double>(p.query_heads + 2 * p.heads) > static_cast<double>(kMaxRows))
    return fail(StatusCode::kTooLarge, "tokens");
  if (p.norm_eps < 0.0f || !(p.norm_eps == p.norm_eps)) return fail(StatusCode::kInvalidSize, "norm_eps");
  if (p.cos_sin_cache != nullptr && p.cos_sin_cache_f32 != nullptr)
    return fail(StatusCode::kConflictingFields, "cos_sin_cache", "cos_sin_cache_f32");
  if (p.query_out_fp8.data != nullptr && p.query_out.data != nullptr)
    return fail(StatusCode::kConflictingFields, "query_out_fp8", "query_out");
  // (an fp8 query_out with no rows, T = 0 or Hq = 0, may have no data: torch gives an empty tensor none)
  if (p.query_scale != nullptr && p.query_out_fp8.data == nullptr && p.tokens > 0 && p.query_heads > 0)
    return fail(StatusCode::kConflictingFields, "query_scale", "query_out_fp8");
  if (p.key_in_place && p.key_out.data != nullptr)
    return fail(StatusCode::kConflictingFields, "key_in_place", "key_out");
  if (has_mrope(p)) {
    // Each section in [0, R/2] (no overflow in the sum), the three covering the R/2 pairs.
    const int64_t pairs = effective_rotary_dim(p.rotary_dim, p.head_dim) / 2;
    for (const int64_t s : p.mrope_section)
      if (s < 0 || s > pairs) return fail(StatusCode::kInvalidSize, "mrope_section");
    if (p.mrope_section[0] + p.mrope_section[1] + p.mrope_section[2] != pairs)
      return fail(StatusCode::kInvalidSize, "mrope_section");
  } else {
    if (p.mrope_interleaved) return fail(StatusCode::kConflictingFields, "mrope_interleaved", "mrope_section");
    if (p.position_stream_stride != 0)
      return fail(StatusCode::kConflictingFields, "position_stream_stride", "mrope_section");
  }
  if constexpr (!kIsQuantized<C>) {
    if (p.key_scale != nullptr) return fail(StatusCode::kConflictingFields, "key_scale", "key_cache");
    if (p.value_scale != nullptr) return fail(StatusCode::kConflictingFields, "value_scale", "value_cache");
  }
  if constexpr (!kIsNvfp4<C>) {
    if (p.key_block_scales.data != nullptr)
      return fail(StatusCode::kConflictingFields, "key_block_scales", "key_cache");
    if (p.value_block_scales.data != nullptr)
      return fail(StatusCode::kConflictingFields, "value_block_scales", "value_cache");
  } else {
    // A block of 16 values is one chunk of neighbouring lanes (detail/append/formats.cuh): D and R multiples
    // of 32, so that no block straddles the halves of a row or the rotated and pass-through parts, and the
    // vector path's 16-byte chunks, at most 64 a row (the alignment: validate_append).
    constexpr int64_t kWide = 16 / sizeof(T);
    if (p.head_dim % 32 != 0 || p.head_dim > 64 * kWide) return fail(StatusCode::kUnsupportedByCacheFormat, "head_dim");
    if (effective_rotary_dim(p.rotary_dim, p.head_dim) % 32 != 0)
      return fail(StatusCode::kUnsupportedByCacheFormat, "rotary_dim");
  }
  return {};
}

// Checks an append call without touching the device: sizes, one table source, required pointers,
// strides, disjoint output rows, outputs clear of every input and of each other (q in place and k in
// place are outputs only); for NVFP4 caches, what their store needs (check_append_sizes, and the vector path).
template <typename T, typename C, typename Pos>
Status validate_append(const AppendParams<T, C, Pos>& p) {
  static_assert(kIsCacheTypeFor<T, C>,
                "kvrope: the cache type C must be T, __nv_fp8_e4m3, __nv_fp8_e5m2 or kvrope::nvfp4_e2m1x2");
  if (Status s = check_append_sizes(p); !s) return s;
  const int64_t d = p.head_dim;
  const int64_t rotary = effective_rotary_dim(p.rotary_dim, d);
  const int64_t rows = p.query_heads + p.heads > 0 ? p.tokens : 0;  // tokens with a row to rotate
  const bool f32 = p.cos_sin_cache_f32 != nullptr;
  if (rows > 0 && p.cos_sin_cache == nullptr && !f32) return fail(StatusCode::kNullPointer, "cos_sin_cache");
  const bool q_fp8 = p.query_out_fp8.data != nullptr;
  const bool q_in_place = p.query_out.data == nullptr && !q_fp8;
  const int64_t q_tokens = p.query_heads > 0 ? p.tokens : 0;
  const int64_t kv_tokens = p.heads > 0 ? p.tokens : 0;
  const int64_t scales = p.scale_per_head ? p.heads : 1;
  const int64_t cache_pages = p.heads > 0 ? p.num_pages : 0;
  const int64_t cache_row = kIsNvfp4<C> ? d / 2 : d;  // NVFP4: two values a byte
  const int64_t scale_pages = kIsNvfp4<C> ? cache_pages : 0;
  const std::array<Layout, 11> in{
      token_heads_layout("key", {"key.token_stride", "key.head_stride"}, TokenHeads<const T>(p.key),
                         p.key_in_place ? 0 : kv_tokens, p.heads, d),
      token_heads_layout("value", {"value.token_stride", "value.head_stride"}, p.value, kv_tokens, p.heads, d),
      token_heads_layout("query", {"query.token_stride", "query.head_stride"}, TokenHeads<const T>(p.query),
                         q_in_place ? 0 : q_tokens, p.query_heads, d),
      positions_layout(p, rows),
      flat_layout(f32 ? "cos_sin_cache_f32" : "cos_sin_cache",
                  f32 ? static_cast<const void*>(p.cos_sin_cache_f32) : p.cos_sin_cache, f32 ? 4 : sizeof(T),
                  rows > 0 ? p.max_position * rotary : 0),
      flat_layout("slot_mapping", p.slot_mapping, sizeof(int64_t), kv_tokens),
      flat_layout("query_norm_weight", p.query_norm_weight, sizeof(T), p.query_norm_weight ? d : 0),
      flat_layout("key_norm_weight", p.key_norm_weight, sizeof(T), p.key_norm_weight ? d : 0),
      flat_layout("key_scale", p.key_scale, 4, p.key_scale ? scales : 0),
      flat_layout("value_scale", p.value_scale, 4, p.value_scale ? scales : 0),
      flat_layout("query_scale", p.query_scale, 4, p.query_scale ? 1 : 0)};
  const std::array<Layout, 7> out{
      q_in_place ? token_heads_layout("query", {"query.token_stride", "query.head_stride"}, p.query, q_tokens,
                                      p.query_heads, d)
      : q_fp8    ? token_heads_layout("query_out_fp8", {"query_out_fp8.token_stride", "query_out_fp8.head_stride"},
                                      p.query_out_fp8, q_tokens, p.query_heads, d)
                 : token_heads_layout("query_out", {"query_out.token_stride", "query_out.head_stride"}, p.query_out,
                                      q_tokens, p.query_heads, d),
      p.key_in_place ? token_heads_layout("key", {"key.token_stride", "key.head_stride"}, p.key, kv_tokens, p.heads, d)
                     : token_heads_layout("key_out", {"key_out.token_stride", "key_out.head_stride"}, p.key_out,
                                          p.key_out.data ? kv_tokens : 0, p.heads, d),
      paged_layout("key_cache", {"key_cache.page_stride", "key_cache.offset_stride", "key_cache.head_stride"},
                   p.key_cache, cache_pages, p.page_size, p.heads, cache_row),
      paged_layout("value_cache", {"value_cache.page_stride", "value_cache.offset_stride", "value_cache.head_stride"},
                   p.value_cache, cache_pages, p.page_size, p.heads, cache_row),
      paged_layout("key_block_scales",
                   {"key_block_scales.page_stride", "key_block_scales.offset_stride", "key_block_scales.head_stride"},
                   p.key_block_scales, scale_pages, p.page_size, p.heads, d / 16),
      paged_layout(
          "value_block_scales",
          {"value_block_scales.page_stride", "value_block_scales.offset_stride", "value_block_scales.head_stride"},
          p.value_block_scales, scale_pages, p.page_size, p.heads, d / 16),
      // (the flag too: no output may overlap it)
      flat_layout("error_flag", p.error_flag, 4, p.error_flag ? 1 : 0)};
  if (Status s = check_tensors(in, out); !s) return s;
  // NVFP4: a launch takes the vector path (above), so every row of the call must allow it.
  if constexpr (kIsNvfp4<C>) {
    if (p.tokens > 0 && p.heads + p.query_heads > 0)
      if (const char* cause = append_scalar_cause(append_args(p)))
        return fail(StatusCode::kUnsupportedByCacheFormat, cause);
  }
  return {};
}

}  // namespace kvrope::detail
