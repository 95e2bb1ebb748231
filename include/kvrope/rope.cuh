// The per-row RoPE building blocks (public API): the math of one head row, or a chunk of it, held in
// registers. The fused kernels are written with these; an engine can call them in its own kernels.
#pragma once

#include "core/vec.cuh"
#include "core/config.cuh"  // (last: KVROPE_UNROLL, #undef at the end)

namespace kvrope {

//! N elements of the first half of a head row, [i0, i0 + N), and the N elements of the second half
//! they pair with under rotate-half RoPE, [h + i0, h + i0 + N), with h = D / 2, in fp32.
//! RopeChunk<D / 2> with i0 = 0 holds a whole row.
template <int N>
struct RopeChunk {
  float lo[N];
  float hi[N];

  __host__ __device__ static RopeChunk zeros() {
    RopeChunk c;
    KVROPE_UNROLL
    for (int i = 0; i < N; ++i) c.lo[i] = c.hi[i] = 0.0f;
    return c;
  }
};

//! Backward of RoPE for one chunk: the gradient of the keys before RoPE from the gradient `grad` of
//! the rotated keys. out.lo = g.lo * cos.lo + g.hi * sin.hi; out.hi = g.hi * cos.hi - g.lo * sin.lo.
template <int N>
__host__ __device__ inline RopeChunk<N> rope_backward(const RopeChunk<N>& grad, const RopeChunk<N>& cos,
                                                      const RopeChunk<N>& sin) {
  RopeChunk<N> out;
  KVROPE_UNROLL
  for (int i = 0; i < N; ++i) {
    out.lo[i] = grad.lo[i] * cos.lo[i] + grad.hi[i] * sin.hi[i];
    out.hi[i] = grad.hi[i] * cos.hi[i] - grad.lo[i] * sin.lo[i];
  }
  return out;
}

//! RoPE forward for one chunk: out.lo = x.lo * cos.lo - x.hi * sin.lo; out.hi = x.hi * cos.hi + x.lo * sin.hi.
template <int N>
__host__ __device__ inline RopeChunk<N> rope_forward(const RopeChunk<N>& x, const RopeChunk<N>& cos,
                                                     const RopeChunk<N>& sin) {
  RopeChunk<N> out;
  KVROPE_UNROLL
  for (int i = 0; i < N; ++i) {
    out.lo[i] = x.lo[i] * cos.lo[i] - x.hi[i] * sin.lo[i];
    out.hi[i] = x.hi[i] * cos.hi[i] + x.lo[i] * sin.hi[i];
  }
  return out;
}

//! Adds one head's contribution to the gradients of the RoPE tables:
//! grad_cos += g * k and grad_sin += g * rot(k), with rot(k).lo = -k.hi and rot(k).hi = k.lo.
//! Summing this over the heads of a token gives grad_cos and grad_sin of that token.
template <int N>
__host__ __device__ inline void accumulate_rope_table_grads(const RopeChunk<N>& grad, const RopeChunk<N>& key,
                                                            RopeChunk<N>& grad_cos, RopeChunk<N>& grad_sin) {
  KVROPE_UNROLL
  for (int i = 0; i < N; ++i) {
    grad_cos.lo[i] += grad.lo[i] * key.lo[i];
    grad_cos.hi[i] += grad.hi[i] * key.hi[i];
    grad_sin.lo[i] -= grad.lo[i] * key.hi[i];
    grad_sin.hi[i] += grad.hi[i] * key.lo[i];
  }
}

//! The interleaved style (pairs (2i, 2i + 1)): `lo` and `hi` are two chunks of whole pairs each, with
//! their own tables. Forward: out[a] = x[a] cos[a] - x[b] sin[a], out[b] = x[b] cos[b] + x[a] sin[b].
template <int N>
__host__ __device__ inline RopeChunk<N> rope_forward_interleaved(const RopeChunk<N>& x, const RopeChunk<N>& cos,
                                                                 const RopeChunk<N>& sin) {
  RopeChunk<N> out;
  KVROPE_UNROLL
  for (int i = 0; i + 1 < N; i += 2) {
    out.lo[i] = x.lo[i] * cos.lo[i] - x.lo[i + 1] * sin.lo[i];
    out.lo[i + 1] = x.lo[i + 1] * cos.lo[i + 1] + x.lo[i] * sin.lo[i + 1];
    out.hi[i] = x.hi[i] * cos.hi[i] - x.hi[i + 1] * sin.hi[i];
    out.hi[i + 1] = x.hi[i + 1] * cos.hi[i + 1] + x.hi[i] * sin.hi[i + 1];
  }
  return out;
}

//! Backward of rope_forward_interleaved: g[a] cos[a] + g[b] sin[b] and g[b] cos[b] - g[a] sin[a].
template <int N>
__host__ __device__ inline RopeChunk<N> rope_backward_interleaved(const RopeChunk<N>& grad, const RopeChunk<N>& cos,
                                                                  const RopeChunk<N>& sin) {
  RopeChunk<N> out;
  KVROPE_UNROLL
  for (int i = 0; i + 1 < N; i += 2) {
    out.lo[i] = grad.lo[i] * cos.lo[i] + grad.lo[i + 1] * sin.lo[i + 1];
    out.lo[i + 1] = grad.lo[i + 1] * cos.lo[i + 1] - grad.lo[i] * sin.lo[i];
    out.hi[i] = grad.hi[i] * cos.hi[i] + grad.hi[i + 1] * sin.hi[i + 1];
    out.hi[i + 1] = grad.hi[i + 1] * cos.hi[i + 1] - grad.hi[i] * sin.hi[i];
  }
  return out;
}

//! accumulate_rope_table_grads for the interleaved style: grad_cos += g k, grad_sin[a] -= g[a] k[b],
//! grad_sin[b] += g[b] k[a] within each chunk.
template <int N>
__host__ __device__ inline void accumulate_rope_table_grads_interleaved(const RopeChunk<N>& grad,
                                                                        const RopeChunk<N>& key, RopeChunk<N>& grad_cos,
                                                                        RopeChunk<N>& grad_sin) {
  KVROPE_UNROLL
  for (int i = 0; i + 1 < N; i += 2) {
    grad_cos.lo[i] += grad.lo[i] * key.lo[i];
    grad_cos.lo[i + 1] += grad.lo[i + 1] * key.lo[i + 1];
    grad_sin.lo[i] -= grad.lo[i] * key.lo[i + 1];
    grad_sin.lo[i + 1] += grad.lo[i + 1] * key.lo[i];
    grad_cos.hi[i] += grad.hi[i] * key.hi[i];
    grad_cos.hi[i + 1] += grad.hi[i + 1] * key.hi[i + 1];
    grad_sin.hi[i] -= grad.hi[i] * key.hi[i + 1];
    grad_sin.hi[i + 1] += grad.hi[i + 1] * key.hi[i];
  }
}

//! Loads a chunk of a head row: N elements at row + i0 and N at row + h + i0, each as one access
//! (so row + i0 and row + h + i0 must be aligned to N * sizeof(T)).
template <int N, cub::CacheLoadModifier M = cub::LOAD_DEFAULT, typename T>
__device__ __forceinline__ RopeChunk<N> load_chunk(const T* row, int64_t h, int64_t i0) {
  RopeChunk<N> c;
  const T* p = row + i0;
  load_vec<M, T, N>(p).to_float(c.lo);
  load_vec<M, T, N>(p + h).to_float(c.hi);
  return c;
}

//! Rounds a chunk to T once and stores it at row + i0 and row + h + i0 (aligned as for load_chunk).
template <cub::CacheStoreModifier M = cub::STORE_DEFAULT, int N, typename T>
__device__ __forceinline__ void store_chunk(T* row, int64_t h, int64_t i0, const RopeChunk<N>& c) {
  T* p = row + i0;
  store_vec<M>(p, Vec<T, N>::from_float(c.lo));
  store_vec<M>(p + h, Vec<T, N>::from_float(c.hi));
}

}  // namespace kvrope

#undef KVROPE_UNROLL
