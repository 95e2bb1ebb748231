// Host-side checks behind kvrope::validate for the backward (docs/spec.md §1).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "../../backward_params.cuh"
#include "../common/checks.cuh"

namespace kvrope::detail {

template <typename T, typename Pos>
Status check_common_sizes(const BackwardCommon<T, Pos>& p) {
  if (Status s = check_sizes(p.batch, p.heads, p.seq_len, p.cache_len); !s) return s;
  if (Status s = check_rotation(p.head_dim, p.rotary_dim, p.style); !s) return s;
  // Table gradients summed over the batch (batch stride 0) are both summed or neither.
  if (p.grad_cos.data && p.grad_sin.data && p.batch > 1 &&
      (p.grad_cos.batch_stride == 0) != (p.grad_sin.batch_stride == 0))
    return fail(StatusCode::kInvalidStride, "grad_sin.batch_stride");
  return check_row_counts(p.batch, p.heads, p.seq_len, p.cache_len);
}

template <typename T, typename Pos>
std::array<Layout, 4> common_inputs(const BackwardCommon<T, Pos>& p) {
  const bool tables = p.grad_cos.data != nullptr || p.grad_sin.data != nullptr;
  const int64_t key_batch = tables ? p.batch : 0;  // key_states is not read without table gradients
  const int64_t table_batch = p.heads > 0 ? p.batch : 0;
  const int64_t rotary = effective_rotary_dim(p.rotary_dim, p.head_dim);
  const Layout pos = flat_layout("cache_position", p.cache_position, sizeof(Pos), p.batch > 0 ? p.seq_len : 0);
  return {head_layout("key_states", {"key_states.batch_stride", "key_states.head_stride", "key_states.seq_stride"},
                      p.key_states, key_batch, p.heads, p.seq_len, p.head_dim),
          token_layout("cos", {"cos.batch_stride", "cos.seq_stride"}, p.cos, table_batch, p.seq_len, rotary),
          token_layout("sin", {"sin.batch_stride", "sin.seq_stride"}, p.sin, table_batch, p.seq_len, rotary), pos};
}

// A table gradient's batch extent: 0 when not asked for, 1 when summed over the batch (batch stride 0).
template <typename T>
int64_t table_grad_batch(const TokenRows<T>& v, int64_t batch) {
  return v.data == nullptr ? 0 : v.batch_stride == 0 ? std::min<int64_t>(batch, 1) : batch;
}

template <typename T, typename Pos>
std::array<Layout, 4> common_outputs(const BackwardCommon<T, Pos>& p) {
  const int64_t rotary = effective_rotary_dim(p.rotary_dim, p.head_dim);
  return {
      head_layout("grad_key_states",
                  {"grad_key_states.batch_stride", "grad_key_states.head_stride", "grad_key_states.seq_stride"},
                  p.grad_key_states, p.batch, p.heads, p.seq_len, p.head_dim),
      head_layout("grad_value_states",
                  {"grad_value_states.batch_stride", "grad_value_states.head_stride", "grad_value_states.seq_stride"},
                  p.grad_value_states, p.batch, p.heads, p.seq_len, p.head_dim),
      token_layout("grad_cos", {"grad_cos.batch_stride", "grad_cos.seq_stride"}, p.grad_cos,
                   table_grad_batch(p.grad_cos, p.batch), p.seq_len, rotary),
      token_layout("grad_sin", {"grad_sin.batch_stride", "grad_sin.seq_stride"}, p.grad_sin,
                   table_grad_batch(p.grad_sin, p.batch), p.seq_len, rotary)};
}

// A [B, H, S_max, D] cache (or cache gradient) of the call.
template <typename T, typename Pos, typename V>
Layout cache_layout(const BackwardCommon<T, Pos>& p, const char* name, const char* const (&strides)[3],
                    const HeadRows<V>& view) {
  return head_layout(name, strides, view, p.batch, p.heads, p.cache_len, p.head_dim);
}

// gK and gV of either variant: inputs out of place, outputs in place.
template <typename Params>
std::array<Layout, 2> incoming_caches(const Params& p) {
  return {cache_layout(p, "grad_key_cache",
                       {"grad_key_cache.batch_stride", "grad_key_cache.head_stride", "grad_key_cache.seq_stride"},
                       p.grad_key_cache),
          cache_layout(p, "grad_value_cache",
                       {"grad_value_cache.batch_stride", "grad_value_cache.head_stride", "grad_value_cache.seq_stride"},
                       p.grad_value_cache)};
}

// Checks an out-of-place call without touching the device: sizes, required pointers (a tensor with
// no elements may be null), strides, disjoint output rows, outputs clear of inputs and of each other.
template <typename T, typename Pos>
Status validate_backward(const BackwardParams<T, Pos>& p) {
  if (Status s = check_common_sizes(p); !s) return s;
  const std::array<Layout, 2> cache_grads{
      cache_layout(
          p, "grad_key_cache_input",
          {"grad_key_cache_input.batch_stride", "grad_key_cache_input.head_stride", "grad_key_cache_input.seq_stride"},
          p.grad_key_cache_input),
      cache_layout(p, "grad_value_cache_input",
                   {"grad_value_cache_input.batch_stride", "grad_value_cache_input.head_stride",
                    "grad_value_cache_input.seq_stride"},
                   p.grad_value_cache_input)};
  // The workspace is written too: an output of two 32-bit words (none without it).
  const std::array<Layout, 1> workspace{
      flat_layout("workspace", p.workspace, 4, p.workspace ? kBackwardWorkspaceBytes / 4 : 0)};
  if (reinterpret_cast<uintptr_t>(p.workspace) % 4 != 0) return fail(StatusCode::kMisaligned, "workspace");
  return check_tensors(concat(incoming_caches(p), common_inputs(p)),
                       concat(concat(common_outputs(p), cache_grads), workspace));
}

// Checks an in-place call: as the out-of-place one, with gK and gV counted as outputs (they are
// written), so they may overlap nothing else.
template <typename T, typename Pos>
Status validate_backward(const BackwardInPlaceParams<T, Pos>& p) {
  if (Status s = check_common_sizes(p); !s) return s;
  return check_tensors(common_inputs(p), concat(common_outputs(p), incoming_caches(p)));
}

}  // namespace kvrope::detail
