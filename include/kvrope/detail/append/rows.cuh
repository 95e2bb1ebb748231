// A head row as the kernels walk it: which row of which token it is, where it is read and written, and
// how a unit of it is finished (RMS-normed, rotated) and stored.
#pragma once

#include <cstdint>

#include "../../core/vec.cuh"
#include "../../rope.cuh"
#include "../common/rotary_units.cuh"
#include "args.cuh"
#include "formats.cuh"
#include "tile.cuh"

namespace kvrope::detail {

enum class RowKind : int { kQuery, kKey, kValue };

//! One head row of one token, as the kernels walk it.
struct AppendRow {
  int64_t token;
  int local;  // the token's index in its tile
  int head;
  RowKind kind;
};

//! Row j of a token (j in [0, Hq + 2 H): q heads, then k heads, then v heads).
template <typename T, typename C>
__device__ __forceinline__ AppendRow token_row(const AppendArgs<T, C>& a, int64_t token, int local, int j) {
  AppendRow row;
  row.token = token;
  row.local = local;
  const int q = static_cast<int>(a.q_heads), h = static_cast<int>(a.heads);
  row.kind = j < q ? RowKind::kQuery : j < q + h ? RowKind::kKey : RowKind::kValue;
  row.head = row.kind == RowKind::kQuery ? j : row.kind == RowKind::kKey ? j - q : j - q - h;
  return row;
}

//! Row r of tile `tl`: a token's rows are numbered j in [0, Hq + 2 H).
template <typename T, typename C>
__device__ __forceinline__ AppendRow tile_row(const AppendArgs<T, C>& a, const AppendGeometry& g, const AppendTile& tl,
                                              int r) {
  const int local = static_cast<int>(g.div_rows.div32(static_cast<uint32_t>(r)));
  return token_row(a, tl.first + local, local, r - local * static_cast<int>(g.div_rows.divisor));
}

template <typename T, typename C>
__device__ __forceinline__ const T* row_source(const AppendArgs<T, C>& a, const AppendRow& r) {
  return r.kind == RowKind::kQuery ? a.q.row(r.token, r.head)
         : r.kind == RowKind::kKey ? a.k.row(r.token, r.head)
                                   : a.v.row(r.token, r.head);
}

//! The sum of `v` over the `lanes` lanes of a row's group (lanes a power of two; the group aligned in its warp).
__device__ __forceinline__ float group_sum(float v, int lanes) {
  const int lane = threadIdx.x & 31;
  const unsigned mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1) << (lane & ~(lanes - 1));
  for (int offset = lanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset, lanes);
  return v;
}

template <typename T, int N>
__device__ __forceinline__ UnitChunks<T, N> load_chunks(const T* row, const UnitPlace& pl) {
  return {load_vec<cub::LOAD_CS, T, N>(row + pl.lo), load_vec<cub::LOAD_CS, T, N>(row + pl.hi)};
}

template <typename T, int N>
__device__ __forceinline__ float unit_square_sum(const UnitChunks<T, N>& x) {
  float lo[N], hi[N];
  x.lo.to_float(lo);
  x.hi.to_float(hi);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) s += lo[i] * lo[i] + hi[i] * hi[i];
  return s;
}

//! The per-tensor scales a row is stored with (q out in fp8, the fp8 and NVFP4 caches; 1 elsewhere), loaded
//! once a thread, off the rows' chains.
struct CallScales {
  StoreScale q, k, v;
};

template <bool kQ8, typename T, typename C>
__device__ __forceinline__ CallScales call_scales(const AppendArgs<T, C>& a) {
  CallScales s;
  if constexpr (kQ8) {
    if (a.q_out_fp8.data != nullptr && a.q_scale != nullptr) s.q = store_scale(*a.q_scale);
  }
  if constexpr (kIsNvfp4<C>) {
    if (!a.k_cache.per_head) s.k.scale = head_scale(a.k_cache, 0);
    if (!a.v_cache.per_head) s.v.scale = head_scale(a.v_cache, 0);
  }
  if constexpr (kIsFp8<C>) {
    if (!a.k_cache.per_head) s.k = store_scale(head_scale(a.k_cache, 0));
    if (!a.v_cache.per_head) s.v = store_scale(head_scale(a.v_cache, 0));
  }
  return s;
}

//! A row's context once its token's staged state is known.
template <typename T, typename C>
struct AppendRowContext {
  AppendRow r;
  const unsigned char* table;            // the token's table row (mRoPE: the unit's stream's, else the first's)
  const unsigned char* stream_table[2];  // mRoPE, a unit of several streams: the second and third streams' rows
  bool mixed_streams;                    // mRoPE on the few-token path: the unit's pairs take several streams
  C* cache_row;                          // the cache row to write, or null
  __nv_fp8_e4m3* block_scales;           // NVFP4: the cache row's block scales
  StoreScale scale;                      // the scale of what the row stores (fp8 q or cache rows; NVFP4's g)
  const T* norm;                         // the norm weights, or null
  float inv_rms;                         // the row's norm factor
};

//! The context of row `r` whose token's table row is at `table` and whose slot to write is `slot` (-1:
//! none, -2: its position is out of range): false when the token writes nothing.
template <typename T, typename C>
__device__ __forceinline__ bool row_context(const AppendArgs<T, C>& a, const AppendRow& r, const unsigned char* table,
                                            int64_t slot, const CallScales& scales, AppendRowContext<T, C>& ctx) {
  ctx.r = r;
  if (slot == -2) return false;
  ctx.table = table;
  ctx.cache_row = nullptr;
  ctx.scale = r.kind == RowKind::kQuery ? scales.q : r.kind == RowKind::kKey ? scales.k : scales.v;
  if (r.kind != RowKind::kQuery && slot >= 0) {
    uint64_t offset = 0;
    const uint64_t page = a.div_page.divmod(static_cast<uint64_t>(slot), offset);
    const CacheRows<C>& cache = r.kind == RowKind::kKey ? a.k_cache : a.v_cache;
    ctx.cache_row = cache.rows.row(static_cast<int64_t>(page), static_cast<int64_t>(offset), r.head);
    if constexpr (kIsFp8<C>) {
      if (cache.per_head) ctx.scale = store_scale(head_scale(cache, r.head));
    }
    if constexpr (kIsNvfp4<C>) {
      ctx.block_scales = cache.block_scales.row(static_cast<int64_t>(page), static_cast<int64_t>(offset), r.head);
      if (cache.per_head) ctx.scale.scale = head_scale(cache, r.head);
    }
  }
  ctx.norm = r.kind == RowKind::kQuery ? a.q_norm : r.kind == RowKind::kKey ? a.k_norm : nullptr;
  ctx.inv_rms = 1.0f;
  return true;
}

//! The same for row `r` of tile `tl`, from the tile's staged state.
template <typename T, typename C>
__device__ __forceinline__ bool row_context(const AppendArgs<T, C>& a, const AppendGeometry& g, const AppendTile& tl,
                                            const AppendRow& r, const CallScales& scales, AppendRowContext<T, C>& ctx) {
  return row_context(a, r, tl.table + int64_t{r.local} * g.table_row_bytes, tl.slot[r.local], scales, ctx);
}

template <typename T, typename C>
__device__ __forceinline__ float row_inv_rms(const AppendArgs<T, C>& a, float square_sum) {
  return rsqrtf(square_sum / static_cast<float>(a.head_dim) + a.norm_eps);
}

//! The stream all pairs of unit `pl` take under mRoPE rule `rule` (contiguous sections: most units), or -1
//! when they take several (each pair's angle then loads from its stream's row: load_mrope_angles).
template <int N>
__host__ __device__ __forceinline__ int mrope_unit_stream(const MropeRule& rule, const UnitPlace& pl) {
  const int last = pl.cross ? pl.pair_lo + N - 1 : pl.pair_hi + N / 2 - 1;  // (its streams rise with the pair)
  const int stream = rule.stream(pl.pair_lo);
  return rule.kind == MropeKind::kContiguous && stream == rule.stream(last) ? stream : -1;
}

//! With mRoPE, a unit whose pairs take several streams: its angles, each pair's from its stream's table row.
template <typename E, typename T, typename C, int N>
__device__ __forceinline__ void load_mrope_angles(const AppendArgs<T, C>& a, const AppendRowContext<T, C>& ctx,
                                                  const UnitPlace& pl, RopeChunk<N>& c, RopeChunk<N>& s) {
  // (the rows as values: a choice among the context's fields put the context in local memory)
  const unsigned char *const first = ctx.table, *const second = ctx.stream_table[0], *const third = ctx.stream_table[1];
  const MropeRule rule = a.mrope;
  const auto row = [=](int pair) {
    const int stream = rule.stream(pair);
    return reinterpret_cast<const E*>(stream == 0 ? first : stream == 1 ? second : third);
  };
  load_pair_angles<N, E>(row, a.rotary_dim / 2, pl, c, s);
}

//! A unit's angles from its row's table row (a q or k unit in the rotated part; else left unset). kMrope:
//! the few-token path's mRoPE instance, where a unit of one stream has that stream's row as its table row
//! and a unit of several loads pair by pair (the tile path stages each token's row composed from its streams').
template <typename T, typename C, int N, bool kMrope>
__device__ __forceinline__ void load_unit_angles(const AppendArgs<T, C>& a, const AppendRowContext<T, C>& ctx,
                                                 const UnitPlace& pl, RopeChunk<N>& c, RopeChunk<N>& s) {
  if (ctx.r.kind == RowKind::kValue || !pl.rotated) return;
  if constexpr (kMrope) {
    if (ctx.mixed_streams) {
      if (a.table_f32)
        load_mrope_angles<float>(a, ctx, pl, c, s);
      else
        load_mrope_angles<T>(a, ctx, pl, c, s);
      return;
    }
  }
  if (a.table_f32) {
    const float* cs = reinterpret_cast<const float*>(ctx.table);
    load_staged_angles<N>(cs, cs + a.rotary_dim / 2, pl, c, s);
  } else {
    const T* cs = reinterpret_cast<const T*>(ctx.table);
    load_staged_angles<N>(cs, cs + a.rotary_dim / 2, pl, c, s);
  }
}

//! Normalizes (when asked), rotates and rounds one unit of a q or k row; v rows come out as loaded. The
//! angles load after the norm's weights (loaded first, both would be live at once: more registers).
template <typename T, typename C, int N, bool kMrope = false>
__device__ __forceinline__ void finish_unit(const AppendArgs<T, C>& a, const AppendRowContext<T, C>& ctx,
                                            const UnitPlace& pl, UnitChunks<T, N>& x) {
  if (ctx.r.kind == RowKind::kValue || (ctx.norm == nullptr && !pl.rotated)) return;  // bit-exact copy
  RopeChunk<N> f;
  x.lo.to_float(f.lo);
  x.hi.to_float(f.hi);
  if (ctx.norm != nullptr) {
    float wl[N], wh[N];
    load_vec<cub::LOAD_DEFAULT, T, N>(ctx.norm + pl.lo).to_float(wl);
    load_vec<cub::LOAD_DEFAULT, T, N>(ctx.norm + pl.hi).to_float(wh);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      f.lo[i] = f.lo[i] * ctx.inv_rms * (wl[i] + a.norm_offset);
      f.hi[i] = f.hi[i] * ctx.inv_rms * (wh[i] + a.norm_offset);
    }
  }
  if (pl.rotated) {
    RopeChunk<N> c, s;
    load_unit_angles<T, C, N, kMrope>(a, ctx, pl, c, s);
    f = pl.cross ? rope_forward(f, c, s) : rope_forward_interleaved(f, c, s);
  }
  x.lo = Vec<T, N>::from_float(f.lo);
  x.hi = Vec<T, N>::from_float(f.hi);
}

//! Stores a finished unit wherever its row goes, each destination through its type's store path. kQ8:
//! q may go out in fp8 (else the instance has no fp8 q store: the calls without it pay nothing for it).
template <typename T, typename C, int N, bool kQ8 = true>
__device__ __forceinline__ void store_row_unit(const AppendArgs<T, C>& a, const AppendRowContext<T, C>& ctx,
                                               const UnitPlace& pl, const UnitChunks<T, N>& x) {
  const AppendRow& r = ctx.r;
  if (r.kind == RowKind::kQuery) {
    if (kQ8 && a.q_out_fp8.data != nullptr)
      store_unit(a.q_out_fp8.row(r.token, r.head), pl, x, ctx.scale);
    else
      store_unit(a.q_out.row(r.token, r.head), pl, x, StoreScale{});
    return;
  }
  if (r.kind == RowKind::kKey) {
    if (a.k_out.data != nullptr) store_unit(a.k_out.row(r.token, r.head), pl, x, StoreScale{});
    if (a.k_back.data != nullptr) store_unit(a.k_back.row(r.token, r.head), pl, x, StoreScale{});
  }
  if (ctx.cache_row != nullptr) {
    if constexpr (kIsNvfp4<C>)
      store_unit(Nvfp4Row{ctx.cache_row, ctx.block_scales}, pl, x, ctx.scale);
    else
      store_unit(ctx.cache_row, pl, x, ctx.scale);
  }
}

//! Finishes and stores a row from the unit `lane` holds (every lane of the row's group: the norm's sum
//! is a group shuffle). An NVFP4 store's shuffles run under `active`: a block's lanes share it (validate's
//! D and R multiples of 32 give a row whole blocks of units). kMrope: load_unit_angles.
template <typename T, typename C, int N, bool kQ8, bool kMrope = false>
__device__ __forceinline__ void finish_row(const AppendArgs<T, C>& a, int lanes, AppendRowContext<T, C>& ctx,
                                           const UnitPlace& pl, bool active, UnitChunks<T, N>& x) {
  if (ctx.norm != nullptr) ctx.inv_rms = row_inv_rms(a, group_sum(active ? unit_square_sum(x) : 0.0f, lanes));
  if (active) {
    finish_unit<T, C, N, kMrope>(a, ctx, pl, x);
    store_row_unit<T, C, N, kQ8>(a, ctx, pl, x);
  }
}

}  // namespace kvrope::detail
