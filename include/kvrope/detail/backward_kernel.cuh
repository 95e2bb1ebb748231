// The fused backward kernel: token work (gather, RoPE backward, head sums, in-place zeroing) and copy
// work (the cache rows not in cache_position) in one persistent launch.
#pragma once

#include <cstdint>

#include "../backward_params.cuh"
#include "../core/arch.cuh"
#include "../core/divmod.cuh"
#include "../rope.cuh"

namespace kvrope::detail {

//! Everything the kernel reads, with the two variants folded into one shape: the cache-input
//! gradients gk_out / gv_out are new buffers (out-of-place) or gk / gv themselves (in-place).
template <typename T>
struct BackwardArgs {
  int64_t batch, heads, seq_len, cache_len, head_dim;
  HeadRows<const T> gk, gv;
  HeadRows<T> gk_out, gv_out;
  HeadRows<const T> key;
  TokenRows<const T> cos, sin;
  HeadRows<T> grad_key, grad_value;
  TokenRows<T> grad_cos, grad_sin;
  const void* positions;
  bool positions_are_int64;
  bool in_place;
  int* error_flag;
  int64_t window_rows;  // cache rows one shared-memory bitmask covers: a multiple of 32
  int token_warps;      // out-of-place: warps [0, token_warps) of each block do token work, the rest copy
  FastDivmod div_seq;   // token index -> (b, t)
  FastDivmod div_heads;
};

// Tuning knobs for experiments (docs/perf-notes.md): 16-byte copies in flight per thread, and the
// unroll of the head loop of the token work. Override with -DKVROPE_COPY_UNROLL=N etc.
#ifndef KVROPE_COPY_UNROLL
#define KVROPE_COPY_UNROLL 8
#endif
#ifndef KVROPE_TOKEN_UNROLL
#define KVROPE_TOKEN_UNROLL 2
#endif
// Experiment (docs/perf-notes.md): 1 = every warp does its token work and then copies (the order of
// kernel v0) instead of each warp having one role. Compile-time, so the default build is unchanged.
#ifndef KVROPE_SERIAL_ROLES
#define KVROPE_SERIAL_ROLES 0
#endif
inline constexpr bool kSerialRoles = KVROPE_SERIAL_ROLES != 0;
inline constexpr int kCopyUnroll = KVROPE_COPY_UNROLL;
inline constexpr int kTokenUnroll = KVROPE_TOKEN_UNROLL;

// Elements per access of the token work: at most 4 (8 bytes of bf16/fp16, 16 of fp32), so that a
// lane's chunk pair, its table values and its two head-sum accumulators fit in registers.
template <typename T, int kVec>
inline constexpr int kTokenVec = kVec > 4 ? 4 : kVec;

//! Bytes of dynamic shared memory for a window of `window_rows` rows (one bit each).
inline constexpr int64_t mask_bytes(int64_t window_rows) { return window_rows / 32 * 4; }

// The row of the cache token t was written to, or -1 when its position is out of range.
template <typename T>
__device__ __forceinline__ int64_t cache_row(const BackwardArgs<T>& a, int64_t t) {
  int64_t p = a.positions_are_int64 ? static_cast<const int64_t*>(a.positions)[t]
                                    : static_cast<const int32_t*>(a.positions)[t];
  if (p < 0) p += a.cache_len;
  return (p >= 0 && p < a.cache_len) ? p : -1;
}

// A chunk pair as loaded, still in T (widened to fp32 where it is used).
template <typename T, int N>
struct RawChunk {
  Vec<T, N> lo, hi;
  __device__ __forceinline__ RopeChunk<N> widen() const {
    RopeChunk<N> c;
    lo.to_float(c.lo);
    hi.to_float(c.hi);
    return c;
  }
};

template <cub::CacheLoadModifier M, int N, typename T>
__device__ __forceinline__ RawChunk<T, N> load_raw(const T* row, int64_t h, int64_t i0) {
  return RawChunk<T, N>{load_vec<M, T, N>(row + i0), load_vec<M, T, N>(row + h + i0)};
}

template <cub::CacheStoreModifier M, typename T, int N>
__device__ __forceinline__ void store_raw(T* row, int64_t h, int64_t i0, const RawChunk<T, N>& c) {
  store_vec<M>(row + i0, c.lo);
  store_vec<M>(row + h + i0, c.hi);
}

// How a warp covers the head rows of one token. Each lane owns chunk pairs (N elements of the first
// half and the N they pair with in the second half); the heads of one chunk sit in consecutive
// lanes ("slots"), so the head sum is a butterfly over the low lane bits.
template <int kHeadDim, int kVec>
struct WarpLayout {
  int64_t half;     // h = D / 2
  int pairs;        // chunk pairs per row: h / kVec
  int slots;        // heads a warp covers at once: a power of two
  int steps;        // chunk steps when a row has more than 32 pairs

  __device__ __forceinline__ explicit WarpLayout(int64_t head_dim) {
    const int64_t d = kHeadDim > 0 ? kHeadDim : head_dim;
    half = d / 2;
    pairs = static_cast<int>(half / kVec);
    slots = 1;
    while (pairs * slots * 2 <= 32) slots *= 2;
    steps = (pairs + 31) / 32;
  }
};

// All heads of token (b, t), whose cache row is r (-1: bad position, outputs zero). With zero_row,
// the rows r of gk_out / gv_out are zeroed after being read by the same lanes (in-place variant).
template <typename T, int kHeadDim, int kVec>
__device__ __forceinline__ void process_token(const BackwardArgs<T>& a, const WarpLayout<kHeadDim, kVec>& w,
                                              int64_t b, int64_t t, int64_t r, bool zero_row, int lane) {
  using V = Vec<T, kVec>;
  const bool valid = r >= 0;
  const bool want_tables = a.grad_cos.data != nullptr || a.grad_sin.data != nullptr;
  const int slot = lane & (w.slots - 1);
  for (int step = 0; step < w.steps; ++step) {
    const int c = (w.slots > 1 ? lane / w.slots : lane) + step * 32;
    const bool active = c < w.pairs;
    const int64_t i0 = int64_t{c} * kVec;
    RopeChunk<kVec> gcos = RopeChunk<kVec>::zeros(), gsin = RopeChunk<kVec>::zeros();
    if (active) {
      // The tables stay in T across the head loop and widen at each use: half the registers.
      const RawChunk<T, kVec> cs = load_raw<cub::LOAD_DEFAULT, kVec>(a.cos.row(b, t), w.half, i0);
      const RawChunk<T, kVec> sn = load_raw<cub::LOAD_DEFAULT, kVec>(a.sin.row(b, t), w.half, i0);
#pragma unroll kTokenUnroll
      for (int64_t j = slot; j < a.heads; j += w.slots) {
        RawChunk<T, kVec> g{V::zeros(), V::zeros()}, v{V::zeros(), V::zeros()}, k{V::zeros(), V::zeros()};
        if (valid) {
          g = load_raw<cub::LOAD_CS, kVec>(a.gk.row(b, j, r), w.half, i0);
          v = load_raw<cub::LOAD_CS, kVec>(a.gv.row(b, j, r), w.half, i0);
          if (want_tables) k = load_raw<cub::LOAD_CS, kVec>(a.key.row(b, j, t), w.half, i0);
        }
        const RopeChunk<kVec> gf = g.widen();
        if (want_tables) accumulate_rope_table_grads(gf, k.widen(), gcos, gsin);
        store_raw<cub::STORE_CS>(a.grad_value.row(b, j, t), w.half, i0, v);
        store_chunk<cub::STORE_CS>(a.grad_key.row(b, j, t), w.half, i0, rope_backward(gf, cs.widen(), sn.widen()));
        if (zero_row && valid) {
          const RawChunk<T, kVec> zero{V::zeros(), V::zeros()};
          store_raw<cub::STORE_CS>(a.gk_out.row(b, j, r), w.half, i0, zero);
          store_raw<cub::STORE_CS>(a.gv_out.row(b, j, r), w.half, i0, zero);
        }
      }
    }
    if (want_tables) {
      sum_across_lanes(gcos, w.slots);
      sum_across_lanes(gsin, w.slots);
      if (active && slot == 0) {
        if (a.grad_cos.data) store_chunk<cub::STORE_CS>(a.grad_cos.row(b, t), w.half, i0, gcos);
        if (a.grad_sin.data) store_chunk<cub::STORE_CS>(a.grad_sin.row(b, t), w.half, i0, gsin);
      }
    }
  }
}

// In-place with repeated positions: the warp of the first token writing row r handles every token
// of that row in order and zeroes the row after the last, so no read can follow the zeroing.
template <typename T, int kHeadDim, int kVec>
__device__ void process_row_group(const BackwardArgs<T>& a, const WarpLayout<kHeadDim, kVec>& w, int64_t b,
                                  int64_t t, int64_t r, int lane) {
  for (int64_t base = 0; base < t; base += 32) {
    const int64_t i = base + lane;
    if (__any_sync(0xffffffffu, i < t && cache_row(a, i) == r)) return;  // not the first: skipped
  }
  for (int64_t cur = t; cur >= 0;) {
    int64_t next = -1;
    for (int64_t base = cur + 1; base < a.seq_len; base += 32) {
      const int64_t i = base + lane;
      const unsigned hits = __ballot_sync(0xffffffffu, i < a.seq_len && cache_row(a, i) == r);
      if (hits) {
        next = base + __ffs(hits) - 1;
        break;
      }
    }
    process_token(a, w, b, cur, r, next < 0, lane);
    cur = next;
  }
}

template <int kDivisor>
__device__ __forceinline__ uint64_t divmod_by(uint64_t n, uint64_t& rem, const FastDivmod& runtime) {
  if constexpr (kDivisor > 0) {
    const uint64_t q = n / kDivisor;
    rem = n - q * kDivisor;
    return q;
  } else {
    return runtime.divmod(n, rem);
  }
}

// Out-of-place copy work over the cache rows [w0, w0 + wlen) of every (b, head): rows marked in the
// bitmask are written as zeros without being read, all others are copied.
template <typename T, int kHeadDim, int kVec>
__device__ void copy_window(const BackwardArgs<T>& a, const uint32_t* mask, int64_t w0, int64_t wlen,
                            uint64_t thread, uint64_t threads) {
  using V = Vec<T, kVec>;
  constexpr int kRowVecs = kHeadDim > 0 ? kHeadDim / kVec : 0;
  const int64_t row_vecs = a.head_dim / kVec;
  const FastDivmod div_row_vecs(static_cast<uint32_t>(row_vecs));
  const FastDivmod div_wlen(static_cast<uint32_t>(wlen));
  const uint64_t per_tensor = static_cast<uint64_t>(a.batch * a.heads * wlen * row_vecs);
  const uint64_t total = 2 * per_tensor;
  const uint64_t stride = threads;
  for (uint64_t base = thread; base < total; base += stride * kCopyUnroll) {
    V value[kCopyUnroll];
    T* dst[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const uint64_t i = base + u * stride;
      dst[u] = nullptr;
      if (i < total) {
        const bool is_value = i >= per_tensor;
        uint64_t c, s_local, j;
        const uint64_t row = divmod_by<kRowVecs>(is_value ? i - per_tensor : i, c, div_row_vecs);
        const uint64_t outer = div_wlen.divmod(row, s_local);
        const uint64_t b = a.div_heads.divmod(outer, j);
        const int64_t s = w0 + static_cast<int64_t>(s_local);
        const int64_t col = static_cast<int64_t>(c) * kVec;
        const bool zero = (mask[s_local >> 5] >> (s_local & 31)) & 1u;
        const HeadRows<const T>& src = is_value ? a.gv : a.gk;
        dst[u] = (is_value ? a.gv_out : a.gk_out).row(b, j, s) + col;
        value[u] = zero ? V::zeros() : load_vec<cub::LOAD_CS, T, kVec>(src.row(b, j, s) + col);
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (dst[u]) store_vec<cub::STORE_CS>(dst[u], value[u]);
    }
  }
}

// Warp w of `warps` handles tokens w, w + warps, ...; with `zero_rows` (in-place) each zeroes its row
// after reading it, or, when rows repeat, the first token of a row handles all of them. The next
// token's position is loaded before the current token's rows, so its latency is hidden.
template <typename T, int kHeadDim, int kVec>
__device__ void token_work(const BackwardArgs<T>& a, const WarpLayout<kHeadDim, kVec>& layout, int64_t warp,
                           int64_t warps, bool zero_rows, bool repeats) {
  const int lane = threadIdx.x & 31;
  const int64_t tokens = a.batch * a.seq_len;
  uint64_t t = 0;
  int64_t b = warp < tokens ? static_cast<int64_t>(a.div_seq.divmod(warp, t)) : 0;
  int64_t r = warp < tokens ? cache_row(a, static_cast<int64_t>(t)) : -1;
  for (int64_t tok = warp; tok < tokens; tok += warps) {
    const int64_t cur_b = b, cur_t = static_cast<int64_t>(t), cur_r = r;
    if (tok + warps < tokens) {
      b = static_cast<int64_t>(a.div_seq.divmod(tok + warps, t));
      r = cache_row(a, static_cast<int64_t>(t));
    }
    if (cur_r < 0 && lane == 0 && a.error_flag) atomicOr(a.error_flag, kErrorPositionOutOfRange);
    if (zero_rows && repeats && cur_r >= 0) {
      process_row_group(a, layout, cur_b, cur_t, cur_r, lane);
    } else {
      process_token(a, layout, cur_b, cur_t, cur_r, zero_rows, lane);
    }
  }
}

// Marks the rows [w0, w0 + wlen) written by cache_position in `mask`; sets *repeats when a row is
// written twice. The caller synchronizes the threads that use the mask around it.
template <typename T>
__device__ void build_mask(const BackwardArgs<T>& a, uint32_t* mask, int64_t w0, int64_t wlen, int thread,
                           int threads, int* repeats) {
  for (int64_t t = thread; t < a.seq_len; t += threads) {
    const int64_t r = cache_row(a, t);
    if (r >= w0 && r < w0 + wlen) {
      const uint32_t bit = 1u << ((r - w0) & 31);
      if (atomicOr(&mask[(r - w0) >> 5], bit) & bit) atomicOr(repeats, 1);
    }
  }
}

// A barrier among the copy warps alone (the token warps of the block do not take part).
__device__ __forceinline__ void copy_warps_sync(int threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}

//! The fused backward. kHeadDim = 0 is the generic path (D read at run time); kVec is the elements
//! per access of the copy work (16 bytes, or 1 when pointers or strides are not 16-byte aligned).
//!
//! Out-of-place, every block splits its warps by role so that both run at once on every SM: warps
//! [0, token_warps) do the token work, the others copy every cache row not in cache_position and
//! write zeros to those that are (a bitmask in shared memory tells them apart), so each output row
//! is written exactly once. In-place, every block first learns whether a row repeats (the bitmask
//! again), then all its warps do token work.
template <typename T, int kHeadDim, int kVec>
__global__ void __launch_bounds__(kMaxBlockThreads) backward_kernel(const BackwardArgs<T> a) {
  extern __shared__ uint32_t mask[];
  __shared__ int repeats;
  const WarpLayout<kHeadDim, kTokenVec<T, kVec>> layout(a.head_dim);
  const int warps_per_block = blockDim.x / 32;
  const int warp_in_block = threadIdx.x / 32;
  const int64_t windows = a.cache_len == 0 ? 1 : (a.cache_len + a.window_rows - 1) / a.window_rows;
  const int64_t first_len = a.cache_len < a.window_rows ? a.cache_len : a.window_rows;

  // The first window's bitmask, built by the whole block.
  if (threadIdx.x == 0) repeats = 0;
  for (int64_t i = threadIdx.x; i < a.window_rows / 32; i += blockDim.x) mask[i] = 0;
  __syncthreads();
  build_mask(a, mask, 0, first_len, threadIdx.x, blockDim.x, &repeats);
  __syncthreads();

  if (a.in_place) {
    // Only whether a row repeats matters here; later windows are scanned until one does.
    for (int64_t win = 1; win < windows && !repeats; ++win) {
      const int64_t w0 = win * a.window_rows;
      const int64_t wlen = a.cache_len - w0 < a.window_rows ? a.cache_len - w0 : a.window_rows;
      for (int64_t i = threadIdx.x; i < a.window_rows / 32; i += blockDim.x) mask[i] = 0;
      __syncthreads();
      build_mask(a, mask, w0, wlen, threadIdx.x, blockDim.x, &repeats);
      __syncthreads();
    }
    token_work(a, layout, int64_t{blockIdx.x} * warps_per_block + warp_in_block, int64_t{gridDim.x} * warps_per_block,
               true, repeats != 0);
    return;
  }

  if constexpr (kSerialRoles) {
    token_work(a, layout, int64_t{blockIdx.x} * warps_per_block + warp_in_block, int64_t{gridDim.x} * warps_per_block,
               false, false);
  } else if (warp_in_block < a.token_warps) {
    token_work(a, layout, int64_t{blockIdx.x} * a.token_warps + warp_in_block, int64_t{gridDim.x} * a.token_warps,
               false, false);
    return;
  }
  const int copy_threads = blockDim.x - a.token_warps * 32;
  const int copy_thread = threadIdx.x - a.token_warps * 32;
  const uint64_t thread = uint64_t{blockIdx.x} * copy_threads + copy_thread;
  const uint64_t threads = uint64_t{gridDim.x} * copy_threads;
  copy_window<T, kHeadDim, kVec>(a, mask, 0, first_len, thread, threads);
  for (int64_t win = 1; win < windows; ++win) {  // caches longer than one bitmask window
    const int64_t w0 = win * a.window_rows;
    const int64_t wlen = a.cache_len - w0 < a.window_rows ? a.cache_len - w0 : a.window_rows;
    copy_warps_sync(copy_threads);
    for (int64_t i = copy_thread; i < a.window_rows / 32; i += copy_threads) mask[i] = 0;
    copy_warps_sync(copy_threads);
    build_mask(a, mask, w0, wlen, copy_thread, copy_threads, &repeats);
    copy_warps_sync(copy_threads);
    copy_window<T, kHeadDim, kVec>(a, mask, w0, wlen, thread, threads);
  }
}

}  // namespace kvrope::detail
