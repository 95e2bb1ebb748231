// A token's rows as a group of lanes walks them: which row j is, where it is read and written, and how
// a unit of it is finished (RMS-normed, rotated) and stored. Both paths' kernels run a TokenWalk.
#pragma once

#include <cstdint>

#include "../../core/vec.cuh"
#include "../../rope.cuh"
#include "../common/rotary_units.cuh"
#include "args.cuh"
#include "formats.cuh"
#include "policy.cuh"

namespace kvrope::detail {

enum class RowKind : int { kQuery, kKey, kValue };

//! Row j of a token: q heads, then k heads, then v heads.
struct RowOf {
  RowKind kind;
  int head;
};

__device__ __forceinline__ RowOf row_of(int j, int q_heads, int heads) {
  if (j < q_heads) return {RowKind::kQuery, j};
  if (j < q_heads + heads) return {RowKind::kKey, j - q_heads};
  return {RowKind::kValue, j - q_heads - heads};
}

//! The sum of `v` over the `lanes` lanes of a row's group (lanes a power of two; the group aligned in its warp).
__device__ __forceinline__ float group_sum(float v, int lanes) {
  const int lane = threadIdx.x & 31;
  const unsigned mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1) << (lane & ~(lanes - 1));
  for (int offset = lanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset, lanes);
  return v;
}

template <typename T, int N>
__device__ __forceinline__ UnitChunks<T, N> load_unit(const T* row, const UnitPlace& pl) {
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

//! K consecutive elements of E at p (aligned to their size, a power of two of bytes), in fp32: one access
//! of up to 16 bytes, or two.
template <int K, typename E>
__device__ __forceinline__ void load_run(const E* p, float (&out)[K]) {
  constexpr int kBytes = K * static_cast<int>(sizeof(E));
  constexpr int kWord = kBytes >= 16 ? 16 : kBytes;
  using Word = typename RawWord<kWord>::type;
  E e[K];
#pragma unroll
  for (int w = 0; w < kBytes / kWord; ++w) {
    const Word v = reinterpret_cast<const Word*>(p)[w];
    memcpy(reinterpret_cast<unsigned char*>(e) + w * kWord, &v, kWord);
  }
#pragma unroll
  for (int i = 0; i < K; ++i) out[i] = to_float(e[i]);
}

//! A unit's angles from a table row (cos at `cs`, sin at `sn`) in whole aligned runs, as
//! load_cached_angles gives them: the pairs span the chunks (N angles from pair_lo), or each chunk holds
//! N / 2 pairs (N / 2 angles from pair_lo and from pair_hi).
template <int N, typename E>
__device__ __forceinline__ void load_angle_runs(const E* cs, const E* sn, const UnitPlace& pl, RopeChunk<N>& c,
                                                RopeChunk<N>& s) {
  if constexpr (N >= 2) {
    if (!pl.cross) {
      float c0[N / 2], c1[N / 2], s0[N / 2], s1[N / 2];
      load_run<N / 2>(cs + pl.pair_lo, c0);
      load_run<N / 2>(cs + pl.pair_hi, c1);
      load_run<N / 2>(sn + pl.pair_lo, s0);
      load_run<N / 2>(sn + pl.pair_hi, s1);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        c.lo[i] = c0[i / 2];
        c.hi[i] = c1[i / 2];
        s.lo[i] = s0[i / 2];
        s.hi[i] = s1[i / 2];
      }
      return;
    }
  }
  float ac[N], as[N];
  load_run<N>(cs + pl.pair_lo, ac);
  load_run<N>(sn + pl.pair_lo, as);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    c.lo[i] = c.hi[i] = ac[i];
    s.lo[i] = s.hi[i] = as[i];
  }
}

//! A unit's angles from the table row at `row` (R elements of fp32 or T).
template <typename T, typename C, int N>
__device__ __forceinline__ void load_unit_angles(const AppendArgs<T, C>& a, const AppendGeometry& g,
                                                 const unsigned char* row, const UnitPlace& pl, RopeChunk<N>& c,
                                                 RopeChunk<N>& s) {
  const int64_t half = a.rotary_dim / 2;
  if (a.table_f32) {
    const float* cs = reinterpret_cast<const float*>(row);
    if (g.table_runs)
      load_angle_runs<N>(cs, cs + half, pl, c, s);
    else
      load_cached_angles<N>(cs, cs + half, pl, c, s);
  } else {
    const T* cs = reinterpret_cast<const T*>(row);
    if (g.table_runs)
      load_angle_runs<N>(cs, cs + half, pl, c, s);
    else
      load_cached_angles<N>(cs, cs + half, pl, c, s);
  }
}

//! What a token's rows share once its position and slot are known: its table row, its cache rows at
//! head 0 (null: the token writes no cache row) and the per-tensor scales.
template <typename C>
struct TokenTargets {
  int64_t token;
  const unsigned char* table;
  C* k_cache;
  C* v_cache;
  double q_inv, k_inv, v_inv;  // reciprocals of the per-tensor scales (scale_reciprocal)
};

//! The per-tensor scales a token's rows are stored with (q out in fp8, the fp8 caches; 1 elsewhere),
//! loaded with the first rows, before the position is known.
struct CallScales {
  float q, k, v;
};

template <typename T, typename C>
__device__ __forceinline__ CallScales call_scales(const AppendArgs<T, C>& a) {
  return {a.q_scale != nullptr ? *a.q_scale : 1.0f, head_scale(a.k_cache, 0), head_scale(a.v_cache, 0)};
}

template <typename T, typename C>
__device__ __forceinline__ TokenTargets<C> token_targets(const AppendArgs<T, C>& a, const AppendGeometry& g,
                                                         int64_t token, int64_t position, int64_t slot,
                                                         const CallScales& scales) {
  TokenTargets<C> tt;
  tt.token = token;
  tt.table = static_cast<const unsigned char*>(a.table) + position * g.table_row_bytes;
  tt.k_cache = tt.v_cache = nullptr;
  if (slot >= 0) {
    uint64_t offset = 0;
    const int64_t page = static_cast<int64_t>(a.div_page.divmod(static_cast<uint64_t>(slot), offset));
    tt.k_cache = a.k_cache.rows.row(page, static_cast<int64_t>(offset), 0);
    tt.v_cache = a.v_cache.rows.row(page, static_cast<int64_t>(offset), 0);
  }
  tt.q_inv = a.q_out_fp8.data != nullptr ? scale_reciprocal(scales.q) : 1.0;
  tt.k_inv = kIsFp8<C> ? scale_reciprocal(scales.k) : 1.0;
  tt.v_inv = kIsFp8<C> ? scale_reciprocal(scales.v) : 1.0;
  return tt;
}

template <typename T, typename C>
__device__ __forceinline__ const T* row_source(const AppendArgs<T, C>& a, int64_t token, const RowOf& r) {
  return r.kind == RowKind::kQuery ? a.q.row(token, r.head)
         : r.kind == RowKind::kKey ? a.k.row(token, r.head)
                                   : a.v.row(token, r.head);
}

//! Normalizes (with inv_rms, when `norm` is given) and rotates (with the unit's angles) a unit of a q or k row.
template <typename T, typename C, int N>
__device__ __forceinline__ void finish_unit(const AppendArgs<T, C>& a, const T* norm, float inv_rms,
                                            const UnitPlace& pl, const RopeChunk<N>& c, const RopeChunk<N>& s,
                                            UnitChunks<T, N>& x) {
  if (norm == nullptr && !pl.rotated) return;  // a bit-exact copy
  RopeChunk<N> f;
  x.lo.to_float(f.lo);
  x.hi.to_float(f.hi);
  if (norm != nullptr) {
    float wl[N], wh[N];
    load_vec<cub::LOAD_DEFAULT, T, N>(norm + pl.lo).to_float(wl);
    load_vec<cub::LOAD_DEFAULT, T, N>(norm + pl.hi).to_float(wh);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      f.lo[i] = f.lo[i] * inv_rms * (wl[i] + a.norm_offset);
      f.hi[i] = f.hi[i] * inv_rms * (wh[i] + a.norm_offset);
    }
  }
  if (pl.rotated) f = pl.cross ? rope_forward(f, c, s) : rope_forward_interleaved(f, c, s);
  x.lo = Vec<T, N>::from_float(f.lo);
  x.hi = Vec<T, N>::from_float(f.hi);
}

//! Stores a finished unit of row r wherever the row goes.
template <typename T, typename C, int N>
__device__ __forceinline__ void store_row_unit(const AppendArgs<T, C>& a, const TokenTargets<C>& tt, const RowOf& r,
                                               const UnitPlace& pl, const UnitChunks<T, N>& x) {
  const int64_t t = tt.token;
  if (r.kind == RowKind::kQuery) {
    if (a.q_out_fp8.data != nullptr)
      store_unit(a.q_out_fp8.row(t, r.head), pl, x, tt.q_inv);
    else
      store_unit(a.q_out.row(t, r.head), pl, x, 1.0);
    return;
  }
  if (r.kind == RowKind::kKey) {
    if (a.k_out.data != nullptr) store_unit(a.k_out.row(t, r.head), pl, x, 1.0);
    if (a.k_back.data != nullptr) store_unit(a.k_back.row(t, r.head), pl, x, 1.0);
  }
  C* cache = r.kind == RowKind::kKey ? tt.k_cache : tt.v_cache;
  if (cache != nullptr) {
    const CacheRows<C>& c = r.kind == RowKind::kKey ? a.k_cache : a.v_cache;
    const double inv = !kIsFp8<C>  ? 1.0
                       : c.per_head ? scale_reciprocal(head_scale(c, r.head))
                       : r.kind == RowKind::kKey ? tt.k_inv
                                                 : tt.v_inv;
    store_unit(cache + r.head * c.rows.head_stride, pl, x, inv);
  }
}

//! A group's walk over one token's rows j = slice, slice + slices, ... (g.per_token of them), every lane
//! of the group together. kSingle: a lane holds one unit (g.units <= g.lanes), its angles loaded once for
//! all of the token's rows, kRowsInFlight rows loaded before any is finished; begin() issues the
//! first loads, which need neither the position nor the slot. Else each lane loops over the units of a
//! row, a row at a time (the norm reads the row twice).
template <typename T, typename C, int N, bool kSingle, int kRowsInFlight>
struct TokenWalk {
  static constexpr int kRows = kSingle ? kRowsInFlight : 1;
  int64_t token;
  int slice, lane;
  CallScales scales;
  UnitChunks<T, N> x[kRows];

  __device__ __forceinline__ void load_batch(const AppendArgs<T, C>& a, const AppendGeometry& g, int j0,
                                             const UnitPlace& pl, bool active) {
    const int q = static_cast<int>(a.q_heads), h = static_cast<int>(a.heads);
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int j = j0 + k * g.slices;
      if (j < g.per_token && active) x[k] = load_unit<T, N>(row_source(a, token, row_of(j, q, h)), pl);
    }
  }

  __device__ __forceinline__ void begin(const AppendArgs<T, C>& a, const AppendGeometry& g, int64_t t, int s, int l) {
    token = t;
    slice = s;
    lane = l;
    scales = call_scales(a);
    if constexpr (kSingle)
      load_batch(a, g, slice, unit_place<N>(a.style, a.rotary_dim, a.head_dim, g.rotary_units, lane), lane < g.units);
  }

  //! Finishes and stores the token's rows given its position (-1: it writes nothing) and the slot it
  //! writes (-1: no cache row).
  __device__ __forceinline__ void run(const AppendArgs<T, C>& a, const AppendGeometry& g, int64_t position,
                                      int64_t slot) {
    if (position < 0) return;
    const TokenTargets<C> tt = token_targets(a, g, token, position, slot, scales);
    const int q = static_cast<int>(a.q_heads), h = static_cast<int>(a.heads);
    if constexpr (kSingle) {
      const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, g.rotary_units, lane);
      const bool active = lane < g.units;
      RopeChunk<N> c, s;
      if (active && pl.rotated) load_unit_angles<T, C, N>(a, g, tt.table, pl, c, s);
      for (int j0 = slice;;) {
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          const int j = j0 + k * g.slices;
          if (j >= g.per_token) break;
          const RowOf r = row_of(j, q, h);
          if (r.kind != RowKind::kValue) {
            const T* norm = r.kind == RowKind::kQuery ? a.q_norm : a.k_norm;
            float inv_rms = 1.0f;
            if (norm != nullptr)
              inv_rms = rsqrtf(group_sum(active ? unit_square_sum(x[k]) : 0.0f, g.lanes) /
                                   static_cast<float>(a.head_dim) +
                               a.norm_eps);
            if (active) finish_unit<T, C, N>(a, norm, inv_rms, pl, c, s, x[k]);
          }
          if (active) store_row_unit<T, C, N>(a, tt, r, pl, x[k]);
        }
        j0 += kRows * g.slices;
        if (j0 >= g.per_token) break;
        load_batch(a, g, j0, pl, active);
      }
    } else {
      for (int j = slice; j < g.per_token; j += g.slices) {
        const RowOf r = row_of(j, q, h);
        const T* src = row_source(a, token, r);
        const T* norm = r.kind == RowKind::kQuery ? a.q_norm : r.kind == RowKind::kKey ? a.k_norm : nullptr;
        float inv_rms = 1.0f;
        if (norm != nullptr) {
          float sum = 0.0f;
          for (int u = lane; u < g.units; u += g.lanes)
            sum += unit_square_sum(
                load_unit<T, N>(src, unit_place<N>(a.style, a.rotary_dim, a.head_dim, g.rotary_units, u)));
          inv_rms = rsqrtf(group_sum(sum, g.lanes) / static_cast<float>(a.head_dim) + a.norm_eps);
        }
        for (int u = lane; u < g.units; u += g.lanes) {
          const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, g.rotary_units, u);
          UnitChunks<T, N> y = load_unit<T, N>(src, pl);
          if (r.kind != RowKind::kValue) {
            RopeChunk<N> c, s;
            if (pl.rotated) load_unit_angles<T, C, N>(a, g, tt.table, pl, c, s);
            finish_unit<T, C, N>(a, norm, inv_rms, pl, c, s, y);
          }
          store_row_unit<T, C, N>(a, tt, r, pl, y);
        }
      }
    }
  }
};

}  // namespace kvrope::detail
