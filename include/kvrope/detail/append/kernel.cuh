// The append kernel: a group of lanes a head row (q, k or v of one token); each lane a unit (two chunks
// of the row). q and k are RMS-normed (optionally) and rotated, k and v written to their cache slots.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "../../core/vec.cuh"
#include "../../error_flag.cuh"
#include "../../rope.cuh"
#include "../common/position.cuh"
#include "../common/rotary_units.cuh"
#include "args.cuh"
#include "policy.cuh"

namespace kvrope::detail {

//! Slots a thread loads at once while checking them for repeats.
inline constexpr int kAppendSlotLoads = 8;

// Whether the slot of token t may be named again by a later token: false for every token when the
// non-negative slots increase strictly and negative ones (padding) only follow them, checked with one
// load of every slot and one barrier. Otherwise the block marks in `masks` ([seen | named twice],
// mask_words each) the slots, hashed, that are named twice.
template <typename T, typename C>
__device__ __forceinline__ bool block_slots_may_repeat(const AppendArgs<T, C>& a, uint32_t* masks) {
  bool increasing = true;
  for (int64_t t0 = threadIdx.x; t0 < a.tokens; t0 += kAppendSlotLoads * int64_t{blockDim.x}) {
    int64_t s[kAppendSlotLoads], prev[kAppendSlotLoads];  // all issued before any is used
#pragma unroll
    for (int k = 0; k < kAppendSlotLoads; ++k) {
      const int64_t t = t0 + k * int64_t{blockDim.x};
      s[k] = t < a.tokens ? a.slots[t] : -1;
      prev[k] = t > 0 && t < a.tokens ? a.slots[t - 1] : -1;
    }
#pragma unroll
    for (int k = 0; k < kAppendSlotLoads; ++k) {
      const int64_t t = t0 + k * int64_t{blockDim.x};
      increasing &= t == 0 || t >= a.tokens || (prev[k] < 0 ? s[k] < 0 : s[k] > prev[k] || s[k] < 0);
    }
  }
  if (__syncthreads_and(increasing)) return false;
  uint32_t* seen = masks;
  uint32_t* dup = masks + a.mask_words;
  for (int64_t i = threadIdx.x; i < 2 * a.mask_words; i += blockDim.x) masks[i] = 0;
  __syncthreads();
  const uint64_t hash = static_cast<uint64_t>(a.mask_words * 32 - 1);
  for (int64_t t = threadIdx.x; t < a.tokens; t += blockDim.x) {
    const int64_t s = a.slots[t];
    if (s < 0 || s >= a.num_slots) continue;
    const uint64_t h = static_cast<uint64_t>(s) & hash;
    const uint32_t bit = 1u << (h & 31);
    if (atomicOr(&seen[h >> 5], bit) & bit) atomicOr(&dup[h >> 5], bit);
  }
  __syncthreads();
  return true;
}

template <typename T, typename C>
__device__ __forceinline__ bool append_position_ok(const AppendArgs<T, C>& a, int64_t t) {
  const int64_t p = index_value(load_raw_index(a.positions, a.positions_are_int64, t), a.positions_are_int64);
  return p >= 0 && p < a.max_position;
}

// Whether token t is the last to write slot s: no later token with a position in range names s. Only
// slots the block's bitmask marks as named twice scan the later tokens.
template <typename T, typename C>
__device__ __forceinline__ bool last_slot_writer(const AppendArgs<T, C>& a, const uint32_t* dup, int64_t t, int64_t s) {
  const uint64_t h = static_cast<uint64_t>(s) & static_cast<uint64_t>(a.mask_words * 32 - 1);
  if (((dup[h >> 5] >> (h & 31)) & 1u) == 0) return true;
  for (int64_t u = t + 1; u < a.tokens; ++u)
    if (a.slots[u] == s && append_position_ok(a, u)) return false;
  return true;
}

// N values rounded to the cache's type and stored at `dst` as one access (fp8: x / scale, saturated).
template <typename T, typename C, int N>
__device__ __forceinline__ void store_cache_chunk(C* dst, const Vec<T, N>& x, float scale) {
  if constexpr (std::is_same_v<C, T>) {
    store_vec(dst, x);
  } else {
    constexpr __nv_fp8_interpretation_t kKind = std::is_same_v<C, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    float f[N];
    x.to_float(f);
    uint8_t bytes[N];
#pragma unroll
    for (int i = 0; i < N; ++i) bytes[i] = __nv_cvt_float_to_fp8(f[i] / scale, __NV_SATFINITE, kKind);
    if constexpr (N == 1) {
      *reinterpret_cast<uint8_t*>(dst) = bytes[0];
    } else {
      using Raw = typename RawWord<N>::type;
      Raw raw;
      memcpy(&raw, bytes, N);
      *reinterpret_cast<Raw*>(dst) = raw;
    }
  }
}

// The sum of `v` over the `lanes` lanes of a row's group (lanes a power of two; the group aligned in its warp).
__device__ __forceinline__ float group_sum(float v, int lanes) {
  const int lane = threadIdx.x & 31;
  const unsigned mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1) << (lane & ~(lanes - 1));
  for (int offset = lanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset, lanes);
  return v;
}

enum class RowKind : int { kQuery, kKey, kValue };

// One head row of one token, as the kernel walks it.
struct AppendRow {
  uint32_t token;
  int head;
  RowKind kind;
};

template <typename T, typename C>
__device__ __forceinline__ AppendRow append_row(const AppendArgs<T, C>& a, uint32_t row) {
  AppendRow r;
  r.token = a.div_rows.div32(row);
  const int j = static_cast<int>(row - r.token * a.div_rows.divisor);
  const int q = static_cast<int>(a.q_heads), h = static_cast<int>(a.heads);
  r.kind = j < q ? RowKind::kQuery : j < q + h ? RowKind::kKey : RowKind::kValue;
  r.head = r.kind == RowKind::kQuery ? j : r.kind == RowKind::kKey ? j - q : j - q - h;
  return r;
}

// One unit of a row: where it lies and its two chunks as loaded.
template <typename T, int N>
struct AppendUnit {
  UnitPlace pl;
  Vec<T, N> lo, hi;
};

template <typename T, typename C, int N>
__device__ __forceinline__ AppendUnit<T, N> load_unit(const AppendArgs<T, C>& a, const T* row, int u) {
  AppendUnit<T, N> x;
  x.pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, u);
  x.lo = load_vec<cub::LOAD_CS, T, N>(row + x.pl.lo);
  x.hi = load_vec<cub::LOAD_CS, T, N>(row + x.pl.hi);
  return x;
}

template <typename T, int N>
__device__ __forceinline__ float unit_square_sum(const AppendUnit<T, N>& x) {
  float lo[N], hi[N];
  x.lo.to_float(lo);
  x.hi.to_float(hi);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) s += lo[i] * lo[i] + hi[i] * hi[i];
  return s;
}

// A row's context once its token's position and slot are known.
template <typename T, typename C>
struct AppendRowContext {
  AppendRow r;
  int64_t table_row;  // the position
  C* cache_row;       // the cache row to write, or null
  float scale;        // the cache's scale (fp8)
  const T* norm;      // the norm weights, or null
  float inv_rms;      // the row's norm factor
};

// Normalizes (when asked), rotates and rounds one unit of a q or k row; v rows come out as loaded.
template <typename T, typename C, int N>
__device__ __forceinline__ void finish_unit(const AppendArgs<T, C>& a, const AppendRowContext<T, C>& ctx,
                                            AppendUnit<T, N>& x) {
  if (ctx.r.kind == RowKind::kValue || (ctx.norm == nullptr && !x.pl.rotated)) return;  // bit-exact copy
  RopeChunk<N> f;
  x.lo.to_float(f.lo);
  x.hi.to_float(f.hi);
  if (ctx.norm != nullptr) {
    float wl[N], wh[N];
    load_vec<cub::LOAD_DEFAULT, T, N>(ctx.norm + x.pl.lo).to_float(wl);
    load_vec<cub::LOAD_DEFAULT, T, N>(ctx.norm + x.pl.hi).to_float(wh);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      f.lo[i] = f.lo[i] * ctx.inv_rms * (wl[i] + a.norm_offset);
      f.hi[i] = f.hi[i] * ctx.inv_rms * (wh[i] + a.norm_offset);
    }
  }
  if (x.pl.rotated) {
    RopeChunk<N> c, s;
    if (a.table_f32) {
      const float* cs = static_cast<const float*>(a.table) + ctx.table_row * a.rotary_dim;
      load_cached_angles<N>(cs, cs + a.rotary_dim / 2, x.pl, c, s);
    } else {
      const T* cs = static_cast<const T*>(a.table) + ctx.table_row * a.rotary_dim;
      load_cached_angles<N>(cs, cs + a.rotary_dim / 2, x.pl, c, s);
    }
    f = x.pl.cross ? rope_forward(f, c, s) : rope_forward_interleaved(f, c, s);
  }
  x.lo = Vec<T, N>::from_float(f.lo);
  x.hi = Vec<T, N>::from_float(f.hi);
}

// Stores a finished unit wherever its row goes.
template <typename T, typename C, int N>
__device__ __forceinline__ void store_unit(const AppendArgs<T, C>& a, const AppendRowContext<T, C>& ctx,
                                           const AppendUnit<T, N>& x) {
  auto store_pair = [&](T* row) {
    store_vec(row + x.pl.lo, x.lo);
    store_vec(row + x.pl.hi, x.hi);
  };
  const AppendRow& r = ctx.r;
  if (r.kind == RowKind::kQuery) {
    store_pair(a.q_out.row(r.token, r.head));
    return;
  }
  if (r.kind == RowKind::kKey) {
    if (a.k_out.data != nullptr) store_pair(a.k_out.row(r.token, r.head));
    if (a.k_back.data != nullptr) store_pair(a.k_back.row(r.token, r.head));
  }
  if (ctx.cache_row != nullptr) {
    store_cache_chunk<T, C, N>(ctx.cache_row + x.pl.lo, x.lo, ctx.scale);
    store_cache_chunk<T, C, N>(ctx.cache_row + x.pl.hi, x.hi, ctx.scale);
  }
}

// The context of row `r`: false when its token writes nothing (its position is out of range). The
// first lane of a token's first row reports a bad position, of its first k row a bad slot.
template <typename T, typename C>
__device__ __forceinline__ bool row_context(const AppendArgs<T, C>& a, const uint32_t* dup, bool may_repeat,
                                            const RawIndex& position, int64_t slot, int lane,
                                            AppendRowContext<T, C>& ctx) {
  const AppendRow& r = ctx.r;
  ctx.table_row = index_value(position, a.positions_are_int64);
  const bool first_row = r.head == 0 && (r.kind == RowKind::kQuery || (r.kind == RowKind::kKey && a.q_heads == 0));
  if (ctx.table_row < 0 || ctx.table_row >= a.max_position) {
    if (first_row && lane == 0 && a.error_flag != nullptr) atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
    return false;
  }
  ctx.cache_row = nullptr;
  ctx.scale = 1.0f;
  if (r.kind != RowKind::kQuery && slot >= 0) {
    if (slot >= a.num_slots) {
      if (r.kind == RowKind::kKey && r.head == 0 && lane == 0 && a.error_flag != nullptr)
        atomicOr(a.error_flag, kErrorSlotOutOfRange);
    } else if (!may_repeat || last_slot_writer(a, dup, r.token, slot)) {
      uint64_t offset = 0;
      const uint64_t page = a.div_page.divmod(static_cast<uint64_t>(slot), offset);
      const PagedCache<C>& cache = r.kind == RowKind::kKey ? a.k_cache : a.v_cache;
      ctx.cache_row = cache.row(static_cast<int64_t>(page), static_cast<int64_t>(offset), r.head);
      if constexpr (kIsFp8<C>) {
        const float* scale = r.kind == RowKind::kKey ? a.k_scale : a.v_scale;
        if (scale != nullptr) ctx.scale = scale[a.scale_per_head ? r.head : 0];
      }
    }
  }
  ctx.norm = r.kind == RowKind::kQuery ? a.q_norm : r.kind == RowKind::kKey ? a.k_norm : nullptr;
  ctx.inv_rms = 1.0f;
  return true;
}

template <typename T, typename C>
__device__ __forceinline__ const T* row_source(const AppendArgs<T, C>& a, const AppendRow& r) {
  return r.kind == RowKind::kQuery ? a.q.row(r.token, r.head)
         : r.kind == RowKind::kKey ? a.k.row(r.token, r.head)
                                   : a.v.row(r.token, r.head);
}

template <typename T, typename C>
__device__ __forceinline__ float row_inv_rms(const AppendArgs<T, C>& a, float square_sum) {
  return rsqrtf(square_sum / static_cast<float>(a.head_dim) + a.norm_eps);
}

//! The append. N: elements a chunk (16 bytes, or 1 when a row or stride is not aligned). kSingle: a
//! lane holds one unit of its row (units <= lanes), and a group kAppendRowsInFlight rows at once,
//! all loaded before any is finished (the first ones before the block checks the slots for repeats,
//! so that one round trip covers both); else each lane loops over the units of its row (the norm
//! then reads the row twice).
template <typename T, typename C, int N, bool kSingle>
__global__ void __launch_bounds__(kAppendBlockThreads, kAppendBlocksPerSm) append_kernel(const AppendArgs<T, C> a) {
  extern __shared__ uint32_t masks[];
  const uint32_t* dup = masks + a.mask_words;
  const int lanes = a.lanes;
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int64_t stride = (int64_t{gridDim.x} * blockDim.x) / lanes;  // rows a grid holds at once
  int64_t row = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / lanes;
  if constexpr (kSingle) {
    constexpr int kRows = kAppendRowsInFlight;
    AppendRowContext<T, C> ctx[kRows];
    RawIndex position[kRows];
    int64_t slot[kRows];
    AppendUnit<T, N> x[kRows];
    const bool active = lane < a.units;
    // Row k of a step is row + k stride: the grid's groups cover consecutive rows at each k.
    auto load_rows = [&]() {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int64_t r = row + k * stride;
        if (r >= a.rows) break;
        ctx[k].r = append_row(a, static_cast<uint32_t>(r));
        position[k] = load_raw_index(a.positions, a.positions_are_int64, ctx[k].r.token);
        slot[k] = ctx[k].r.kind != RowKind::kQuery ? a.slots[ctx[k].r.token] : -1;
        if (active) x[k] = load_unit<T, C, N>(a, row_source(a, ctx[k].r), lane);
      }
    };
    if (row < a.rows) load_rows();
    const bool may_repeat = a.mask_words > 0 && block_slots_may_repeat(a, masks);  // (every thread: barriers)
    while (row < a.rows) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (row + k * stride >= a.rows) break;
        if (!row_context(a, dup, may_repeat, position[k], slot[k], lane, ctx[k])) continue;
        if (ctx[k].norm != nullptr)
          ctx[k].inv_rms = row_inv_rms(a, group_sum(active ? unit_square_sum(x[k]) : 0.0f, lanes));
        if (active) {
          finish_unit<T, C, N>(a, ctx[k], x[k]);
          store_unit<T, C, N>(a, ctx[k], x[k]);
        }
      }
      row += kRows * stride;
      if (row < a.rows) load_rows();
    }
  } else {
    const bool may_repeat = a.mask_words > 0 && block_slots_may_repeat(a, masks);  // (every thread: barriers)
    AppendRowContext<T, C> ctx;
    for (; row < a.rows; row += stride) {
      ctx.r = append_row(a, static_cast<uint32_t>(row));
      const RawIndex position = load_raw_index(a.positions, a.positions_are_int64, ctx.r.token);
      const int64_t slot = ctx.r.kind != RowKind::kQuery ? a.slots[ctx.r.token] : -1;
      if (!row_context(a, dup, may_repeat, position, slot, lane, ctx)) continue;
      const T* src = row_source(a, ctx.r);
      if (ctx.norm != nullptr) {
        float sum = 0.0f;
        for (int u = lane; u < a.units; u += lanes) sum += unit_square_sum(load_unit<T, C, N>(a, src, u));
        ctx.inv_rms = row_inv_rms(a, group_sum(sum, lanes));
      }
      for (int u = lane; u < a.units; u += lanes) {
        AppendUnit<T, N> y = load_unit<T, C, N>(a, src, u);
        finish_unit<T, C, N>(a, ctx, y);
        store_unit<T, C, N>(a, ctx, y);
      }
    }
  }
}

}  // namespace kvrope::detail
