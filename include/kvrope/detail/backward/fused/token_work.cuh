// The fused kernel's token work: for each token (or part of one), gather its gK / gV rows at its
// cache position, store its state gradients, sum its table gradients over the heads.
#pragma once

#include <cstdint>

#include "../../common/rotary_units.cuh"
#include "../policy.cuh"
#include "../token_io.cuh"

namespace kvrope::detail {

template <int kVec>
inline constexpr int kTokenVec = kVec > kTokenVecMax ? kTokenVecMax : kVec;

// How the lanes of a token's warps ("parts") cover its head rows: thread g = part x 32 + lane owns chunk
// pairs g / slots, + per_step, ... of heads g % slots, + slots, ...; a chunk pair's slots are adjacent
// lanes of one warp, so the head sum is a warp reduction and a token's warps never synchronize.
template <int kHeadDim, int kVec>
struct TokenLayout {
  int64_t half;    // h = D / 2
  int pairs;       // chunk pairs per row: h / kVec
  int slots;       // heads covered at once: a power of two, at most 32 and at most H rounded up
  int slots_log2;  // log2(slots): the item's lane arithmetic shifts, with no integer division on its path
  int per_step;    // chunk pairs the token's warps cover at once: 32 x parts / slots

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

// Head iterations whose loads issue together, before their stores (a load after a store that may alias
// it waits a round trip): 4 for 16-bit T (every head of H = 8, D = 128), 2 for fp32's wider chunks.
template <typename T>
inline constexpr int kTokenBatch = sizeof(T) == 4 ? 2 : 4;

// The general instance's chunk pair c of token (b, t): another rotary style or partial rotary (the unit's
// place and mode from unit_place), or table gradients summed over the batch (the warp takes every b).
template <typename T, int kHeadDim, int kVec>
__device__ __forceinline__ void process_unit_general(const FusedArgs<T>& a, const TokenLayout<kHeadDim, kVec>& w,
                                                     int64_t b, int64_t t, int64_t r, bool zero_row, int slot, int c,
                                                     bool active) {
  using V = Vec<T, kVec>;
  constexpr int kBatch = kTokenBatch<T>;
  const bool valid = r >= 0;
  const bool want_tables = a.wants_tables();
  const UnitPlace pl = unit_place<kVec>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, active ? c : 0);
  const int64_t span = pl.hi - pl.lo;
  RopeChunk<kVec> gcos = RopeChunk<kVec>::zeros(), gsin = RopeChunk<kVec>::zeros();
  const int64_t b_end = a.sum_batches ? a.batch : b + 1;
  for (int64_t bb = a.sum_batches ? 0 : b; active && bb < b_end; ++bb) {
#pragma unroll 1
    for (int j0 = slot; j0 < a.heads; j0 += kBatch * w.slots) {
      RawChunk<T, kVec> cs_raw{V::zeros(), V::zeros()}, sn_raw{V::zeros(), V::zeros()};
      if (valid && pl.rotated) {
        cs_raw = load_raw<cub::LOAD_DEFAULT, kVec>(a.cos.row(bb, t), span, pl.lo);
        sn_raw = load_raw<cub::LOAD_DEFAULT, kVec>(a.sin.row(bb, t), span, pl.lo);
      }
      RawChunk<T, kVec> gr[kBatch], vr[kBatch], kr[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int j = j0 + u * w.slots;
        gr[u] = vr[u] = kr[u] = RawChunk<T, kVec>{V::zeros(), V::zeros()};
        if (valid && j < a.heads) {
          gr[u] = load_raw<cub::LOAD_CS, kVec>(a.gk.row(bb, j, r), span, pl.lo);
          vr[u] = load_raw<cub::LOAD_CS, kVec>(a.gv.row(bb, j, r), span, pl.lo);
          if (want_tables && pl.rotated) kr[u] = load_raw<cub::LOAD_CS, kVec>(a.key.row(bb, j, t), span, pl.lo);
        }
      }
      const RopeChunk<kVec> cs = cs_raw.widen(), sn = sn_raw.widen();
      const bool tables = want_tables && pl.rotated, zero = zero_row && valid;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int j = j0 + u * w.slots;
        if (j >= a.heads) break;
        if (!pl.rotated) {
          store_head_outputs<RopeMode::kPass>(a, bb, j, t, r, span, pl.lo, gr[u], vr[u], kr[u], cs, sn, true, false,
                                              zero, gcos, gsin);
        } else if (pl.cross) {
          store_head_outputs<RopeMode::kCross>(a, bb, j, t, r, span, pl.lo, gr[u], vr[u], kr[u], cs, sn, true, tables,
                                               zero, gcos, gsin);
        } else {
          store_head_outputs<RopeMode::kWithin>(a, bb, j, t, r, span, pl.lo, gr[u], vr[u], kr[u], cs, sn, true, tables,
                                                zero, gcos, gsin);
        }
      }
    }
  }
  if (want_tables) {  // every lane: the head sum shuffles over the warp
    float x[4 * kVec];
    table_sums(gcos, gsin, x);
    const bool store = active && pl.rotated;
    T* gcos_row = store && a.grad_cos.data ? a.grad_cos.row(b, t) + pl.lo : nullptr;
    T* gsin_row = store && a.grad_sin.data ? a.grad_sin.row(b, t) + pl.lo : nullptr;
    head_sum_and_store<T, kVec, 4 * kVec>(gcos_row, gsin_row, span, x, 1, w.slots, slot, 0);
  }
}

// Part `part` of token (b, t), whose cache row is r (-1: bad position, outputs zero). With zero_row,
// the rows r of gk_out / gv_out are zeroed after being read by the same lanes (in-place, or
// out-of-place with a.token_zeros).
template <bool kGeneral, typename T, int kHeadDim, int kVec>
__device__ __forceinline__ void process_token(const FusedArgs<T>& a, const TokenLayout<kHeadDim, kVec>& w, int part,
                                              int64_t b, int64_t t, int64_t r, bool zero_row, int lane) {
  using V = Vec<T, kVec>;
  constexpr int kBatch = kTokenBatch<T>;
  const bool valid = r >= 0;
  const bool want_tables = a.wants_tables();
  const int g = part * 32 + lane;
  const int slot = g & (w.slots - 1);
  const int first_c0 = (part * 32) >> w.slots_log2;
#pragma unroll 1
  for (int c0 = first_c0; c0 < w.pairs; c0 += w.per_step) {
    const int c = c0 + (lane >> w.slots_log2);
    const bool active = c < w.pairs;
    if constexpr (kGeneral) {
      process_unit_general(a, w, b, t, r, zero_row, slot, c, active);
      continue;
    }
    const int64_t i0 = int64_t{c} * kVec;
    RopeChunk<kVec> gcos = RopeChunk<kVec>::zeros(), gsin = RopeChunk<kVec>::zeros();
    if (active) {
#pragma unroll 1
      for (int j0 = slot; j0 < a.heads; j0 += kBatch * w.slots) {
        // Tables loaded in the loop and widened after the row loads: hoisted, their widening made the
        // row loads wait for them (a round trip an item). A bad position leaves them zero (outputs zero).
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
template <bool kGeneral, typename T, int kHeadDim, int kVec>
__device__ void process_row_group(const FusedArgs<T>& a, const TokenLayout<kHeadDim, kVec>& w, int part, int64_t b,
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
    process_token<kGeneral>(a, w, part, b, cur, r, next < 0, lane);
    cur = next;
  }
}

// A token warp's work item: a part of a token (its index, (b, t)).
struct TokenCursor {
  int64_t item, b, t;
  int part;
};

// Tokens of the token work: (b, t) pairs, or with sum_batches (general instance) t alone (b = 0).
template <bool kGeneral, typename T>
__device__ __forceinline__ int64_t token_count(const FusedArgs<T>& a) {
  if constexpr (kGeneral) return a.sum_batches ? a.seq_len : a.batch * a.seq_len;
  return a.batch * a.seq_len;
}

// Item `item` of the token work: part item % parts of token item / parts.
template <bool kGeneral, typename T>
__device__ __forceinline__ TokenCursor token_item(const FusedArgs<T>& a, int64_t item) {
  TokenCursor c{item, 0, 0, static_cast<int>(item & ((int64_t{1} << a.token_parts_log2) - 1))};
  const int64_t tok = item >> a.token_parts_log2;
  if (tok < token_count<kGeneral>(a)) {
    uint64_t t = 0;
    c.b = static_cast<int64_t>(a.div_seq.divmod(static_cast<uint64_t>(tok), t));
    c.t = static_cast<int64_t>(t);
  }
  return c;
}

// Prefetches into L2 the lines of rows row_of(i), i = first, first + stride, ... < rows, a lane a row
// (cp.async.bulk.prefetch took uniform registers, so ptxas issued it lane by lane: 0.6 us on the bitmask).
template <typename T, typename RowOf>
__device__ __forceinline__ void prefetch_rows_l2(const FusedArgs<T>& a, int rows, int first, int stride,
                                                 RowOf&& row_of) {
  const uint32_t bytes = static_cast<uint32_t>(a.head_dim * int64_t{sizeof(T)});
  for (int i = first; i < rows; i += stride) {
    const uint64_t start = reinterpret_cast<uint64_t>(row_of(i));
    const uint64_t last = (start + bytes - 1) & ~uint64_t{127};
    for (uint64_t line = start & ~uint64_t{127}; line <= last; line += 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(line) : "memory");
  }
}

// Prefetches into L2 the rows of item c that do not depend on its position (cos, sin, key rows when the
// table gradients are asked for): after its position, only its gK and gV rows come from DRAM.
template <typename T>
__device__ __forceinline__ void prefetch_token_inputs(const FusedArgs<T>& a, const TokenCursor& c, int lane) {
  // (wants_tables() spelled out: the call moved this site's code.)
  const bool tables = a.grad_cos.data != nullptr || a.grad_sin.data != nullptr;
  const int rows = 2 + (tables ? static_cast<int>(a.heads) : 0);  // cos, sin, then a key row a head
  prefetch_rows_l2(a, rows, lane, 32, [&](int i) {
    return i == 0 ? a.cos.row(c.b, c.t) : i == 1 ? a.sin.row(c.b, c.t) : a.key.row(c.b, i - 2, c.t);
  });
}

// Prefetches into L2 the gK and gV rows r of every head of item c once its position is in (in place:
// the first item, while the block builds its bitmask). The warps of a token share the rows.
template <typename T>
__device__ __forceinline__ void prefetch_token_rows(const FusedArgs<T>& a, const TokenCursor& c, int64_t r, int lane) {
  const int heads = static_cast<int>(a.heads);
  prefetch_rows_l2(a, 2 * heads, c.part * 32 + lane, 32 << a.token_parts_log2,
                   [&](int i) { return i < heads ? a.gk.row(c.b, i, r) : a.gv.row(c.b, i - heads, r); });
}

// A token warp's items cur, cur + warps, ... (`position`: cur's, already loaded). With `zero_rows` each
// item zeroes its rows after reading them; when rows repeat, a row's first token handles all of them.
// The next item's position is fetched before the current item's rows, so no item waits a round trip for it.
template <bool kInPlace, bool kGeneral, typename T, int kHeadDim, int kVec>
__device__ void token_work(const FusedArgs<T>& a, const TokenLayout<kHeadDim, kVec>& layout, TokenCursor cur,
                           RawIndex position, PositionPrefetch prefetch, int64_t warps, bool zero_rows, bool repeats) {
  const int lane = threadIdx.x & 31;
  const int64_t items = token_count<kGeneral>(a) << a.token_parts_log2;
  while (cur.item < items) {
    const int64_t r = position_row(a, position);
    const TokenCursor next = token_item<kGeneral>(a, cur.item + warps);
    if (next.item < items) {
      prefetch.issue(a, next.t, lane);
      if (kInPlace && a.token_prefetch) prefetch_token_inputs(a, next, lane);
    }
    if (zero_rows && repeats && r >= 0) {
      process_row_group<kGeneral>(a, layout, cur.part, cur.b, cur.t, r, lane);
    } else {
      process_token<kGeneral>(a, layout, cur.part, cur.b, cur.t, r, zero_rows, lane);
    }
    if (r < 0 && cur.part == 0 && lane == 0 && a.error_flag) atomicOr(a.error_flag, kErrorPositionOutOfRange);
    cur = next;
    if (cur.item < items) position = prefetch.take();
  }
}

//! A token warp's first item (dealt to the blocks in turn, item w of block k is w x grid + k: in place 5 %
//! faster, out of place 0.6 %) and its position, loaded before the bitmask is built.
struct FirstItem {
  TokenCursor cursor;
  RawIndex position;
};
template <bool kInPlace, bool kGeneral, typename T>
__device__ __forceinline__ FirstItem first_item(const FusedArgs<T>& a, int warp, int lane) {
  FirstItem f{token_item<kGeneral>(a, int64_t{warp} * gridDim.x + blockIdx.x), {}};
  if (f.cursor.item < token_count<kGeneral>(a) << a.token_parts_log2) {
    f.position = load_position(a, f.cursor.t);
    // In place, hidden behind the bitmask's build (built only when S > 1).
    if (kInPlace && a.token_prefetch && a.seq_len > 1) prefetch_token_inputs(a, f.cursor, lane);
  }
  return f;
}

//! The token role: every warp in place; warps [0, token_warps) of each block out of place. Rows
//! cache_position are zeroed by the token warps in place, and out of place with a.token_zeros.
template <bool kInPlace, bool kGeneral, typename T, int kHeadDim, int kVec>
__device__ __forceinline__ void token_role(const FusedArgs<T>& a, const TokenLayout<kHeadDim, kVec>& layout,
                                           const FirstItem& first, RawIndex* position_slot, bool repeats) {
  const int64_t warps_per_block = kInPlace ? blockDim.x / 32 : a.token_warps;
  const int64_t token_warps = int64_t{gridDim.x} * warps_per_block;
  const PositionPrefetch prefetch{position_slot, {}};
  if (kInPlace || a.token_zeros) {
    token_work<kInPlace, kGeneral>(a, layout, first.cursor, first.position, prefetch, token_warps, true,
                                   kInPlace && repeats);
  } else {
    token_work<kInPlace, kGeneral>(a, layout, first.cursor, first.position, prefetch, token_warps, false, false);
  }
}

}  // namespace kvrope::detail
