// Host-side checks behind kvrope::validate for the forward (docs/spec.md §2).
#pragma once

#include <array>
#include <cstdint>

#include "../../forward_params.cuh"
#include "../common/checks.cuh"

namespace kvrope::detail {

template <typename T, typename Pos>
Status check_forward_sizes(const ForwardParams<T, Pos>& p) {
  if (Status s = check_sizes(p.batch, p.heads, p.seq_len, p.cache_len); !s) return s;
  if (p.query_heads < 0) return fail(StatusCode::kInvalidSize, "query_heads");
  if (p.max_position < 0) return fail(StatusCode::kInvalidSize, "max_position");
  if (Status s = check_rotation(p.head_dim, p.rotary_dim, p.style); !s) return s;
  if (Status s = check_row_counts(p.batch, std::max(p.heads, p.query_heads), p.seq_len, p.cache_len); !s) return s;
  // One table source: per-token cos and sin, or a table cache (in T or fp32) with position ids.
  const bool per_token = p.cos.data != nullptr || p.sin.data != nullptr;
  const bool cached = p.cos_sin_cache != nullptr || p.cos_sin_cache_f32 != nullptr;
  if (p.cos_sin_cache != nullptr && p.cos_sin_cache_f32 != nullptr)
    return fail(StatusCode::kConflictingFields, "cos_sin_cache", "cos_sin_cache_f32");
  if (per_token && cached) return fail(StatusCode::kConflictingFields, "cos", "cos_sin_cache");
  if (p.position_ids_batch_stride != 0 && p.position_ids_batch_stride != p.seq_len)
    return fail(StatusCode::kInvalidStride, "position_ids_batch_stride");
  return {};
}

// Checks a forward call without touching the device: sizes, one table source, required pointers,
// strides, disjoint output rows, outputs clear of every input and of each other (in place, q is an
// output only).
template <typename T, typename Pos>
Status validate_forward(const ForwardParams<T, Pos>& p) {
  if (Status s = check_forward_sizes(p); !s) return s;
  const int64_t rotary = effective_rotary_dim(p.rotary_dim, p.head_dim);
  const int64_t rows = p.heads > 0 || p.query_heads > 0 ? p.batch : 0;  // tokens with a row to rotate
  const bool cached = p.cos_sin_cache != nullptr || p.cos_sin_cache_f32 != nullptr;
  const bool per_token = !cached && rows > 0 && p.seq_len > 0;
  const int64_t table_rows = cached ? p.max_position : 0;
  const int64_t ids = cached && rows > 0 ? (p.position_ids_batch_stride ? p.batch : 1) * p.seq_len : 0;
  const bool q_in_place = p.query_out.data == nullptr;
  const int64_t q_batch = p.query_heads > 0 ? p.batch : 0;
  const std::array<Layout, 8> in{
      head_layout("key_states", {"key_states.batch_stride", "key_states.head_stride", "key_states.seq_stride"},
                  p.key_states, p.batch, p.heads, p.seq_len, p.head_dim),
      head_layout("value_states", {"value_states.batch_stride", "value_states.head_stride", "value_states.seq_stride"},
                  p.value_states, p.batch, p.heads, p.seq_len, p.head_dim),
      flat_layout("cache_position", p.cache_position, sizeof(Pos), p.batch > 0 ? p.seq_len : 0),
      token_layout("cos", {"cos.batch_stride", "cos.seq_stride"}, p.cos, per_token ? p.batch : 0, p.seq_len, rotary),
      token_layout("sin", {"sin.batch_stride", "sin.seq_stride"}, p.sin, per_token ? p.batch : 0, p.seq_len, rotary),
      flat_layout(p.cos_sin_cache_f32 ? "cos_sin_cache_f32" : "cos_sin_cache",
                  p.cos_sin_cache_f32 ? static_cast<const void*>(p.cos_sin_cache_f32) : p.cos_sin_cache,
                  p.cos_sin_cache_f32 ? 4 : sizeof(T), table_rows * rotary),
      flat_layout("position_ids", p.position_ids, sizeof(Pos), ids),
      head_layout("query", {"query.batch_stride", "query.head_stride", "query.seq_stride"}, HeadRows<const T>(p.query),
                  q_in_place ? 0 : q_batch, p.query_heads, p.seq_len, p.head_dim)};
  const std::array<Layout, 4> out{
      head_layout("key_cache", {"key_cache.batch_stride", "key_cache.head_stride", "key_cache.seq_stride"}, p.key_cache,
                  p.batch, p.heads, p.cache_len, p.head_dim),
      head_layout("value_cache", {"value_cache.batch_stride", "value_cache.head_stride", "value_cache.seq_stride"},
                  p.value_cache, p.batch, p.heads, p.cache_len, p.head_dim),
      head_layout("key_out", {"key_out.batch_stride", "key_out.head_stride", "key_out.seq_stride"}, p.key_out,
                  p.key_out.data ? p.batch : 0, p.heads, p.seq_len, p.head_dim),
      q_in_place ? head_layout("query", {"query.batch_stride", "query.head_stride", "query.seq_stride"}, p.query,
                               q_batch, p.query_heads, p.seq_len, p.head_dim)
                 : head_layout("query_out", {"query_out.batch_stride", "query_out.head_stride", "query_out.seq_stride"},
                               p.query_out, q_batch, p.query_heads, p.seq_len, p.head_dim)};
  return check_tensors(in, out);
}

}  // namespace kvrope::detail
