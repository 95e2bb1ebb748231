// The backward with one new token a batch (S == 1, the shape of a decoding step): a kernel of its
// own, short from its entry to its loads (docs/perf-notes.md, v11).
//
// With S == 1 every batch writes the same cache row p = cache_position[0], so no row repeats and no
// bitmask is needed: a token's warp (or warps) loads p, its rows at p and writes its outputs; out of
// place, all other threads copy the caches 16 bytes at a time and write zeros where the row is p,
// deciding that only when the data is loaded (the copy never waits for p before its loads).
#pragma once

#include <cstdint>

#include "backward_kernel.cuh"

namespace kvrope::detail {

//! The decode kernel's block size bound (its __launch_bounds__ on sm_90; on sm_100 the launch's clamp).
inline constexpr int kDecodeMaxBlockThreads = 256;
//! Out of place: the (gK, gV) vector pairs of a round of a decode copy thread (two rounds in registers).
//! Override with -DKVROPE_DECODE_PAIRS=N (experiments).
#ifndef KVROPE_DECODE_PAIRS
#define KVROPE_DECODE_PAIRS 4
#endif
inline constexpr int kDecodeCopyPairs = KVROPE_DECODE_PAIRS;

// Whether a head dim suits the decode kernel: a power of two from two 16-byte vectors of T to 256,
// so that a row is whole 16-byte vectors and its half a power of two of them, at most 32 (a warp
// covers a row's chunk pairs, or a power of two of rows at once).
template <typename T>
__host__ __device__ inline constexpr bool decode_head_dim_ok(int64_t head_dim) {
  return head_dim >= 2 * int64_t{16 / sizeof(T)} && head_dim <= 256 && (head_dim & (head_dim - 1)) == 0;
}

//! The most warps a token of the decode kernel has (LaunchTuning::decode_token_warps).
inline constexpr int kDecodeMaxTokenWarps = 4;
//! Passes of a token warp whose loads the decode kernel issues together.
inline constexpr int kDecodeBatch = 2;
//! The 16-byte chunks of half a row (a power of two, at most 32: decode_head_dim_ok).
template <typename T>
inline constexpr int64_t decode_half_chunks(int64_t head_dim) {
  return head_dim / 2 / (16 / int64_t{sizeof(T)});
}
//! The warps a token of the decode kernel gets when `asked` for (0 or less: chosen, below): a power
//! of two, at most kDecodeMaxTokenWarps and at most the chunks of half a row (each warp covers a
//! share of the chunks of every head). Chosen: in place, doubled from one while the doubled count's
//! warps still cover no more heads in a pass than the token has (a warp with c chunks covers 32 / c
//! heads a pass); out of place, where the token warps share their SM with copy warps and issue more
//! slowly, twice that. Measured on the H200 with H = 8, D = 128 in bf16 (2 in place, 4 out of place):
//! in place 2 warps 5 % faster than 1 and 4; out of place 4 warps 7 % faster than 1 and 2
//! (leaderboard case 8; docs/perf-notes.md, v12).
template <typename T>
inline int decode_token_warps(int asked, int64_t heads, int64_t head_dim, bool in_place) {
  const int64_t chunks = decode_half_chunks<T>(head_dim);
  const int64_t most = chunks < kDecodeMaxTokenWarps ? chunks : kDecodeMaxTokenWarps;
  int warps = 1;
  if (asked > 0) {
    while (warps * 2 <= asked && warps * 2 <= most) warps *= 2;
  } else {
    while (warps * 2 <= most && 32 * warps * 2 / chunks <= heads) warps *= 2;
    if (!in_place && warps * 2 <= most) warps *= 2;
  }
  return warps;
}

// log2 of a power of two (kHeadDim = 0: the head dim read at run time).
template <int kHeadDim>
__device__ __forceinline__ int decode_log2(int64_t head_dim) {
  if constexpr (kHeadDim > 0) {
    int l = 0;
    while ((1 << l) < kHeadDim) ++l;
    return l;
  } else {
    return 63 - __clzll(head_dim);
  }
}

// Token b (its only token, t = 0) by the first `warps` warps of a block (a power of two, at most the
// chunks of half a row), 16-byte accesses. Warp w covers chunk pairs [w c, (w + 1) c) of every head
// (c = chunks / warps; a chunk pair is kVec elements of each half of a row): lane = k x slots + slot
// covers chunk pair w c + k of heads slot, slot + slots, ... (slots = 32 / c), so that the head sum of
// the table gradients is a reduction over the low lane bits of one warp (as in the fused kernel,
// head_sum_and_store) and the warps of a token never meet. The loads that do not depend on the
// position go first.
template <typename T, int kHeadDim>
__device__ __forceinline__ void decode_token(const BackwardArgs<T>& a, int64_t b, PositionPrefetch& position, int lane,
                                             int warp, int warps) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kBatch = kDecodeBatch;
  using V = Vec<T, kVec>;
  const int64_t half = (kHeadDim > 0 ? kHeadDim : a.head_dim) / 2;
  // Half a row is 2^(log2 D - 1 - log2 kVec) chunks; a warp has 1 / warps of them.
  const int warp_chunks_log2 = decode_log2<kHeadDim>(a.head_dim) - 1 - decode_log2<kVec>(kVec) - (31 - __clz(warps));
  const int slots_log2 = 5 - warp_chunks_log2;
  const int slots = 1 << slots_log2;
  const int slot = lane & (slots - 1);
  const int64_t i0 = int64_t{(warp << warp_chunks_log2) + (lane >> slots_log2)} * kVec;
  const int64_t pass = slots;  // heads a pass of the warp covers
  const int64_t j_first = slot;
  const bool want_tables = a.wants_tables();
  const RawChunk<T, kVec> cs_raw = load_raw<cub::LOAD_DEFAULT, kVec>(a.cos.row(b, 0), half, i0);
  const RawChunk<T, kVec> sn_raw = load_raw<cub::LOAD_DEFAULT, kVec>(a.sin.row(b, 0), half, i0);
  // The first batch's key rows are loaded before the first wait on the position; a later batch's
  // (more heads than the warps cover in kBatch passes) at the end of the one before.
  RawChunk<T, kVec> kr[kBatch];
  auto load_keys = [&](int64_t j0) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j = j0 + u * pass;
      kr[u] = RawChunk<T, kVec>{V::zeros(), V::zeros()};
      if (want_tables && j < a.heads) kr[u] = load_raw<cub::LOAD_CS, kVec>(a.key.row(b, j, 0), half, i0);
    }
  };
  load_keys(j_first);
  // The lane's chunk of row 0 of each head of the batch in gK and gV, and the tensors' row strides:
  // computed before the wait on the position and pinned there (an empty asm, which the wait cannot
  // pass), so that after the wait only the position's range test and two products stand before
  // the row loads, not the 64-bit address arithmetic of every head (docs/perf-notes.md, v12).
  const T* gk_at[kBatch];
  const T* gv_at[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    gk_at[u] = a.gk.row(b, j_first + u * pass, 0) + i0;
    gv_at[u] = a.gv.row(b, j_first + u * pass, 0) + i0;
    asm volatile("" : "+l"(gk_at[u]), "+l"(gv_at[u]));
  }
  int64_t gk_ss = a.gk.seq_stride, gv_ss = a.gv.seq_stride;
  asm volatile("" : "+l"(gk_ss), "+l"(gv_ss));
  const int64_t r = position_row(a, position.take());  // the first wait on the position
  KVROPE_TRACE_DEP(b == blockIdx.x, kTracePosition, r);
  const bool valid = r >= 0;
  const int64_t gk_row = r * gk_ss, gv_row = r * gv_ss;  // used only when valid
  RopeChunk<kVec> gcos = RopeChunk<kVec>::zeros(), gsin = RopeChunk<kVec>::zeros();
#pragma unroll 1
  for (int64_t j0 = j_first; j0 < a.heads; j0 += kBatch * pass) {
    RawChunk<T, kVec> gr[kBatch], vr[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j = j0 + u * pass;
      gr[u] = vr[u] = RawChunk<T, kVec>{V::zeros(), V::zeros()};
      if (valid && j < a.heads) {
        gr[u] = load_raw<cub::LOAD_CS, kVec>(gk_at[u] + gk_row, half, 0);
        vr[u] = load_raw<cub::LOAD_CS, kVec>(gv_at[u] + gv_row, half, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      gk_at[u] += kBatch * pass * a.gk.head_stride;
      gv_at[u] += kBatch * pass * a.gv.head_stride;
    }
    KVROPE_TRACE_DEP(b == blockIdx.x && j0 == j_first, kTraceRowsIssued, 0);
    KVROPE_TRACE_DEP(b == blockIdx.x && j0 == j_first, kTraceRows, gr[0].lo.raw.x);
    const RopeChunk<kVec> cs = cs_raw.widen(), sn = sn_raw.widen();
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j = j0 + u * pass;
      if (j >= a.heads) break;
      store_head_outputs(a, b, j, 0, r, half, i0, gr[u], vr[u], kr[u], cs, sn, /*key_ok=*/valid,
                         /*tables=*/want_tables && valid, /*zero_row=*/a.in_place && valid, gcos, gsin);
    }
    if (j0 + kBatch * pass < a.heads) load_keys(j0 + kBatch * pass);  // the next batch's
  }
  if (want_tables) {
    float x[4 * kVec];
    table_sums(gcos, gsin, x);
    T* gcos_row = a.grad_cos.data ? a.grad_cos.row(b, 0) + i0 : nullptr;
    T* gsin_row = a.grad_sin.data ? a.grad_sin.row(b, 0) + i0 : nullptr;
    head_sum_and_store<T, kVec, 4 * kVec>(gcos_row, gsin_row, half, x, 1, slots, slot, 0);
  }
  if (!valid && warp == 0 && lane == 0 && a.error_flag) atomicOr(a.error_flag, kErrorPositionOutOfRange);
}

// A round of a decode copy thread: kDecodeCopyPairs pairs of 16-byte vectors (the same vector of gK
// and of gV), loaded, with where they go.
template <typename T>
struct DecodeCopyRound {
  static constexpr int kVec = 16 / sizeof(T);
  Vec<T, kVec> kv[kDecodeCopyPairs], vv[kDecodeCopyPairs];
  T* kdst[kDecodeCopyPairs];
  T* vdst[kDecodeCopyPairs];
  int32_t row[kDecodeCopyPairs];  // the vector's cache row, -1: none

  // Loads vectors base, base + threads, ... (those below total).
  template <int kHeadDim>
  __device__ __forceinline__ void load(const BackwardArgs<T>& a, uint32_t base, uint32_t threads, uint32_t total) {
    const int row_log2 = decode_log2<kHeadDim>(a.head_dim) - decode_log2<kVec>(kVec);  // log2(vectors a row)
#pragma unroll
    for (int u = 0; u < kDecodeCopyPairs; ++u) {
      const uint32_t i = base + u * threads;
      row[u] = -1;
      if (i < total) {
        const uint32_t slab = a.decode_slab_vecs.div32(i);
        const uint32_t within = i - slab * a.decode_slab_vecs.divisor;
        const uint32_t b = a.div_heads.div32(slab);
        const uint32_t j = slab - b * a.div_heads.divisor;
        const int32_t s = static_cast<int32_t>(within >> row_log2);
        const int64_t col = int64_t{within & ((1u << row_log2) - 1)} * kVec;
        row[u] = s;
        kv[u] = load_vec<cub::LOAD_CS, T, kVec>(a.gk.row(b, j, s) + col);
        vv[u] = load_vec<cub::LOAD_CS, T, kVec>(a.gv.row(b, j, s) + col);
        kdst[u] = a.gk_out.row(b, j, s) + col;
        vdst[u] = a.gv_out.row(b, j, s) + col;
      }
    }
  }

  // Stores what load() read, zeros at cache row p.
  __device__ __forceinline__ void store(int64_t p) const {
#pragma unroll
    for (int u = 0; u < kDecodeCopyPairs; ++u) {
      if (row[u] >= 0) {
        const bool zero = row[u] == p;
        store_vec<cub::STORE_CS>(kdst[u], zero ? Vec<T, kVec>::zeros() : kv[u]);
        store_vec<cub::STORE_CS>(vdst[u], zero ? Vec<T, kVec>::zeros() : vv[u]);
      }
    }
  }
};

// Out of place: copy thread `thread` of `threads` copies the caches to the cache-input gradients
// 16 bytes at a time, the same vector of gK and of gV together (one index computation for both),
// writing zeros instead at row p (`position`, read only once the first round's data is in). Each
// round's loads are issued before the stores of the round before (two rounds in registers). ptxas
// tracks both rounds' loads on one scoreboard, so a round's stores wait for the next round's loads
// too: one round of loads is in flight at a time, but the first two rounds' loads share one round
// trip (for leaderboard case 12's 3.2 rounds, 3 round trips instead of 4; docs/perf-notes.md, v12). The warp runs its rounds together (PositionPrefetch::take is a
// warp-wide step). 32-bit indices: the host takes this kernel only for caches of fewer than 2^31
// 16-byte vectors.
template <typename T, int kHeadDim>
__device__ __forceinline__ void decode_copy(const BackwardArgs<T>& a, PositionPrefetch& position, uint32_t thread,
                                            uint32_t threads) {
  const uint32_t total = static_cast<uint32_t>(a.batch * a.heads) * a.decode_slab_vecs.divisor;
  const uint32_t step = threads * kDecodeCopyPairs;
  DecodeCopyRound<T> cur, next;
  cur.template load<kHeadDim>(a, thread, threads, total);
  const int64_t p = position_row(a, position.take());  // the first wait on the position
  KVROPE_TRACE_DEP(true, kTracePosition, p);
  KVROPE_TRACE_DEP(cur.row[0] >= 0, kTraceFirstData, cur.kv[0].raw.x);
  for (uint32_t base = thread;; base += step) {  // (a round past `total` loads and stores nothing)
    const bool more = __any_sync(0xffffffffu, base + step < total);
    if (more) next.template load<kHeadDim>(a, base + step, threads, total);
    cur.store(p);
    if (!more) break;
    cur = next;
  }
  KVROPE_TRACE_AT(kTraceLastStore, 0);
}

//! The backward at S == 1 (BackwardPlan::decode). Warps [0, a.decode_token_warps) of blocks
//! [0, a.decode_token_blocks) do the tokens b = block, block + decode_token_blocks, ...; out of place
//! every other thread copies. 16-byte accesses only (decode_head_dim_ok, every row 16-byte aligned).
// Blackwell (sm_100 and later): a register cap of its own. Left to the 255 that 256-thread bounds
// allow, ptxas gives the 16-bit instances 202-222 registers on sm_100a (162-210 on sm_90), so that a
// block of 5 warps (4 token warps and a copy warp: the out-of-place default for H = 8, D = 128) no
// longer fits twice in a SM's 64 K registers. 200 fits it twice (5 x 32 x 200 = 32 000); 160 is what
// fp32 took anyway. Neither spills (docs/perf-notes.md, Blackwell). sm_90 keeps the bounds its
// measured code was built under. Either way a block has at most kDecodeMaxBlockThreads threads: the
// launch clamps it (launch_decode), and the kernel's per-warp slots are sized by it.
template <typename T>
inline constexpr int kDecodeMaxRegsSm100 = sizeof(T) == 4 ? 160 : 200;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define KVROPE_DECODE_BOUNDS __maxnreg__(kDecodeMaxRegsSm100<T>)
#else
#define KVROPE_DECODE_BOUNDS __launch_bounds__(kDecodeMaxBlockThreads)
#endif
template <typename T, int kHeadDim>
__global__ void KVROPE_DECODE_BOUNDS decode_kernel(const BackwardArgs<T> a) {
  const int lane = threadIdx.x & 31;
  // Every batch's one position, fetched first: each warp copies it into its shared-memory slot
  // (PositionPrefetch), whose arrival only take() waits for. (Loaded into a register, its value was
  // waited for at the entry: ptxas tracks such a load on the scoreboard of the loads after it, as v8
  // found for the fused kernel's next positions.)
  __shared__ RawPosition slots[kDecodeMaxBlockThreads / 32];
  PositionPrefetch position{&slots[threadIdx.x / 32], {}};
  position.issue(a, 0, lane);
  const int64_t token_blocks = a.decode_token_blocks;
  const int token_warps = a.decode_token_warps;
  KVROPE_TRACE_AT(kTraceEntry, 0);
  if (static_cast<int>(threadIdx.x) < 32 * token_warps && blockIdx.x < token_blocks) {
    KVROPE_TRACE_AT(kTraceRole, 1);
    for (int64_t b = blockIdx.x; b < a.batch; b += token_blocks) {
      decode_token<T, kHeadDim>(a, b, position, lane, threadIdx.x / 32, token_warps);
      if (b == blockIdx.x) KVROPE_TRACE_AT(kTraceStart, 0);
    }
    return;
  }
  KVROPE_TRACE_AT(kTraceRole, 2);
  if (a.in_place) return;  // (none: in place, a block is its token's warps and every block has a token)
  // Copy threads numbered past the token warps: block k's start at k x blockDim - (token threads a
  // block) x min(k + 1, token_blocks).
  const uint32_t per_block = 32 * static_cast<uint32_t>(token_warps);
  const uint32_t taken = per_block * static_cast<uint32_t>(blockIdx.x < token_blocks ? blockIdx.x + 1 : token_blocks);
  const uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x - taken;
  const uint32_t threads = gridDim.x * blockDim.x - per_block * static_cast<uint32_t>(token_blocks);
  decode_copy<T, kHeadDim>(a, position, thread, threads);
}
#undef KVROPE_DECODE_BOUNDS

}  // namespace kvrope::detail
