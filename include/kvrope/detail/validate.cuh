// Host-side checks behind kvrope::validate: sizes, pointers, strides, overlapping rows and aliasing.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>

#include "../backward_params.cuh"
#include "../core/rotary.cuh"
#include "../core/status.cuh"

namespace kvrope::detail {

inline constexpr int64_t kMaxRows = int64_t{0xFFFFFFFF};

// One tensor as the checks see it: up to three strided dims over rows of `row` contiguous elements.
struct Layout {
  const char* name = nullptr;
  const void* data = nullptr;
  int64_t elem_bytes = 0;
  int64_t row = 0;
  int dims = 0;
  std::array<int64_t, 3> extent{};
  std::array<int64_t, 3> stride{};
  std::array<const char*, 3> stride_name{};

  int64_t elements() const {
    int64_t n = row;
    for (int i = 0; i < dims; ++i) n *= extent[i];
    return n;
  }
  // Byte range [lo, hi) the tensor touches (empty when it has no elements).
  uintptr_t lo() const { return reinterpret_cast<uintptr_t>(data); }
  uintptr_t hi() const {
    int64_t last = row;
    for (int i = 0; i < dims; ++i) last += (extent[i] - 1) * stride[i];
    return lo() + static_cast<uintptr_t>(last * elem_bytes);
  }
};

template <typename T>
Layout head_layout(const char* name, const char* const (&strides)[3], const HeadRows<T>& v, int64_t batch,
                   int64_t heads, int64_t len, int64_t head_dim) {
  return Layout{name,
                v.data,
                int64_t{sizeof(T)},
                head_dim,
                3,
                {batch, heads, len},
                {v.batch_stride, v.head_stride, v.seq_stride},
                {strides[0], strides[1], strides[2]}};
}
template <typename T>
Layout token_layout(const char* name, const char* const (&strides)[2], const TokenRows<T>& v, int64_t batch,
                    int64_t len, int64_t head_dim) {
  return Layout{name,
                v.data,
                int64_t{sizeof(T)},
                head_dim,
                2,
                {batch, len, 1},
                {v.batch_stride, v.seq_stride, 0},
                {strides[0], strides[1], nullptr}};
}

// A flat array of `count` elements of `elem_bytes` (cache_position, the workspace).
inline Layout flat_layout(const char* name, const void* data, int64_t elem_bytes, int64_t count) {
  return Layout{name, data, elem_bytes, count, 1, {1, 1, 1}, {1, 0, 0}, {name, nullptr, nullptr}};
}

// The dims of `t` ordered by increasing stride (an insertion sort of at most three entries).
inline std::array<int, 3> by_stride(const Layout& t) {
  std::array<int, 3> order{0, 1, 2};
  for (int i = 1; i < t.dims; ++i)
    for (int k = i; k > 0 && t.stride[order[k]] < t.stride[order[k - 1]]; --k) std::swap(order[k], order[k - 1]);
  return order;
}

inline Status check_strides(const Layout& t) {
  for (int i = 0; i < t.dims; ++i)
    if (t.stride[i] < 0) return fail(StatusCode::kInvalidStride, t.stride_name[i]);
  return {};
}

// An output's rows must not overlap each other: with the dims of extent > 1 sorted by stride, each
// stride must be at least the span of everything inside it.
inline Status check_rows_disjoint(const Layout& t) {
  if (t.elements() == 0) return {};
  const std::array<int, 3> order = by_stride(t);
  int64_t span = t.row;
  for (int k = 0; k < t.dims; ++k) {
    const int i = order[k];
    if (t.extent[i] <= 1) continue;
    if (t.stride[i] < span) return fail(StatusCode::kOverlappingRows, t.stride_name[i]);
    span = t.stride[i] * t.extent[i];
  }
  return {};
}

// Whether some row of `b` overlaps some row of `a`, when both have the same shape and strides (two
// views into one interleaved buffer, as a fused QKV gradient gives). The nearest row offset of `a`
// to the byte distance between them is found dim by dim, from the largest stride down, trying the
// two neighbouring multiples at each level.
inline bool lattice_hits(const Layout& a, int64_t distance, int level, const std::array<int, 3>& order) {
  if (level < 0) return std::llabs(distance) < a.row;
  const int i = order[level];
  const int64_t s = a.stride[i];
  if (s == 0 || a.extent[i] <= 1) return lattice_hits(a, distance, level - 1, order);
  const int64_t q = distance >= 0 ? distance / s : -((-distance + s - 1) / s);
  for (int64_t k : {q, q + 1}) {
    const int64_t kc = std::clamp<int64_t>(k, -(a.extent[i] - 1), a.extent[i] - 1);
    if (lattice_hits(a, distance - kc * s, level - 1, order)) return true;
  }
  return false;
}

inline bool overlaps(const Layout& a, const Layout& b) {
  if (a.elements() == 0 || b.elements() == 0) return false;
  if (a.hi() <= b.lo() || b.hi() <= a.lo()) return false;
  const bool same_shape = a.elem_bytes == b.elem_bytes && a.row == b.row && a.dims == b.dims && a.extent == b.extent &&
                          a.stride == b.stride;
  const int64_t bytes = static_cast<int64_t>(b.lo()) - static_cast<int64_t>(a.lo());
  if (!same_shape || bytes % a.elem_bytes != 0) return true;  // conservative
  return lattice_hits(a, bytes / a.elem_bytes, a.dims - 1, by_stride(a));
}

// A head row's size and rotation, as both ops take them.
inline Status check_rotation(int64_t head_dim, int64_t rotary_dim, RotaryStyle style) {
  if (head_dim <= 0 || head_dim % 2 != 0) return fail(StatusCode::kInvalidHeadDim, "head_dim");
  if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2 != 0)
    return fail(StatusCode::kInvalidHeadDim, "rotary_dim");
  if (style != RotaryStyle::kRotateHalf && style != RotaryStyle::kInterleaved)
    return fail(StatusCode::kInvalidSize, "style");
  return {};
}

// Row counts the kernels index in 32 bits: a cache's, the tokens', and every tensor's (its heads x rows).
inline Status check_row_counts(int64_t batch, int64_t heads, int64_t seq_len, int64_t cache_len) {
  if (cache_len > kMaxRows) return fail(StatusCode::kTooLarge, "cache_len");
  if (seq_len > kMaxRows) return fail(StatusCode::kTooLarge, "seq_len");
  const double rows =
      static_cast<double>(batch) * static_cast<double>(heads) * static_cast<double>(std::max(cache_len, seq_len));
  if (rows > static_cast<double>(kMaxRows) || static_cast<double>(batch) * seq_len > kMaxRows)
    return fail(StatusCode::kTooLarge, "batch");
  return {};
}

template <typename T, typename Pos>
Status check_common_sizes(const BackwardCommon<T, Pos>& p) {
  if (p.batch < 0) return fail(StatusCode::kInvalidSize, "batch");
  if (p.heads < 0) return fail(StatusCode::kInvalidSize, "heads");
  if (p.seq_len < 0) return fail(StatusCode::kInvalidSize, "seq_len");
  if (p.cache_len < 0) return fail(StatusCode::kInvalidSize, "cache_len");
  if (Status s = check_rotation(p.head_dim, p.rotary_dim, p.style); !s) return s;
  // Table gradients summed over the batch (batch stride 0) are both summed or neither.
  if (p.grad_cos.data && p.grad_sin.data && p.batch > 1 &&
      (p.grad_cos.batch_stride == 0) != (p.grad_sin.batch_stride == 0))
    return fail(StatusCode::kInvalidStride, "grad_sin.batch_stride");
  return check_row_counts(p.batch, p.heads, p.seq_len, p.cache_len);
}

// Checks a list of inputs and outputs: pointers present where there are elements, strides
// non-negative, output rows disjoint, outputs clear of every input and of each other.
template <size_t NIn, size_t NOut>
Status check_tensors(const std::array<Layout, NIn>& in, const std::array<Layout, NOut>& out) {
  for (const Layout& t : in) {
    if (t.elements() > 0 && t.data == nullptr) return fail(StatusCode::kNullPointer, t.name);
  }
  for (const Layout& t : out) {
    if (t.elements() > 0 && t.data == nullptr) return fail(StatusCode::kNullPointer, t.name);
  }
  for (const Layout& t : in) {
    if (Status s = check_strides(t); !s) return s;
  }
  for (const Layout& t : out) {
    if (Status s = check_strides(t); !s) return s;
    if (Status s = check_rows_disjoint(t); !s) return s;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    for (const Layout& t : in)
      if (overlaps(out[i], t)) return fail(StatusCode::kAliasedBuffers, out[i].name, t.name);
    for (size_t j = 0; j < i; ++j)
      if (overlaps(out[i], out[j])) return fail(StatusCode::kAliasedBuffers, out[i].name, out[j].name);
  }
  return {};
}

#define KVROPE_DETAIL_HEAD_STRIDES(x) \
  { #x ".batch_stride", #x ".head_stride", #x ".seq_stride" }
#define KVROPE_DETAIL_TOKEN_STRIDES(x) \
  { #x ".batch_stride", #x ".seq_stride" }

template <typename T, typename Pos>
std::array<Layout, 4> common_inputs(const BackwardCommon<T, Pos>& p) {
  const bool tables = p.grad_cos.data != nullptr || p.grad_sin.data != nullptr;
  const int64_t key_batch = tables ? p.batch : 0;  // key_states is not read without table gradients
  const int64_t table_batch = p.heads > 0 ? p.batch : 0;
  const int64_t rotary = effective_rotary_dim(p.rotary_dim, p.head_dim);
  const Layout pos = flat_layout("cache_position", p.cache_position, sizeof(Pos), p.batch > 0 ? p.seq_len : 0);
  return {head_layout("key_states", KVROPE_DETAIL_HEAD_STRIDES(key_states), p.key_states, key_batch, p.heads, p.seq_len,
                      p.head_dim),
          token_layout("cos", KVROPE_DETAIL_TOKEN_STRIDES(cos), p.cos, table_batch, p.seq_len, rotary),
          token_layout("sin", KVROPE_DETAIL_TOKEN_STRIDES(sin), p.sin, table_batch, p.seq_len, rotary), pos};
}

// A table gradient's batch extent: 0 when not asked for, 1 when summed over the batch (batch stride 0).
template <typename T>
int64_t table_grad_batch(const TokenRows<T>& v, int64_t batch) {
  return v.data == nullptr ? 0 : v.batch_stride == 0 ? std::min<int64_t>(batch, 1) : batch;
}

template <typename T, typename Pos>
std::array<Layout, 4> common_outputs(const BackwardCommon<T, Pos>& p) {
  const int64_t rotary = effective_rotary_dim(p.rotary_dim, p.head_dim);
  return {head_layout("grad_key_states", KVROPE_DETAIL_HEAD_STRIDES(grad_key_states), p.grad_key_states, p.batch,
                      p.heads, p.seq_len, p.head_dim),
          head_layout("grad_value_states", KVROPE_DETAIL_HEAD_STRIDES(grad_value_states), p.grad_value_states, p.batch,
                      p.heads, p.seq_len, p.head_dim),
          token_layout("grad_cos", KVROPE_DETAIL_TOKEN_STRIDES(grad_cos), p.grad_cos,
                       table_grad_batch(p.grad_cos, p.batch), p.seq_len, rotary),
          token_layout("grad_sin", KVROPE_DETAIL_TOKEN_STRIDES(grad_sin), p.grad_sin,
                       table_grad_batch(p.grad_sin, p.batch), p.seq_len, rotary)};
}

// A [B, H, S_max, D] cache (or cache gradient) of the call.
template <typename T, typename Pos, typename V>
Layout cache_layout(const BackwardCommon<T, Pos>& p, const char* name, const char* const (&strides)[3],
                    const HeadRows<V>& view) {
  return head_layout(name, strides, view, p.batch, p.heads, p.cache_len, p.head_dim);
}

template <typename T, size_t N, size_t M>
std::array<T, N + M> concat(const std::array<T, N>& a, const std::array<T, M>& b) {
  std::array<T, N + M> out;
  std::copy(a.begin(), a.end(), out.begin());
  std::copy(b.begin(), b.end(), out.begin() + N);
  return out;
}

// gK and gV of either variant: inputs out of place, outputs in place.
template <typename Params>
std::array<Layout, 2> incoming_caches(const Params& p) {
  return {cache_layout(p, "grad_key_cache", KVROPE_DETAIL_HEAD_STRIDES(grad_key_cache), p.grad_key_cache),
          cache_layout(p, "grad_value_cache", KVROPE_DETAIL_HEAD_STRIDES(grad_value_cache), p.grad_value_cache)};
}

// Checks an out-of-place call without touching the device: sizes, required pointers (a tensor with
// no elements may be null), strides, disjoint output rows, outputs clear of inputs and of each other.
template <typename T, typename Pos>
Status validate_backward(const BackwardParams<T, Pos>& p) {
  if (Status s = check_common_sizes(p); !s) return s;
  const std::array<Layout, 2> cache_grads{
      cache_layout(p, "grad_key_cache_input", KVROPE_DETAIL_HEAD_STRIDES(grad_key_cache_input), p.grad_key_cache_input),
      cache_layout(p, "grad_value_cache_input", KVROPE_DETAIL_HEAD_STRIDES(grad_value_cache_input),
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

#undef KVROPE_DETAIL_HEAD_STRIDES
#undef KVROPE_DETAIL_TOKEN_STRIDES

}  // namespace kvrope::detail
