// The forward kernel: each token's k rotated and v copied into rows cache_position of the caches,
// RoPE(k) into key_out, q rotated; a thread a unit (two chunks of one head row of one token).
#pragma once

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

//! Positions a thread loads at once while checking them (one round trip for S <= 2048).
inline constexpr int kForwardPositionLoads = 8;

// The cache row a position names, or -1 when it is out of range.
template <typename T>
__device__ __forceinline__ int64_t forward_row(const ForwardArgs<T>& a, const RawIndex& position) {
  return wrapped_row(index_value(position, a.positions_are_int64), a.cache_len);
}

//! Where the rotary tables come from (a template parameter: one path an instance).
enum class TableSource : int { kPerToken, kCacheT, kCacheF32 };

// Whether token t of batch b has a position id in range (always, with per-token tables).
template <typename T>
__device__ __forceinline__ bool position_id_ok(const ForwardArgs<T>& a, int64_t b, int64_t t) {
  if (a.table_cache == nullptr) return true;
  const int64_t id =
      index_value(load_raw_index(a.position_ids, a.positions_are_int64, b * a.position_ids_batch_stride + t),
                  a.positions_are_int64);
  return id >= 0 && id < a.max_position;
}

// Whether the cache rows of the call may repeat: false when the positions name one run of S
// consecutive rows (wrapping at S_max), as decoding and prefill do: one load of
// every position and one barrier. Otherwise the block marks in `masks` ([seen | named twice],
// mask_words each) the rows, hashed, that are named twice.
template <typename T>
__device__ __forceinline__ bool block_rows_may_repeat(const ForwardArgs<T>& a, uint32_t* masks) {
  bool run = a.seq_len <= a.cache_len;
  const RawIndex first = load_raw_index(a.positions, a.positions_are_int64, 0);
  for (int64_t t0 = threadIdx.x; t0 < a.seq_len; t0 += kForwardPositionLoads * int64_t{blockDim.x}) {
    RawIndex raw[kForwardPositionLoads];  // all issued before any is used
#pragma unroll
    for (int k = 0; k < kForwardPositionLoads; ++k) {
      const int64_t t = t0 + k * int64_t{blockDim.x};
      raw[k] = load_raw_index(a.positions, a.positions_are_int64, t < a.seq_len ? t : 0);
    }
    const int64_t r0 = forward_row(a, first);
#pragma unroll
    for (int k = 0; k < kForwardPositionLoads; ++k) {
      const int64_t t = t0 + k * int64_t{blockDim.x};
      int64_t expected = r0 + t;
      if (expected >= a.cache_len) expected -= a.cache_len;
      run &= t >= a.seq_len || (r0 >= 0 && forward_row(a, raw[k]) == expected);
    }
  }
  if (__syncthreads_and(run)) return false;
  uint32_t* seen = masks;
  uint32_t* dup = masks + a.mask_words;
  for (int64_t i = threadIdx.x; i < 2 * a.mask_words; i += blockDim.x) masks[i] = 0;
  __syncthreads();
  const uint64_t hash = static_cast<uint64_t>(a.mask_words * 32 - 1);
  for (int64_t t = threadIdx.x; t < a.seq_len; t += blockDim.x) {
    const int64_t r = forward_row(a, load_raw_index(a.positions, a.positions_are_int64, t));
    if (r < 0) continue;
    const uint64_t h = static_cast<uint64_t>(r) & hash;
    const uint32_t bit = 1u << (h & 31);
    if (atomicOr(&seen[h >> 5], bit) & bit) atomicOr(&dup[h >> 5], bit);
  }
  __syncthreads();
  return true;
}

// Whether token t of batch b is the last to write cache row r: no later token names r with a position
// id in range. Only rows the block's bitmask marks as named twice scan the later positions.
template <typename T>
__device__ __forceinline__ bool last_writer(const ForwardArgs<T>& a, const uint32_t* dup, int64_t b, int64_t t,
                                            int64_t r) {
  const uint64_t h = static_cast<uint64_t>(r) & static_cast<uint64_t>(a.mask_words * 32 - 1);
  if (((dup[h >> 5] >> (h & 31)) & 1u) == 0) return true;
  for (int64_t u = t + 1; u < a.seq_len; ++u)
    if (forward_row(a, load_raw_index(a.positions, a.positions_are_int64, u)) == r && position_id_ok(a, b, u))
      return false;
  return true;
}

// One unit of work: unit u of head row j (k and v for j < heads, else q) of token (b, t), loaded.
template <typename T, int N, TableSource kSource>
struct ForwardUnit {
  uint32_t b, t, j;  // (validate: row counts below 2^32)
  int u;
  UnitPlace pl;
  RawIndex position, id;
  Vec<T, N> x_lo, x_hi, v_lo, v_hi, cos_lo, cos_hi, sin_lo, sin_hi;

  // Issues every load that needs no position: the rows, the position (and position id), the
  // per-token tables.
  __device__ __forceinline__ void load(const ForwardArgs<T>& a, int64_t item) {
    uint32_t token = 0;
    if (a.items <= 0xFFFFFFFF) {  // multiply-high divisions only (a division's 64-bit path costs 0.1 us)
      const uint32_t i = static_cast<uint32_t>(item), rest = a.div_units.div32(i);
      u = static_cast<int>(i - rest * a.div_units.divisor);
      token = a.div_heads.div32(rest);
      j = rest - token * a.div_heads.divisor;
    } else {
      uint64_t unit = 0, head = 0;
      token = static_cast<uint32_t>(a.div_heads.divmod(a.div_units.divmod(static_cast<uint64_t>(item), unit), head));
      u = static_cast<int>(unit);
      j = static_cast<uint32_t>(head);
    }
    b = a.div_seq.div32(token);  // (validate: B S below 2^32)
    t = token - b * a.div_seq.divisor;
    position = load_raw_index(a.positions, a.positions_are_int64, t);
    if constexpr (kSource != TableSource::kPerToken)
      id = load_raw_index(a.position_ids, a.positions_are_int64, int64_t{b} * a.position_ids_batch_stride + t);
    pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, u);
    const T* x = j < a.heads ? a.k.row(b, j, t) : a.q.row(b, int64_t{j} - a.heads, t);
    x_lo = load_vec<cub::LOAD_CS, T, N>(x + pl.lo);
    x_hi = load_vec<cub::LOAD_CS, T, N>(x + pl.hi);
    if (j < a.heads) {
      const T* v = a.v.row(b, j, t);
      v_lo = load_vec<cub::LOAD_CS, T, N>(v + pl.lo);
      v_hi = load_vec<cub::LOAD_CS, T, N>(v + pl.hi);
    }
    if constexpr (kSource == TableSource::kPerToken) {
      if (pl.rotated) {
        cos_lo = load_vec<cub::LOAD_DEFAULT, T, N>(a.cos.row(b, t) + pl.lo);
        cos_hi = load_vec<cub::LOAD_DEFAULT, T, N>(a.cos.row(b, t) + pl.hi);
        sin_lo = load_vec<cub::LOAD_DEFAULT, T, N>(a.sin.row(b, t) + pl.lo);
        sin_hi = load_vec<cub::LOAD_DEFAULT, T, N>(a.sin.row(b, t) + pl.hi);
      }
    }
  }

  // The unit's tables in fp32: as loaded, or from the table cache (one angle a pair: cos in columns
  // [0, R/2), sin in [R/2, R) of row `table_row`).
  __device__ __forceinline__ void tables(const ForwardArgs<T>& a, int64_t table_row, RopeChunk<N>& c,
                                         RopeChunk<N>& s) const {
    if constexpr (kSource == TableSource::kPerToken) {
      cos_lo.to_float(c.lo);
      cos_hi.to_float(c.hi);
      sin_lo.to_float(s.lo);
      sin_hi.to_float(s.hi);
    } else {
      using E = std::conditional_t<kSource == TableSource::kCacheF32, float, T>;
      const E* cs = static_cast<const E*>(a.table_cache) + table_row * a.rotary_dim;
      load_cached_angles<N>(cs, a.rotary_dim / 2, pl, c, s);
    }
  }

  // Rotates and stores what load() read: k into cache row r (unless a later token names r) and
  // key_out, v into row r, q into query_out. `may_repeat`: the block's bitmask is in `dup`. The
  // token's first unit reports its errors.
  __device__ __forceinline__ void store(const ForwardArgs<T>& a, const uint32_t* dup, bool may_repeat) const {
    const bool reports = j == 0 && u == 0 && a.error_flag != nullptr;
    const int64_t r = forward_row(a, position);
    if (reports && r < 0) atomicOr(a.error_flag, kErrorPositionOutOfRange);
    int64_t table_row = 0;
    if constexpr (kSource != TableSource::kPerToken) {
      table_row = index_value(id, a.positions_are_int64);
      if (table_row < 0 || table_row >= a.max_position) {  // its rotation is undefined: nothing written
        if (reports) atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
        return;
      }
    }
    Vec<T, N> out_lo = x_lo, out_hi = x_hi;  // not rotated: as loaded (bit-exact)
    if (pl.rotated) {                        // rotated: rounded once
      RopeChunk<N> x, c, s;
      tables(a, table_row, c, s);
      x_lo.to_float(x.lo);
      x_hi.to_float(x.hi);
      x = pl.cross ? rope_forward(x, c, s) : rope_forward_interleaved(x, c, s);
      out_lo = Vec<T, N>::from_float(x.lo);
      out_hi = Vec<T, N>::from_float(x.hi);
    }
    auto store_pair = [&](T* row, const Vec<T, N>& lo, const Vec<T, N>& hi) {
      store_vec(row + pl.lo, lo);
      store_vec(row + pl.hi, hi);
    };
    if (j >= a.heads) {
      store_pair(a.q_out.row(b, int64_t{j} - a.heads, t), out_lo, out_hi);
      return;
    }
    if (a.k_out.data != nullptr) store_pair(a.k_out.row(b, j, t), out_lo, out_hi);
    if (r < 0 || (may_repeat && !last_writer(a, dup, b, t, r))) return;
    store_pair(a.k_cache.row(b, j, r), out_lo, out_hi);
    store_pair(a.v_cache.row(b, j, r), v_lo, v_hi);
  }
};

//! The forward. N: elements a chunk (16 bytes, or 1 when a row or stride is not 16-byte aligned).
//! Items (unit, head, token), the unit fastest, so that a warp's accesses to a row are contiguous. A
//! thread issues its first item's loads before the block checks the positions for repeats, so that
//! one round trip covers both.
template <typename T, int N, TableSource kSource>
__global__ void __launch_bounds__(kForwardBlockThreads, kForwardBlocksPerSm) forward_kernel(const ForwardArgs<T> a) {
  extern __shared__ uint32_t masks[];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t item = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  ForwardUnit<T, N, kSource> unit;
  if (item < a.items) unit.load(a, item);
  const bool may_repeat = a.mask_words > 0 && block_rows_may_repeat(a, masks);  // (every thread: barriers)
  while (item < a.items) {
    unit.store(a, masks + a.mask_words, may_repeat);
    item += stride;
    if (item < a.items) unit.load(a, item);
  }
}

}  // namespace kvrope::detail
