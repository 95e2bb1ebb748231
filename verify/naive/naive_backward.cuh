// The naive GPU backward: the op computed step by step the way the published PyTorch reference
// does it (gather, elementwise products, concatenation, head sums, clone, zeroing of rows), one
// simple kernel per step with temporaries. It is what the benchmark compares the fused kernel with
// (verify/naive/: not installed; the GPU tests check it against the float64 reference too).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include <kvrope/backward.cuh>

namespace kvrope::reference {

namespace naive {

// Every step is an elementwise grid-stride loop over a [B, H, S, D] (or [B, S, D]) index space.
struct Index4 {
  int64_t b, j, s, d;
};
__device__ inline Index4 unflatten(int64_t i, int64_t H, int64_t S, int64_t D) {
  Index4 x;
  x.d = i % D;
  i /= D;
  x.s = i % S;
  i /= S;
  x.j = i % H;
  x.b = i / H;
  return x;
}

__device__ inline int64_t grid_begin() { return blockIdx.x * int64_t{blockDim.x} + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t{gridDim.x} * blockDim.x; }

template <typename Pos>
__device__ inline int64_t row_of(const Pos* positions, int64_t t, int64_t cache_len) {
  int64_t r = static_cast<int64_t>(positions[t]);
  if (r < 0) r += cache_len;
  return (r >= 0 && r < cache_len) ? r : -1;
}

// Reports positions outside [-S_max, S_max) (the indexing step's bounds check).
template <typename Pos>
__global__ void check_positions(const Pos* positions, int64_t seq_len, int64_t cache_len, int* error_flag) {
  for (int64_t t = grid_begin(); t < seq_len; t += grid_stride())
    if (row_of(positions, t, cache_len) < 0) atomicOr(error_flag, kErrorPositionOutOfRange);
}

// gk_sel = gK[:, :, p] (fp32 temporary); grad_value_states = gV[:, :, p].
template <typename T, typename Pos>
__global__ void gather(BackwardParams<T, Pos> p, float* gk_sel, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const Index4 x = unflatten(i, p.heads, p.seq_len, p.head_dim);
    const int64_t r = row_of(p.cache_position, x.s, p.cache_len);
    gk_sel[i] = r < 0 ? 0.0f : to_float(p.grad_key_cache.row(x.b, x.j, r)[x.d]);
    p.grad_value_states.row(x.b, x.j, x.s)[x.d] =
        r < 0 ? from_float<T>(0.0f) : p.grad_value_cache.row(x.b, x.j, r)[x.d];
  }
}

// out = a * table (a table broadcast over heads), fp32.
template <typename T>
__global__ void mul_table(const float* a, TokenRows<const T> table, float* out, int64_t H, int64_t S, int64_t D,
                          int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const Index4 x = unflatten(i, H, S, D);
    out[i] = a[i] * to_float(table.row(x.b, x.s)[x.d]);
  }
}

// rot(k) = cat(-k[..., h:], k[..., :h]), fp32.
template <typename T>
__global__ void rotate_half(HeadRows<const T> k, float* out, int64_t H, int64_t S, int64_t D, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const Index4 x = unflatten(i, H, S, D);
    const int64_t h = D / 2;
    const T* row = k.row(x.b, x.j, x.s);
    out[i] = x.d < h ? -to_float(row[x.d + h]) : to_float(row[x.d - h]);
  }
}

// out = a * b, fp32 (b read from a [B, H, S, D] tensor of T, or from an fp32 temporary).
template <typename T>
__global__ void mul_key(const float* a, HeadRows<const T> k, float* out, int64_t H, int64_t S, int64_t D, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const Index4 x = unflatten(i, H, S, D);
    out[i] = a[i] * to_float(k.row(x.b, x.j, x.s)[x.d]);
  }
}
template <typename F>
__global__ void mul(const F* a, const F* b, F* out, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) out[i] = a[i] * b[i];
}

// grad_key_states = gc + cat(gs[..., h:], -gs[..., :h]) (the backward of rotate_half, concatenated).
template <typename T>
__global__ void combine(const float* gc, const float* gs, HeadRows<T> out, int64_t H, int64_t S, int64_t D, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const Index4 x = unflatten(i, H, S, D);
    const int64_t h = D / 2;
    const float rot = x.d < h ? gs[i + h] : -gs[i - h];
    out.row(x.b, x.j, x.s)[x.d] = from_float<T>(gc[i] + rot);
  }
}

// out[b, s, d] = sum over heads of a[b, :, s, d].
template <typename T>
__global__ void head_sum(const float* a, TokenRows<T> out, int64_t H, int64_t S, int64_t D, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const int64_t d = i % D, s = (i / D) % S, b = i / (D * S);
    float sum = 0.0f;
    for (int64_t j = 0; j < H; ++j) sum += a[((b * H + j) * S + s) * D + d];
    out.row(b, s)[d] = from_float<T>(sum);
  }
}

// out = in (clone of a cache).
template <typename T>
__global__ void clone(HeadRows<const T> in, HeadRows<T> out, int64_t H, int64_t L, int64_t D, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const Index4 x = unflatten(i, H, L, D);
    out.row(x.b, x.j, x.s)[x.d] = in.row(x.b, x.j, x.s)[x.d];
  }
}

// out[:, :, p] = 0.
template <typename T, typename Pos>
__global__ void zero_rows(HeadRows<T> out, const Pos* positions, int64_t L, int64_t H, int64_t S, int64_t D,
                          int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const Index4 x = unflatten(i, H, S, D);
    const int64_t r = row_of(positions, x.s, L);
    if (r >= 0) out.row(x.b, x.j, r)[x.d] = from_float<T>(0.0f);
  }
}

inline int blocks_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

}  // namespace naive

//! Bytes of device workspace naive_backward needs: four fp32 temporaries of [B, H, S, D].
template <typename T, typename Pos>
size_t naive_backward_workspace_bytes(const BackwardParams<T, Pos>& p) {
  return 4 * sizeof(float) * static_cast<size_t>(p.batch * p.heads * p.seq_len * p.head_dim);
}

//! The out-of-place backward, step by step (14 launches at most). Temporaries are fp32, so the
//! results meet the same tolerance as the fused kernel (PyTorch eager would round them to T).
template <typename T, typename Pos>
Status naive_backward(const BackwardParams<T, Pos>& p, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream = nullptr) {
  if (Status s = validate(p); !s) return s;
  // The steps of the published reference: rotate-half, R = D, table gradients per batch only.
  if (p.style != RotaryStyle::kRotateHalf) return kvrope::detail::fail(StatusCode::kInvalidSize, "style");
  if (effective_rotary_dim(p.rotary_dim, p.head_dim) != p.head_dim)
    return kvrope::detail::fail(StatusCode::kInvalidSize, "rotary_dim");
  if (p.batch > 1 &&
      ((p.grad_cos.data && p.grad_cos.batch_stride == 0) || (p.grad_sin.data && p.grad_sin.batch_stride == 0)))
    return kvrope::detail::fail(StatusCode::kInvalidStride, "grad_cos.batch_stride");
  if (workspace_bytes < naive_backward_workspace_bytes(p))
    return kvrope::detail::fail(StatusCode::kInvalidSize, "workspace_bytes");
  const int64_t H = p.heads, S = p.seq_len, L = p.cache_len, D = p.head_dim;
  const int64_t n_tok = p.batch * H * S * D, n_tab = p.batch * S * D, n_cache = p.batch * H * L * D;
  float* gk_sel = static_cast<float*>(workspace);
  float* t1 = gk_sel + n_tok;
  float* t2 = t1 + n_tok;
  float* t3 = t2 + n_tok;
  using namespace naive;
  constexpr int kThreads = 256;
  if (p.batch > 0 && p.seq_len > 0 && p.error_flag)
    check_positions<<<blocks_for(p.seq_len), kThreads, 0, stream>>>(p.cache_position, S, L, p.error_flag);
  if (n_tok > 0) {
    gather<<<blocks_for(n_tok), kThreads, 0, stream>>>(p, gk_sel, n_tok);
    mul_table<<<blocks_for(n_tok), kThreads, 0, stream>>>(gk_sel, p.cos, t1, H, S, D, n_tok);
    mul_table<<<blocks_for(n_tok), kThreads, 0, stream>>>(gk_sel, p.sin, t2, H, S, D, n_tok);
    combine<<<blocks_for(n_tok), kThreads, 0, stream>>>(t1, t2, p.grad_key_states, H, S, D, n_tok);
    if (p.grad_cos.data) {
      mul_key<<<blocks_for(n_tok), kThreads, 0, stream>>>(gk_sel, p.key_states, t1, H, S, D, n_tok);
      head_sum<<<blocks_for(n_tab), kThreads, 0, stream>>>(t1, p.grad_cos, H, S, D, n_tab);
    }
    if (p.grad_sin.data) {
      rotate_half<<<blocks_for(n_tok), kThreads, 0, stream>>>(p.key_states, t3, H, S, D, n_tok);
      mul<<<blocks_for(n_tok), kThreads, 0, stream>>>(gk_sel, t3, t2, n_tok);
      head_sum<<<blocks_for(n_tab), kThreads, 0, stream>>>(t2, p.grad_sin, H, S, D, n_tab);
    }
  } else if (n_tab > 0) {  // no heads: the table gradients are sums of nothing
    if (p.grad_cos.data) head_sum<<<blocks_for(n_tab), kThreads, 0, stream>>>(t1, p.grad_cos, H, S, D, n_tab);
    if (p.grad_sin.data) head_sum<<<blocks_for(n_tab), kThreads, 0, stream>>>(t2, p.grad_sin, H, S, D, n_tab);
  }
  if (n_cache > 0) {
    clone<<<blocks_for(n_cache), kThreads, 0, stream>>>(p.grad_key_cache, p.grad_key_cache_input, H, L, D, n_cache);
    clone<<<blocks_for(n_cache), kThreads, 0, stream>>>(p.grad_value_cache, p.grad_value_cache_input, H, L, D, n_cache);
    if (n_tok > 0) {
      zero_rows<<<blocks_for(n_tok), kThreads, 0, stream>>>(p.grad_key_cache_input, p.cache_position, L, H, S, D,
                                                            n_tok);
      zero_rows<<<blocks_for(n_tok), kThreads, 0, stream>>>(p.grad_value_cache_input, p.cache_position, L, H, S, D,
                                                            n_tok);
    }
  }
  return kvrope::detail::cuda_status(cudaGetLastError(), "naive kernel launch");
}

}  // namespace kvrope::reference
