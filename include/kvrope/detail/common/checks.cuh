// Host-side checks every op's validate is built from: tensor layouts, pointers, strides, overlapping rows, aliasing,
// and the size limits of the kernels' 32-bit row indices.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>

#include "../../core/rotary.cuh"
#include "../../core/status.cuh"
#include "../../core/tensor.cuh"

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

// Whether some row of `b` overlaps some row of `a`, when both have the same strides (two views into
// one interleaved buffer, as a fused QKV projection or its gradient gives; their extents may differ).
// Row i of `a` and row j of `b` overlap when |distance - sum_k (i_k - j_k) stride_k| < row, with
// distance the element offset of b from a: the nearest such sum is found dim by dim, from the largest
// stride down, trying the two neighbouring multiples at each level, each within
// i_k - j_k in [-(b.extent_k - 1), a.extent_k - 1].
inline bool lattice_hits(const Layout& a, const Layout& b, int64_t distance, int level,
                         const std::array<int, 3>& order) {
  if (level < 0) return std::llabs(distance) < a.row;
  const int i = order[level];
  const int64_t s = a.stride[i];
  if (s == 0 || (a.extent[i] <= 1 && b.extent[i] <= 1)) return lattice_hits(a, b, distance, level - 1, order);
  const int64_t q = distance >= 0 ? distance / s : -((-distance + s - 1) / s);
  for (int64_t k : {q, q + 1}) {
    const int64_t kc = std::clamp<int64_t>(k, -(b.extent[i] - 1), a.extent[i] - 1);
    if (lattice_hits(a, b, distance - kc * s, level - 1, order)) return true;
  }
  return false;
}

// Views with different strides are compared row by row, when the view of fewer rows has at most this many
// (a few microseconds of host time); beyond it the answer is conservative.
inline constexpr int64_t kMaxOverlapRowProbes = 4096;

inline bool overlaps_rows(const Layout& a, const Layout& b);

inline bool overlaps(const Layout& a0, const Layout& b0) {
  if (a0.elements() == 0 || b0.elements() == 0) return false;
  if (a0.hi() <= b0.lo() || b0.hi() <= a0.lo()) return false;
  // A dim of extent 1 in both never moves, so its strides do not matter: torch gives a size-1 dim the
  // stride of what is inside it, so q and k of one fused qkv differ there at S = 1 (Hq D against H D).
  Layout a = a0, b = b0;
  if (a.dims == b.dims)
    for (int i = 0; i < a.dims; ++i)
      if (a.extent[i] <= 1 && b.extent[i] <= 1) a.stride[i] = b.stride[i] = 0;
  const bool same_rows = a.elem_bytes == b.elem_bytes && a.row == b.row && a.dims == b.dims;
  const int64_t bytes = static_cast<int64_t>(b.lo()) - static_cast<int64_t>(a.lo());
  if (!same_rows || bytes % a.elem_bytes != 0) return true;  // conservative
  if (a.stride != b.stride) return overlaps_rows(a, b);
  // The search is exact when each stride exceeds the reach of the dims inside it; else conservative.
  const std::array<int, 3> order = by_stride(a);
  int64_t reach = a.row;
  for (int k = 0; k < a.dims; ++k) {
    const int i = order[k];
    const int64_t e = std::max(a.extent[i], b.extent[i]);
    if (e <= 1 || a.stride[i] == 0) continue;
    if (a.stride[i] < reach) return true;
    reach += (e - 1) * a.stride[i];
  }
  return lattice_hits(a, b, bytes / a.elem_bytes, a.dims - 1, order);
}

// Views of one row size with different strides: each row of the view with fewer rows, as a view of one
// row given the other's strides (a dim of extent 1 in both is then ignored), against the other view.
inline bool overlaps_rows(const Layout& a0, const Layout& b0) {
  const bool a_fewer = a0.elements() <= b0.elements();
  const Layout& few = a_fewer ? a0 : b0;
  const Layout& many = a_fewer ? b0 : a0;
  if (few.elements() / few.row > kMaxOverlapRowProbes) return true;  // conservative
  Layout probe = many;
  probe.extent = {1, 1, 1};
  const auto* base = static_cast<const char*>(few.data);
  for (int64_t i0 = 0; i0 < few.extent[0]; ++i0)
    for (int64_t i1 = 0; i1 < (few.dims > 1 ? few.extent[1] : 1); ++i1)
      for (int64_t i2 = 0; i2 < (few.dims > 2 ? few.extent[2] : 1); ++i2) {
        probe.data = base + (i0 * few.stride[0] + i1 * few.stride[1] + i2 * few.stride[2]) * few.elem_bytes;
        if (overlaps(probe, many)) return true;
      }
  return false;
}

// A head row's size and rotation, as every op takes them.
inline Status check_rotation(int64_t head_dim, int64_t rotary_dim, RotaryStyle style) {
  if (head_dim <= 0 || head_dim % 2 != 0) return fail(StatusCode::kInvalidHeadDim, "head_dim");
  if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2 != 0)
    return fail(StatusCode::kInvalidRotaryDim, "rotary_dim");
  if (style != RotaryStyle::kRotateHalf && style != RotaryStyle::kInterleaved)
    return fail(StatusCode::kInvalidStyle, "style");
  return {};
}

// The sizes of the backward and the forward: none negative, named in this order.
inline Status check_sizes(int64_t batch, int64_t heads, int64_t seq_len, int64_t cache_len) {
  if (batch < 0) return fail(StatusCode::kInvalidSize, "batch");
  if (heads < 0) return fail(StatusCode::kInvalidSize, "heads");
  if (seq_len < 0) return fail(StatusCode::kInvalidSize, "seq_len");
  if (cache_len < 0) return fail(StatusCode::kInvalidSize, "cache_len");
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

template <typename T, size_t N, size_t M>
std::array<T, N + M> concat(const std::array<T, N>& a, const std::array<T, M>& b) {
  std::array<T, N + M> out;
  std::copy(a.begin(), a.end(), out.begin());
  std::copy(b.begin(), b.end(), out.begin() + N);
  return out;
}

}  // namespace kvrope::detail
