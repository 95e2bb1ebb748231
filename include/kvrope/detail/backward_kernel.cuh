// The fused backward kernel: token work (gather, RoPE backward, head sums, in-place zeroing) and copy
// work (the cache rows not in cache_position) in one persistent launch.
#pragma once

#include <cstdint>

#include "../backward_params.cuh"
#include "../core/arch.cuh"
#include "../core/divmod.cuh"
#include "../rope.cuh"
#include "backward_args.cuh"
#include "bulk_copy.cuh"
#include "trace.cuh"

namespace kvrope::detail {

// Tuning knob for experiments (docs/perf-notes.md): 16-byte copies in flight per thread of the
// register copy path (the scalar path, and devices without the bulk-copy engine).
// Override with -DKVROPE_COPY_UNROLL=N.
#ifndef KVROPE_COPY_UNROLL
#define KVROPE_COPY_UNROLL 8
#endif
inline constexpr int kCopyUnroll = KVROPE_COPY_UNROLL;

// Elements per access of the token work: at most kTokenVecMax (4: 8 bytes of bf16/fp16, 16 of fp32),
// so that a lane's chunk pairs, its table values and its two head-sum accumulators fit in registers.
// Override with -DKVROPE_TOKEN_VEC_MAX=8 (experiments: 16-byte accesses of 16-bit types, with half
// the head iterations a batch, kTokenBatch).
#ifndef KVROPE_TOKEN_VEC_MAX
#define KVROPE_TOKEN_VEC_MAX 4
#endif
inline constexpr int kTokenVecMax = KVROPE_TOKEN_VEC_MAX;
static_assert(kTokenVecMax == 1 || kTokenVecMax == 2 || kTokenVecMax == 4 || kTokenVecMax == 8,
              "KVROPE_TOKEN_VEC_MAX must be 1, 2, 4 or 8");
template <typename T, int kVec>
inline constexpr int kTokenVec = kVec > kTokenVecMax ? kTokenVecMax : kVec;

//! Bytes of dynamic shared memory for a window of `window_rows` rows (one bit each).
__host__ __device__ inline constexpr int64_t mask_bytes(int64_t window_rows) { return window_rows / 32 * 4; }

inline constexpr int64_t kMaxWindowRows = 65536;  // 8 KiB of bitmask
//! The most dynamic shared memory a launch asks for: the largest bitmask and the bulk-copy ring.
inline constexpr int64_t kMaxSharedBytes = bulk_ring_offset(mask_bytes(kMaxWindowRows)) + bulk_ring_bytes(kMaxBulkStages);
//! Bulk copy: a window of at most this many chunks per block is a small cache: its blocks load their
//! first chunks before the bitmask (LaunchTuning::bulk_speculate_chunks; larger caches too with
//! bulk_speculate_large), and its token warps write the zero rows (token_zeros).
inline constexpr int64_t kSpeculateChunksPerBlock = 8;
//! Positions each thread building a bitmask loads at once, before their atomics (one round trip).
//! Override with -DKVROPE_MASK_LOADS=N (experiments).
#ifndef KVROPE_MASK_LOADS
#define KVROPE_MASK_LOADS 4
#endif
inline constexpr int kMaskLoads = KVROPE_MASK_LOADS;
static_assert(kMaskLoads >= 1, "KVROPE_MASK_LOADS must be at least 1");
//! Bulk copy of a small cache: chunks are halved down to this size at the least
//! (LaunchTuning::bulk_min_chunks_per_block).
inline constexpr int64_t kMinBulkChunkBytes = 4096;

// A position as loaded, its words not yet looked at (int32 positions: `lo`, and `hi` zero). A load
// issued ahead of its use stays in flight until position_row reads it: any arithmetic on the value
// (a sign extension, the range test) where it is loaded would wait for it there.
struct alignas(8) RawPosition {  // 8-byte aligned: the target of an 8-byte cp.async (PositionPrefetch)
  uint32_t lo = 0, hi = 0;
};

template <typename T>
__device__ __forceinline__ RawPosition load_position(const BackwardArgs<T>& a, int64_t t) {
  RawPosition p;
  if (a.positions_are_int64) {
    const uint2 v = static_cast<const uint2*>(a.positions)[t];
    p.lo = v.x;
    p.hi = v.y;
  } else {
    p.lo = static_cast<const uint32_t*>(a.positions)[t];
  }
  return p;
}

// The row of the cache a position names, or -1 when it is out of range.
template <typename T>
__device__ __forceinline__ int64_t position_row(const BackwardArgs<T>& a, const RawPosition& raw) {
  int64_t p = a.positions_are_int64 ? static_cast<int64_t>((uint64_t{raw.hi} << 32) | raw.lo)
                                    : int64_t{static_cast<int32_t>(raw.lo)};
  if (p < 0) p += a.cache_len;
  return (p >= 0 && p < a.cache_len) ? p : -1;
}

// The row of the cache token t was written to, or -1 when its position is out of range.
template <typename T>
__device__ __forceinline__ int64_t cache_row(const BackwardArgs<T>& a, int64_t t) {
  return position_row(a, load_position(a, t));
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
  const T* p = row + i0;  // then p + h: the pair's two accesses share one address register
  return RawChunk<T, N>{load_vec<M, T, N>(p), load_vec<M, T, N>(p + h)};
}

template <cub::CacheStoreModifier M, typename T, int N>
__device__ __forceinline__ void store_raw(T* row, int64_t h, int64_t i0, const RawChunk<T, N>& c) {
  T* p = row + i0;
  store_vec<M>(p, c.lo);
  store_vec<M>(p + h, c.hi);
}

// A lane's outputs for its chunk pair of head j of token t (batch b), from that head's gK and gV rows
// at the token's cache row r and its key row: grad_value_states (the gV row as read), grad_key_states
// (RoPE's backward of the gK row), the table-gradient terms (added to gcos / gsin when `tables`) and,
// with `zero_row`, zeros at row r of the cache-input gradients (after this lane's reads of that row).
// The token paths of the fused and the decode kernel both end a head with it. For a token whose
// position is out of range the caller passes zero gK and gV rows and no `zero_row`, and sees to it
// that its grad_key_states and table terms are zeros whatever its inputs hold (a zero gradient times
// an infinite table would be NaN): the fused kernel does not load its tables and keys then (zeros),
// the decode kernel, which loads them before it knows, passes `key_ok` and `tables` false.
template <typename T, int N>
__device__ __forceinline__ void store_head_outputs(const BackwardArgs<T>& a, int64_t b, int64_t j, int64_t t, int64_t r,
                                                   int64_t half, int64_t i0, const RawChunk<T, N>& gk_row,
                                                   const RawChunk<T, N>& gv_row, const RawChunk<T, N>& key_row,
                                                   const RopeChunk<N>& cs, const RopeChunk<N>& sn, bool key_ok,
                                                   bool tables, bool zero_row, RopeChunk<N>& gcos, RopeChunk<N>& gsin) {
  const RopeChunk<N> gf = gk_row.widen();
  if (tables) accumulate_rope_table_grads(gf, key_row.widen(), gcos, gsin);
  store_raw<cub::STORE_CS>(a.grad_value.row(b, j, t), half, i0, gv_row);
  store_chunk<cub::STORE_CS>(a.grad_key.row(b, j, t), half, i0,
                             key_ok ? rope_backward(gf, cs, sn) : RopeChunk<N>::zeros());
  if (zero_row) {
    const RawChunk<T, N> zero{Vec<T, N>::zeros(), Vec<T, N>::zeros()};
    store_raw<cub::STORE_CS>(a.gk_out.row(b, j, r), half, i0, zero);
    store_raw<cub::STORE_CS>(a.gv_out.row(b, j, r), half, i0, zero);
  }
}

// How the lanes of the warps that share a token ("parts", a power of two: the launch gives a token
// several warps when tokens are fewer than warps) cover its head rows. Thread g of the token
// (g = part x 32 + lane) owns chunk pairs c = g / slots, + per_step, ... (N elements of the first
// half of a row and the N they pair with in the second half) of the heads j = slot, slot + slots, ...
// with slot = g % slots. The slots of one chunk pair sit in consecutive lanes of one warp, so the
// head sum is a reduction over the low lane bits and the warps of a token never synchronize.
template <int kHeadDim, int kVec>
struct TokenLayout {
  int64_t half;  // h = D / 2
  int pairs;     // chunk pairs per row: h / kVec
  int slots;     // heads covered at once: a power of two, at most 32 and at most H rounded up
  int slots_log2;  // log2(slots): the item's lane arithmetic shifts, with no integer division on its path
  int per_step;  // chunk pairs the token's warps cover at once: 32 x parts / slots

  __host__ __device__ __forceinline__ TokenLayout(int64_t head_dim, int64_t heads, int parts) {
    const int64_t d = kHeadDim > 0 ? kHeadDim : head_dim;
    half = d / 2;
    pairs = static_cast<int>(half / kVec);
    slots = 1;
    slots_log2 = 0;
    while (slots < 32 && slots < heads && int64_t{pairs} * slots * 2 <= 32 * int64_t{parts}) {
      slots *= 2;
      ++slots_log2;
    }
    per_step = (32 * parts) >> slots_log2;
  }
};

// Head iterations of the token work whose loads are issued together, before any of their stores:
// the stores could alias the next loads as far as the compiler knows, so a load after a store waits
// for a whole memory round trip. 16-bit T: 4 iterations (for H = 8, D = 128 every head of the token
// at once); fp32, whose chunks take twice the registers: 2; half as many with twice the elements an
// access (kTokenVecMax = 8).
template <typename T, int kTV>
inline constexpr int kTokenBatch = (sizeof(T) == 4 ? 2 : 4) / (kTV > 4 ? 2 : 1);

// Stores elements [offset, offset + L) of a lane's table gradients laid out as
// [grad_cos lo | grad_cos hi | grad_sin lo | grad_sin hi] (N elements each) of its chunk pair, whose
// first elements are at gcos / gsin (null: that table's gradient is not asked for).
template <typename T, int N, int L>
__device__ __forceinline__ void store_table_segment(T* gcos, T* gsin, int64_t h, const float (&x)[L], int offset) {
  if constexpr (L >= N) {
#pragma unroll
    for (int q0 = 0; q0 < L; q0 += N) {
      const int q = (offset + q0) / N;  // which of the four
      T* row = q < 2 ? gcos : gsin;
      if (row == nullptr) continue;
      float part[N];
#pragma unroll
      for (int i = 0; i < N; ++i) part[i] = x[q0 + i];
      store_vec<cub::STORE_CS>(row + ((q & 1) ? h : 0), Vec<T, N>::from_float(part));
    }
  } else {
    const int q = offset / N;
    T* row = q < 2 ? gcos : gsin;
    if (row != nullptr) store_vec<cub::STORE_CS>(row + ((q & 1) ? h : 0) + offset % N, Vec<T, L>::from_float(x));
  }
}

// The head sum of the table gradients over the `slots` lanes of a chunk pair, as a reduce-scatter:
// at each step a lane keeps one half of its values, adds the other lane's copy of that half and
// hands on the other half, so log2(slots) steps of L / 2, L / 4, ... shuffles leave each of the
// slots lanes with a distinct 1 / slots of the sums, which it stores (`mask`: the slot bit of this
// step; the lanes' slot bits below it chose the segment `offset` of the values x they hold).
template <typename T, int N, int L>
__device__ __forceinline__ void head_sum_and_store(T* gcos, T* gsin, int64_t h, const float (&x)[L], int mask,
                                                   int slots, int slot, int offset) {
  if constexpr (L > 1) {
    if (mask < slots) {
      const bool upper = (slot & mask) != 0;
      float y[L / 2];
#pragma unroll
      for (int i = 0; i < L / 2; ++i) {
        const float give = upper ? x[i] : x[i + L / 2];
        const float keep = upper ? x[i + L / 2] : x[i];
        y[i] = keep + __shfl_xor_sync(0xffffffffu, give, mask);
      }
      head_sum_and_store<T, N, L / 2>(gcos, gsin, h, y, mask * 2, slots, slot, offset + (upper ? L / 2 : 0));
      return;
    }
  }
  // One value left but slots not yet all summed (more slots than values: the scalar path, or
  // D = 2): the remaining slot bits are a plain butterfly, and the lanes with those bits clear store.
  float z[L];
#pragma unroll
  for (int i = 0; i < L; ++i) z[i] = x[i];
  for (int m = mask; m < slots; m <<= 1) {
#pragma unroll
    for (int i = 0; i < L; ++i) z[i] += __shfl_xor_sync(0xffffffffu, z[i], m);
  }
  if (slot < mask) store_table_segment<T, N, L>(gcos, gsin, h, z, offset);
}

// A lane's table-gradient sums laid out as head_sum_and_store takes them:
// [grad_cos lo | grad_cos hi | grad_sin lo | grad_sin hi], N elements each.
template <int N>
__device__ __forceinline__ void table_sums(const RopeChunk<N>& gcos, const RopeChunk<N>& gsin, float (&x)[4 * N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    x[i] = gcos.lo[i];
    x[N + i] = gcos.hi[i];
    x[2 * N + i] = gsin.lo[i];
    x[3 * N + i] = gsin.hi[i];
  }
}

// Part `part` of token (b, t), whose cache row is r (-1: bad position, outputs zero). With zero_row,
// the rows r of gk_out / gv_out are zeroed after being read by the same lanes (in-place, or
// out-of-place with a.token_zeros).
template <typename T, int kHeadDim, int kVec>
__device__ __forceinline__ void process_token(const BackwardArgs<T>& a, const TokenLayout<kHeadDim, kVec>& w,
                                              int part, int64_t b, int64_t t, int64_t r, bool zero_row, int lane,
                                              [[maybe_unused]] bool traced = false) {
  using V = Vec<T, kVec>;
  constexpr int kBatch = kTokenBatch<T, kVec>;
  const bool valid = r >= 0;
  const bool want_tables = a.wants_tables();
  const int g = part * 32 + lane;
  const int slot = g & (w.slots - 1);
  const int first_c0 = (part * 32) >> w.slots_log2;
#pragma unroll 1
  for (int c0 = first_c0; c0 < w.pairs; c0 += w.per_step) {
    const int c = c0 + (lane >> w.slots_log2);
    const bool active = c < w.pairs;
    const int64_t i0 = int64_t{c} * kVec;
    RopeChunk<kVec> gcos = RopeChunk<kVec>::zeros(), gsin = RopeChunk<kVec>::zeros();
    if (active) {
#pragma unroll 1
      for (int j0 = slot; j0 < a.heads; j0 += kBatch * w.slots) {
        // The tables are loaded here, in the loop, and widened only after the row loads are issued:
        // loaded before the loop, their widening (loop-invariant arithmetic) was hoisted out of it,
        // above the row loads, whose issue then waited a memory round trip for the tables
        // (docs/perf-notes.md, v8). (For H <= kBatch x slots the loop runs once.) With a bad
        // position they stay zero, so that the token's grad_key_states are zeros whatever its
        // tables hold (a zero gradient times an infinite table would be NaN).
        RawChunk<T, kVec> cs_raw{V::zeros(), V::zeros()}, sn_raw{V::zeros(), V::zeros()};
        if (valid) {
          cs_raw = load_raw<cub::LOAD_DEFAULT, kVec>(a.cos.row(b, t), w.half, i0);
          sn_raw = load_raw<cub::LOAD_DEFAULT, kVec>(a.sin.row(b, t), w.half, i0);
        }
        RawChunk<T, kVec> gr[kBatch], vr[kBatch], kr[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int j = j0 + u * w.slots;
          gr[u] = vr[u] = kr[u] = RawChunk<T, kVec>{V::zeros(), V::zeros()};
          if (valid && j < a.heads) {
            gr[u] = load_raw<cub::LOAD_CS, kVec>(a.gk.row(b, j, r), w.half, i0);
            vr[u] = load_raw<cub::LOAD_CS, kVec>(a.gv.row(b, j, r), w.half, i0);
            if (want_tables) kr[u] = load_raw<cub::LOAD_CS, kVec>(a.key.row(b, j, t), w.half, i0);
          }
        }
        // (The trace's stamps before the widening below: the table loads share a scoreboard with the
        // row loads, so a stamp after it waited for the rows; the rows_issued stamps of v8-v12 did.)
        KVROPE_TRACE_DEP(traced && c0 == first_c0 && j0 == slot, kTraceRowsIssued, 0);
        KVROPE_TRACE_DEP(traced && c0 == first_c0 && j0 == slot, kTraceRows, gr[0].lo.raw);
        const RopeChunk<kVec> cs = cs_raw.widen(), sn = sn_raw.widen();
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int j = j0 + u * w.slots;
          if (j >= a.heads) break;
          store_head_outputs(a, b, j, t, r, w.half, i0, gr[u], vr[u], kr[u], cs, sn, /*key_ok=*/true,
                             /*tables=*/want_tables, /*zero_row=*/zero_row && valid, gcos, gsin);
        }
      }
    }
    if (want_tables) {
      float x[4 * kVec];
      table_sums(gcos, gsin, x);
      T* gcos_row = active && a.grad_cos.data ? a.grad_cos.row(b, t) + i0 : nullptr;
      T* gsin_row = active && a.grad_sin.data ? a.grad_sin.row(b, t) + i0 : nullptr;
      head_sum_and_store<T, kVec, 4 * kVec>(gcos_row, gsin_row, w.half, x, 1, w.slots, slot, 0);
    }
  }
}

// In-place with repeated positions: the warps of the first token writing row r handle every token
// of that row in order and zero the row after the last, so no read can follow the zeroing.
template <typename T, int kHeadDim, int kVec>
__device__ void process_row_group(const BackwardArgs<T>& a, const TokenLayout<kHeadDim, kVec>& w, int part,
                                  int64_t b, int64_t t, int64_t r, int lane) {
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
    process_token(a, w, part, b, cur, r, next < 0, lane);
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
        if (zero && a.token_zeros) continue;  // the token warps write this row's zeros
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

// A token warp's work item: a part of a token (its index, (b, t)).
struct TokenCursor {
  int64_t item, b, t;
  int part;
};

// Item `item` of the token work: part item % parts of token item / parts.
template <typename T>
__device__ __forceinline__ TokenCursor token_item(const BackwardArgs<T>& a, int64_t item) {
  TokenCursor c{item, 0, 0, static_cast<int>(item & ((int64_t{1} << a.token_parts_log2) - 1))};
  const int64_t tok = item >> a.token_parts_log2;
  if (tok < a.batch * a.seq_len) {
    uint64_t t = 0;
    c.b = static_cast<int64_t>(a.div_seq.divmod(static_cast<uint64_t>(tok), t));
    c.t = static_cast<int64_t>(t);
  }
  return c;
}

// The position of a token warp's next item, fetched while the current item runs. On sm_80 and
// later lane 0 copies it into the warp's shared-memory slot with cp.async, whose arrival only take()
// waits for. (A register load would do in principle, but ptxas tracks it on the scoreboard of the
// item's row and table loads, and the first wait on those waited for the next position too: v8.)
struct PositionPrefetch {
  RawPosition* slot;  // this warp's, in shared memory
  RawPosition held;   // without cp.async: the value as loaded

  template <typename T>
  __device__ __forceinline__ void issue(const BackwardArgs<T>& a, int64_t t, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __syncwarp();  // every lane has read the slot's previous position
    if (lane == 0) {
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(slot));
      if (a.positions_are_int64) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(static_cast<const int64_t*>(a.positions) + t)
                     : "memory");
      } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(static_cast<const int32_t*>(a.positions) + t)
                     : "memory");
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
#else
    (void)lane;
    held = load_position(a, t);
#endif
  }

  __device__ __forceinline__ RawPosition take() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncwarp();  // lane 0's copy is visible to the warp
    return *slot;
#else
    return held;
#endif
  }
};

// Prefetches into L2 the 128-byte lines of the head rows row_of(i) (D elements of T), i = first,
// first + stride, ... < rows: a lane a row, one prefetch.global.L2 a line, so that a warp issues a line
// of every row with one instruction. (cp.async.bulk.prefetch takes its address in uniform registers,
// so the compiler issued a warp's rows one lane at a time, in a loop over the lanes:
// docs/perf-notes.md, v16.)
template <typename T, typename RowOf>
__device__ __forceinline__ void prefetch_rows_l2(const BackwardArgs<T>& a, int rows, int first, int stride,
                                                 RowOf&& row_of) {
  const uint32_t bytes = static_cast<uint32_t>(a.head_dim * int64_t{sizeof(T)});
  for (int i = first; i < rows; i += stride) {
    const uint64_t start = reinterpret_cast<uint64_t>(row_of(i));
    const uint64_t last = (start + bytes - 1) & ~uint64_t{127};
    for (uint64_t line = start & ~uint64_t{127}; line <= last; line += 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(line) : "memory");
  }
}

// Prefetches into L2 the rows of item c that do not depend on its position: cos, sin and, when the
// table gradients are asked for, the key rows. The item's own loads of them then need no DRAM round
// trip after its position's (a.token_prefetch).
template <typename T>
__device__ __forceinline__ void prefetch_token_inputs(const BackwardArgs<T>& a, const TokenCursor& c, int lane) {
  // (The test of BackwardArgs::wants_tables spelled out: the call moved this site's code.)
  const bool tables = a.grad_cos.data != nullptr || a.grad_sin.data != nullptr;
  const int rows = 2 + (tables ? static_cast<int>(a.heads) : 0);  // cos, sin, then a key row a head
  prefetch_rows_l2(a, rows, lane, 32, [&](int i) {
    return i == 0 ? a.cos.row(c.b, c.t) : i == 1 ? a.sin.row(c.b, c.t) : a.key.row(c.b, i - 2, c.t);
  });
}

// Prefetches into L2 the gK and gV rows r of every head of item c, whose position is in (in place,
// a.token_prefetch > 2: the first item, while the block builds its bitmask), so that its loads after
// the bitmask find them in L2 or on their way. The warps of a token share the rows.
template <typename T>
__device__ __forceinline__ void prefetch_token_rows(const BackwardArgs<T>& a, const TokenCursor& c, int64_t r,
                                                    int lane) {
  const int heads = static_cast<int>(a.heads);
  prefetch_rows_l2(a, 2 * heads, c.part * 32 + lane, 32 << a.token_parts_log2,
                   [&](int i) { return i < heads ? a.gk.row(c.b, i, r) : a.gv.row(c.b, i - heads, r); });
}

// A warp whose first item is w (of `warps` token warps) handles items w, w + warps, ... (`cur` is
// item w, whose position was loaded into `position`); with `zero_rows` (in-place, or a.token_zeros) each zeroes its part of the row after
// reading it, or, in-place when rows repeat, the first token of a row handles all of them.
// The next item's position is fetched before the current item's rows and read only when that item
// starts (v8: before, the compiler's range test right after the load made every item wait for the
// next one's position first).
// `after_first` runs once: after the warp's first item, or at once when it has none.
template <bool kInPlace, typename T, int kHeadDim, int kVec, typename F>
__device__ void token_work(const BackwardArgs<T>& a, const TokenLayout<kHeadDim, kVec>& layout, TokenCursor cur,
                           RawPosition position, PositionPrefetch prefetch, int64_t warps, bool zero_rows,
                           bool repeats, F&& after_first) {
  const int lane = threadIdx.x & 31;
  const int64_t items = (a.batch * a.seq_len) << a.token_parts_log2;
  if (cur.item >= items) after_first();
  while (cur.item < items) {
    const int64_t r = position_row(a, position);
    const TokenCursor next = token_item(a, cur.item + warps);
    if (next.item < items) {
      prefetch.issue(a, next.t, lane);
      if (kInPlace && a.token_prefetch > 0) prefetch_token_inputs(a, next, lane);
    }
    KVROPE_TRACE_DEP(cur.item < warps, kTracePosition, r);
    if (zero_rows && repeats && r >= 0) {
      process_row_group(a, layout, cur.part, cur.b, cur.t, r, lane);
    } else {
      process_token(a, layout, cur.part, cur.b, cur.t, r, zero_rows, lane, cur.item < warps);
    }
    if (r < 0 && cur.part == 0 && lane == 0 && a.error_flag) atomicOr(a.error_flag, kErrorPositionOutOfRange);
    if (cur.item < warps) {
      KVROPE_TRACE_AT(kTraceStart, 0);
      after_first();
    }
    cur = next;
    if (cur.item < items) position = prefetch.take();
  }
}

// Marks the rows [w0, w0 + wlen) written by cache_position in `mask`; sets *repeats when a row is
// written twice. The caller synchronizes the threads that use the mask around it. `after_loads` runs
// once on every thread: when the first round's loads are issued, before anything waits for them.
struct NoHook {
  __device__ void operator()() const {}
};
template <typename T, typename F = NoHook>
__device__ void build_mask(const BackwardArgs<T>& a, uint32_t* mask, int64_t w0, int64_t wlen, int thread,
                           int threads, int* repeats, F&& after_loads = {}) {
  constexpr int kLoads = kMaskLoads;
  bool hooked = false;
  for (int64_t t0 = thread; t0 < a.seq_len; t0 += kLoads * int64_t{threads}) {
    // Every load is issued before any arithmetic on one: a range test right after each load waited
    // for it before the next was issued, kLoads round trips where one will do (docs/perf-notes.md,
    // v10). Slots past the last position load position t0 again (a line already asked for) and
    // are dropped, so that the loads need no branch between them.
    RawPosition raw[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t t = t0 + u * int64_t{threads};
      raw[u] = load_position(a, t < a.seq_len ? t : t0);
    }
    if (!hooked) {
      hooked = true;
      after_loads();
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t r = t0 + u * int64_t{threads} < a.seq_len ? position_row(a, raw[u]) : -1;
      if (r >= w0 && r < w0 + wlen) {
        const uint32_t bit = 1u << ((r - w0) & 31);
        if (atomicOr(&mask[(r - w0) >> 5], bit) & bit) atomicOr(repeats, 1);
      }
    }
  }
  if (!hooked) after_loads();
}

// A barrier among the copy warps alone (the token warps of the block do not take part).
__device__ __forceinline__ void copy_warps_sync(int threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}

// The copy warps' own bitmask of window w (the token warps of the block do not take part).
template <typename T>
__device__ __forceinline__ void copy_warps_mask(const BackwardArgs<T>& a, uint32_t* mask, const RowWindow& w,
                                                int copy_thread, int copy_threads, int* repeats) {
  copy_warps_sync(copy_threads);
  for (int64_t i = copy_thread; i < a.window_rows / 32; i += copy_threads) mask[i] = 0;
  copy_warps_sync(copy_threads);
  build_mask(a, mask, w.w0, w.wlen, copy_thread, copy_threads, repeats);
  copy_warps_sync(copy_threads);
}

//! The fused backward. kHeadDim = 0 is the generic path (D read at run time); kVec is the elements
//! per access of the copy work (16 bytes, or 1 when pointers or strides are not 16-byte aligned).
//!
//! Out-of-place, every block splits its warps by role so that both run at once on every SM: warps
//! [0, token_warps) do the token work, the others copy every cache row not in cache_position and
//! write zeros to those that are (a bitmask in shared memory tells them apart; with a.token_zeros
//! the token warps write those zeros instead). With `a.bulk` (16-byte aligned rows on sm_90 and
//! later) the copy is one warp driving the bulk-copy engine through a ring of shared-memory stages,
//! which starts its first loads at once and leaves the bitmask to the token warps; otherwise the
//! copy warps move the rows through registers. In-place, every block first learns whether a row
//! repeats (the bitmask again; not with one position a batch), then all its warps do token work.
//! kInPlace (a.in_place as a constant) gives each variant an instance of its own, holding only its
//! path: for bf16 D = 128 on sm_90, 79 KB in place (no copy) and 216 KB out of place, where one
//! instance of both took 254 KB; and a change to one variant's path no longer moves the other's code
//! (docs/perf-notes.md, v16).
template <typename T, int kHeadDim, int kVec, bool kInPlace>
__global__ void __launch_bounds__(kMaxBlockThreads) backward_kernel(const BackwardArgs<T> a) {
  extern __shared__ __align__(kBulkAlign) uint32_t mask[];
  __shared__ int repeats;
  KVROPE_TRACE_AT(kTraceEntry, 0);
  const int warp_in_block = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const bool token_warp = kInPlace || warp_in_block < a.token_warps;

  // Work that needs no bitmask starts first, on the shortest instruction path: the copy warp's first
  // chunks (a.bulk_speculate of them, one lane each), the first token's position.
#if KVROPE_HAS_BULK_COPY
  BulkRing ring{reinterpret_cast<unsigned char*>(mask) + bulk_ring_offset(mask_bytes(a.window_rows)), nullptr,
                nullptr, a.bulk_stages, a.bulk_slack, 0, 0u};
  ring.bars = reinterpret_cast<uint64_t*>(ring.stage(ring.count));
  ring.chunk_of = reinterpret_cast<int64_t*>(ring.bars + ring.count);
  const bool bulk_warp = a.bulk && !token_warp;
  const BulkRange first_range = bulk_warp ? bulk_block_range(a, blockIdx.x) : BulkRange{};
  int64_t prefetched = 0;
  ChunkSource first_chunks_src{};
  if (bulk_warp) {
    bulk_ring_init(ring, lane);
    prefetched = bulk_speculate(a, mask, ring, first_range, lane);
    first_chunks_src = first_chunks(a, first_range, lane);
    KVROPE_TRACE_AT(kTraceStart, 0);
  }
#else
  constexpr bool bulk_warp = false;
#endif
  const int warps_per_block = blockDim.x / 32;
  const int64_t token_warps_per_block = kInPlace ? warps_per_block : a.token_warps;
  const int64_t token_warps = int64_t{gridDim.x} * token_warps_per_block;  // every block's token warps
  __shared__ RawPosition prefetched_positions[kMaxBlockThreads / 32];
  TokenCursor cursor{};
  RawPosition first_position{};
  if (token_warp) {
    // Warp w of block k has item k x per_block + w first, or, with a.spread_items, w x grid + k
    // (either way the first round covers items [0, token_warps) once).
    cursor = token_item(a, a.spread_items ? int64_t{warp_in_block} * gridDim.x + blockIdx.x
                                          : int64_t{blockIdx.x} * token_warps_per_block + warp_in_block);
    if (cursor.item < (a.batch * a.seq_len) << a.token_parts_log2) {
      first_position = load_position(a, cursor.t);
      // Hidden behind the bitmask's build (token_prefetch is in-place only, where a bitmask is built
      // only when S > 1).
      if (kInPlace && a.token_prefetch > 1 && a.seq_len > 1) prefetch_token_inputs(a, cursor, lane);
    }
  }
  // While the first position is on its way (it is used only once the bitmask is built):
  const TokenLayout<kHeadDim, kTokenVec<T, kVec>> layout(a.head_dim, a.heads, 1 << a.token_parts_log2);

  // The first window's bitmask. With the bulk copy the token warps build it alone (named barrier 3
  // among them) while the copy warp's loads are under way, and with a.mask_late only after their
  // first item (whose loads then go before theirs); otherwise the whole block builds it first.
  // Out-of-place, only the copy warps use it: the token warps add their share and go on without
  // waiting for the others (barrier 2).
  // (Device code without the bulk copy — PTX for an older GPU — never has a copy warp of that kind:
  // its copy warps help build the bitmask and move the rows through registers.)
#if KVROPE_HAS_BULK_COPY
  const bool bulk_build = a.bulk;
#else
  constexpr bool bulk_build = false;
#endif
  const int builders = bulk_build ? a.token_warps * 32 : static_cast<int>(blockDim.x);
  const bool late = bulk_build && a.mask_late;
  // In-place, the bitmask only tells whether a row repeats, which one position a batch cannot.
  const bool masked = !(kInPlace && a.seq_len <= 1);
  if (!bulk_warp && masked) {
    if (threadIdx.x == 0) repeats = 0;
    for (int64_t i = threadIdx.x; i < a.window_rows / 32; i += builders) mask[i] = 0;
    if (bulk_build) {
      asm volatile("bar.sync 3, %0;" ::"r"(builders) : "memory");
    } else {
      __syncthreads();
    }
    if (kInPlace) {
      // With a.token_prefetch > 2, a token warp's first item's rows go to L2 once its position is in,
      // during the bitmask's build. (As compiled for sm_90, ptxas puts the position's arithmetic
      // before the bitmask's loads, which then wait for the position: docs/perf-notes.md, v16.) In
      // place a.bulk is false (plan_and_launch gives the bulk copy to out-of-place calls only), so
      // `late` is too. Out of place the bitmask is built without the hook.
      build_mask(a, mask, 0, row_window(a, 0).wlen, threadIdx.x, builders, &repeats, [&] {
        if (a.token_prefetch > 2 && cursor.item < (a.batch * a.seq_len) << a.token_parts_log2) {
          const int64_t r = position_row(a, first_position);
          if (r >= 0) prefetch_token_rows(a, cursor, r, lane);
        }
      });
    } else if (!late) {
      build_mask(a, mask, 0, row_window(a, 0).wlen, threadIdx.x, builders, &repeats);
    }
  }
  auto arrive_with_mask = [&] {
    if (late) build_mask(a, mask, 0, row_window(a, 0).wlen, threadIdx.x, builders, &repeats);
    asm volatile("bar.arrive 2, %0;" ::"r"(blockDim.x) : "memory");
  };
  if (kInPlace) {
    if (masked) __syncthreads();
  } else if (!token_warp) {
    asm volatile("bar.sync 2, %0;" ::"r"(blockDim.x) : "memory");
  } else if (!late) {
    arrive_with_mask();
  }
  KVROPE_TRACE_AT(kTraceMask, 0);
  KVROPE_TRACE_AT(kTraceRole, token_warp ? 1 : 2);
  const int64_t windows = a.windows;

  if (kInPlace && masked) {
    // Only whether a row repeats matters here; later windows are scanned until one does.
    for (int64_t win = 1; win < windows && !repeats; ++win) {
      const RowWindow rows = row_window(a, win);
      for (int64_t i = threadIdx.x; i < a.window_rows / 32; i += blockDim.x) mask[i] = 0;
      __syncthreads();
      build_mask(a, mask, rows.w0, rows.wlen, threadIdx.x, blockDim.x, &repeats);
      __syncthreads();
    }
  }
  if (token_warp) {
    // Rows p zeroed by the token warps: in-place, or out-of-place with a.token_zeros (where a row
    // written twice gets the same zeros twice: no reads of it follow).
    auto after_first = [&] {
      if (late) arrive_with_mask();
    };
    const PositionPrefetch prefetch{&prefetched_positions[warp_in_block], {}};
    if (kInPlace || a.token_zeros) {
      token_work<kInPlace>(a, layout, cursor, first_position, prefetch, token_warps, true, kInPlace && masked && repeats != 0,
                 after_first);
    } else {
      token_work<kInPlace>(a, layout, cursor, first_position, prefetch, token_warps, false, false, after_first);
    }
    KVROPE_TRACE_AT(kTraceDone, 0);
    return;
  }
  const int copy_threads = blockDim.x - a.token_warps * 32;
  const int copy_thread = threadIdx.x - a.token_warps * 32;
#if KVROPE_HAS_BULK_COPY
  if (bulk_warp) {  // the block's one copy warp (copy_threads == 32)
    if (windows == 1 && prefetched > 0 && prefetched == first_range.end - first_range.begin && a.token_zeros &&
        !a.share_chunks && a.gk_out.seq_stride == a.head_dim && a.gv_out.seq_stride == a.head_dim) {
      bulk_store_speculated(a, mask, ring, first_range, lane);  // a small cache: every chunk in a stage
    } else {
      bulk_copy_window(a, mask, a.bulk_first, ring, first_chunks_src, prefetched, lane);
      for (int64_t win = 1; win < windows; ++win) {  // (the host shares chunks only with one window)
        const RowWindow rows = row_window(a, win);
        copy_warps_mask(a, mask, rows, copy_thread, copy_threads, &repeats);
        const BulkWindow w = bulk_window(a, rows);
        ChunkSource src = ChunkSource::of(bulk_range(w, blockIdx.x, gridDim.x));
        bulk_copy_window(a, mask, w, ring, src, 0, lane);
      }
      release_tickets(a.workspace, lane);
    }
    KVROPE_TRACE_AT(kTraceLastStore, 0);
    bulk_drain();
    KVROPE_TRACE_AT(kTraceDone, 0);
    return;
  }
#endif
  const uint64_t thread = uint64_t{blockIdx.x} * copy_threads + copy_thread;
  const uint64_t threads = uint64_t{gridDim.x} * copy_threads;
  for (int64_t win = 0; win < windows; ++win) {  // caches longer than one bitmask window: several
    const RowWindow rows = row_window(a, win);
    if (win > 0) copy_warps_mask(a, mask, rows, copy_thread, copy_threads, &repeats);
    copy_window<T, kHeadDim, kVec>(a, mask, rows.w0, rows.wlen, thread, threads);
  }
  KVROPE_TRACE_AT(kTraceDone, 0);
}

}  // namespace kvrope::detail
