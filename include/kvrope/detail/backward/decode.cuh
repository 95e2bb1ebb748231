// The decode kernel: the backward with one new token a batch (S == 1), short from its entry to its loads
// (case 8 fused 4.3 -> 3.4 us). Every batch names the same row p, so no bitmask: a token's warps gather its rows at p;
// out of place every other thread copies the caches, writing zeros at row p (known once data is in).
#pragma once

#include <cstdint>

#include "args.cuh"
#include "policy.cuh"
#include "token_io.cuh"

namespace kvrope::detail {

//! Passes of a token warp whose loads the decode kernel issues together.
inline constexpr int kDecodeBatch = 2;

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

// The token role: token b by the first `warps` warps of a block. Warp w covers chunk pairs [w c, (w + 1) c)
// of every head, lane k x slots + slot heads slot, + slots, ...: the head sum stays in one warp.
template <typename T, int kHeadDim>
__device__ __forceinline__ void decode_token(const DecodeArgs<T>& a, int64_t b, PositionPrefetch& position, int lane,
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
  // Row addresses computed before the wait on the position and pinned there by an empty asm: after it,
  // only the range test and two products precede the row loads (position to loads 0.32 -> 0.22 us).
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
  __device__ __forceinline__ void load(const DecodeArgs<T>& a, uint32_t base, uint32_t threads, uint32_t total) {
    const int row_log2 = decode_log2<kHeadDim>(a.head_dim) - decode_log2<kVec>(kVec);  // log2(vectors a row)
#pragma unroll
    for (int u = 0; u < kDecodeCopyPairs; ++u) {
      const uint32_t i = base + u * threads;
      row[u] = -1;
      if (i < total) {
        const uint32_t slab = a.slab_vecs.div32(i);
        const uint32_t within = i - slab * a.slab_vecs.divisor;
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

// The copy role (out of place): the same 16-byte vector of gK and gV a step, zeros at row p (awaited only
// once the first round's data is in); a round's loads go before the last round's stores (case 12 6.69 -> 6.16 us).
// 32-bit indices: the planner takes this kernel only for caches of fewer than 2^31 vectors.
template <typename T, int kHeadDim>
__device__ __forceinline__ void decode_copy(const DecodeArgs<T>& a, PositionPrefetch& position, uint32_t thread,
                                            uint32_t threads) {
  const uint32_t total = static_cast<uint32_t>(a.batch * a.heads) * a.slab_vecs.divisor;
  const uint32_t step = threads * kDecodeCopyPairs;
  DecodeCopyRound<T> cur, next;
  cur.template load<kHeadDim>(a, thread, threads, total);
  const int64_t p = position_row(a, position.take());  // the first wait on the position
  for (uint32_t base = thread;; base += step) {        // (a round past `total` loads and stores nothing)
    const bool more = __any_sync(0xffffffffu, base + step < total);
    if (more) next.template load<kHeadDim>(a, base + step, threads, total);
    cur.store(p);
    if (!more) break;
    cur = next;
  }
}

// Blackwell: a register cap, so that a 5-warp block fits twice a SM (ptxas gave 202-222 registers under
// the 256-thread bounds; 200 and 160 do not spill). sm_90 keeps its measured bounds.
template <typename T>
inline constexpr int kDecodeMaxRegsSm100 = sizeof(T) == 4 ? 160 : 200;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define KVROPE_DECODE_BOUNDS __maxnreg__(kDecodeMaxRegsSm100<T>)
#else
#define KVROPE_DECODE_BOUNDS __launch_bounds__(kDecodeMaxBlockThreads)
#endif
//! The backward at S == 1: warps [0, token_warps) of blocks [0, token_blocks) do the tokens b = block,
//! block + token_blocks, ...; out of place every other thread copies. 16-byte accesses only.
template <typename T, int kHeadDim>
__global__ void KVROPE_DECODE_BOUNDS decode_kernel(const DecodeArgs<T> a) {
  const int lane = threadIdx.x & 31;
  // The one position, fetched first into the warp's shared-memory slot (a register load was awaited at
  // the entry, a round trip before any row load).
  __shared__ RawIndex slots[kDecodeMaxBlockThreads / 32];
  PositionPrefetch position{&slots[threadIdx.x / 32], {}};
  position.issue(a, 0, lane);
  const int64_t token_blocks = a.token_blocks;
  const int token_warps = a.token_warps;
  if (static_cast<int>(threadIdx.x) < 32 * token_warps && blockIdx.x < token_blocks) {
    for (int64_t b = blockIdx.x; b < a.batch; b += token_blocks) {
      decode_token<T, kHeadDim>(a, b, position, lane, threadIdx.x / 32, token_warps);
    }
    return;
  }
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
