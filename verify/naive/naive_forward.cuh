// The naive GPU forward: the op as Hugging Face runs it, step by step (apply_rotary_pos_emb on k, the two
// index_copy_ of StaticCache.update, apply_rotary_pos_emb on q), one simple kernel per step with a temporary
// for the rotated keys. It is what the benchmark compares the fused forward with (docs/spec.md §2)
// (verify/naive/: not installed; the tests check it against the float64 reference too).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include <kvrope/core/dtype.cuh>
#include <kvrope/core/rotary.cuh>
#include <kvrope/core/status.cuh>
#include <kvrope/forward.cuh>
#include <kvrope/forward_params.cuh>

namespace kvrope::reference {

namespace naive_fwd {

__device__ inline int64_t grid_begin() { return blockIdx.x * int64_t{blockDim.x} + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t{gridDim.x} * blockDim.x; }

inline int blocks_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

// The cache row of token t, or -1 when its position is outside [-S_max, S_max) (negatives wrap).
template <typename Pos>
__device__ inline int64_t cache_row_of(const Pos* positions, int64_t t, int64_t cache_len) {
  int64_t r = static_cast<int64_t>(positions[t]);
  if (r < 0) r += cache_len;
  return (r >= 0 && r < cache_len) ? r : -1;
}

// The table-cache row of token t of batch b (its position id), or -1 when outside [0, max_position); t with
// per-token tables.
template <typename T, typename Pos>
__device__ inline int64_t table_row_of(const ForwardParams<T, Pos>& p, int64_t b, int64_t t) {
  if (!p.cos_sin_cache && !p.cos_sin_cache_f32) return t;
  const int64_t id = static_cast<int64_t>(p.position_ids[b * p.position_ids_batch_stride + t]);
  return (id >= 0 && id < p.max_position) ? id : -1;
}

template <typename T, typename Pos>
__device__ inline float table_cache_at(const ForwardParams<T, Pos>& p, int64_t i) {
  return p.cos_sin_cache_f32 ? p.cos_sin_cache_f32[i] : to_float(p.cos_sin_cache[i]);
}

// Step 0 (one thread a token of a batch): reports out-of-range positions and position ids, and marks in
// writer[b, r] the last valid token that names row r (atomicMax over a table filled with -1), so that the
// index copies below write each row once and the last token wins. writer may be null (no KV heads).
template <typename T, typename Pos>
__global__ void mark_rows(ForwardParams<T, Pos> p, int* writer, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const int64_t b = i / p.seq_len, t = i % p.seq_len;
    const int64_t r = cache_row_of(p.cache_position, t, p.cache_len);
    const bool valid = table_row_of(p, b, t) >= 0;
    if (p.error_flag && r < 0) atomicOr(p.error_flag, kErrorPositionOutOfRange);
    if (p.error_flag && !valid) atomicOr(p.error_flag, kErrorPositionIdOutOfRange);
    if (writer && valid && r >= 0) atomicMax(writer + b * p.cache_len + r, static_cast<int>(t));
  }
}

// Steps 1 and 4: out = x * cos + rotate(x) * sin (Hugging Face's apply_rotary_pos_emb, rotate_half or its
// interleaved form), the pass-through elements R..D-1 copied, in fp32 and rounded once to T. One thread a pair
// of a row (and one a pass-through element), so that x and out may be the same buffer (q rotated in place). A
// token whose position id is out of range writes nothing.
template <typename T, typename Pos>
__global__ void rope(ForwardParams<T, Pos> p, HeadRows<const T> x, HeadRows<T> out, int64_t heads, int64_t n) {
  const int64_t D = p.head_dim, R = p.rotary_dim == 0 ? D : p.rotary_dim, half = R / 2;  // effective_rotary_dim
  const int64_t items = D - half;  // R/2 pairs and D - R pass-through elements a row
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const int64_t w = i % items, row = i / items;
    const int64_t t = row % p.seq_len, j = (row / p.seq_len) % heads, b = row / (p.seq_len * heads);
    const int64_t tr = table_row_of(p, b, t);
    if (tr < 0) continue;
    const T* in = x.row(b, j, t);
    T* o = out.row(b, j, t);
    if (w >= half) {
      const int64_t e = R + (w - half);
      o[e] = in[e];
      continue;
    }
    const int64_t ea = p.style == RotaryStyle::kRotateHalf ? w : 2 * w;
    const int64_t eb = p.style == RotaryStyle::kRotateHalf ? w + half : 2 * w + 1;
    float ca, sa, cb, sb;
    if (p.cos_sin_cache || p.cos_sin_cache_f32) {
      ca = cb = table_cache_at(p, tr * R + w);
      sa = sb = table_cache_at(p, tr * R + half + w);
    } else {
      const T* c = p.cos.row(b, t);
      const T* s = p.sin.row(b, t);
      ca = to_float(c[ea]), cb = to_float(c[eb]), sa = to_float(s[ea]), sb = to_float(s[eb]);
    }
    const float xa = to_float(in[ea]), xb = to_float(in[eb]);
    o[ea] = from_float<T>(xa * ca - xb * sa);
    o[eb] = from_float<T>(xb * cb + xa * sb);
  }
}

// Steps 2 and 3: dst[:, :, p] = src (index_copy_ along the sequence), only by the token writer[b, row] names.
template <typename T, typename Pos>
__global__ void index_copy(HeadRows<const T> src, HeadRows<T> dst, const Pos* positions, const int* writer, int64_t H,
                           int64_t S, int64_t L, int64_t D, int64_t n) {
  for (int64_t i = grid_begin(); i < n; i += grid_stride()) {
    const int64_t d = i % D, t = (i / D) % S, j = (i / (D * S)) % H, b = i / (D * S * H);
    const int64_t r = cache_row_of(positions, t, L);
    if (r >= 0 && writer[b * L + r] == t) dst.row(b, j, r)[d] = src.row(b, j, t)[d];
  }
}

inline constexpr size_t kTempAlignment = 256;

inline size_t writer_bytes(int64_t batch, int64_t cache_len) {
  const size_t bytes = sizeof(int) * static_cast<size_t>(batch * cache_len);
  return (bytes + kTempAlignment - 1) / kTempAlignment * kTempAlignment;
}

}  // namespace naive_fwd

//! Bytes of device workspace naive_forward needs: an int a cache row of each batch (which token writes it), and
//! when key_out is null a [B, H, S, D] temporary of T for the rotated keys.
template <typename T, typename Pos>
size_t naive_forward_workspace_bytes(const ForwardParams<T, Pos>& p) {
  const size_t keys = p.key_out.data ? 0 : sizeof(T) * static_cast<size_t>(p.batch * p.heads * p.seq_len * p.head_dim);
  return naive_fwd::writer_bytes(p.batch, p.cache_len) + keys;
}

//! The forward, step by step (a memset and five launches at most): mark the row each token writes (the last
//! token naming a row wins), RoPE(k) into key_out (or the workspace), index copies of the rotated keys and of v
//! into the caches, RoPE(q) into query_out (or in place). Arithmetic in fp32 rounded once to T, so the results
//! meet the same tolerance as the fused kernel (PyTorch eager would round x*cos and rotate(x)*sin to T first).
//! Out-of-range positions and position ids are reported through error_flag as the fused forward reports them.
//! Validates as kv_cache_rope_forward does (kvrope::validate) and launches nothing when the parameters are invalid.
template <typename T, typename Pos>
Status naive_forward(const ForwardParams<T, Pos>& p, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream = nullptr) {
  if (Status s = validate(p); !s) return s;
  if (p.seq_len > int64_t{0x7FFFFFFF}) return kvrope::detail::fail(StatusCode::kTooLarge, "seq_len");  // int writer
  if (workspace_bytes < naive_forward_workspace_bytes(p))
    return kvrope::detail::fail(StatusCode::kInvalidSize, "workspace_bytes");
  if (workspace_bytes > 0 && !workspace) return kvrope::detail::fail(StatusCode::kNullPointer, "workspace");
  const int64_t B = p.batch, H = p.heads, S = p.seq_len, L = p.cache_len, D = p.head_dim, Hq = p.query_heads;
  const int64_t R = effective_rotary_dim(p.rotary_dim, D);
  const int64_t items = D - R / 2;  // threads a row in the RoPE kernel
  const int64_t n_tok = B * S, n_kv = B * H * S * D;
  int* writer = static_cast<int*>(workspace);
  HeadRows<T> keys = p.key_out;
  if (!keys.data)
    keys = bhsd(reinterpret_cast<T*>(static_cast<char*>(workspace) + naive_fwd::writer_bytes(B, L)), H, S, D);
  using namespace naive_fwd;
  constexpr int kThreads = 256;
  const bool kv = n_kv > 0;
  if (kv && L > 0) {
    if (Status s = kvrope::detail::cuda_status(
            cudaMemsetAsync(writer, 0xFF, sizeof(int) * static_cast<size_t>(B * L), stream), "cudaMemsetAsync");
        !s)
      return s;
  }
  if (n_tok > 0 && ((kv && L > 0) || p.error_flag))
    mark_rows<T, Pos><<<blocks_for(n_tok), kThreads, 0, stream>>>(p, kv && L > 0 ? writer : nullptr, n_tok);
  if (kv) {
    rope<T, Pos><<<blocks_for(B * H * S * items), kThreads, 0, stream>>>(p, p.key_states, keys, H, B * H * S * items);
    if (L > 0) {
      index_copy<T, Pos>
          <<<blocks_for(n_kv), kThreads, 0, stream>>>(keys, p.key_cache, p.cache_position, writer, H, S, L, D, n_kv);
      index_copy<T, Pos><<<blocks_for(n_kv), kThreads, 0, stream>>>(p.value_states, p.value_cache, p.cache_position,
                                                                    writer, H, S, L, D, n_kv);
    }
  }
  if (B * Hq * S > 0) {
    const HeadRows<T> q_out = p.query_out.data ? p.query_out : p.query;
    rope<T, Pos><<<blocks_for(B * Hq * S * items), kThreads, 0, stream>>>(p, p.query, q_out, Hq, B * Hq * S * items);
  }
  return kvrope::detail::cuda_status(cudaGetLastError(), "naive kernel launch");
}

}  // namespace kvrope::reference
