// The forward kernel: each token's k rotated and v copied into rows cache_position of the caches,
// RoPE(k) into key_out, q rotated; a warp a token (or a share of its heads).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../../backward_params.cuh"
#include "../../core/vec.cuh"
#include "../../forward_params.cuh"
#include "../../rope.cuh"
#include "args.cuh"

namespace kvrope::detail {

//! The forward kernel's block: four warps, so that few tokens still spread over many SMs.
inline constexpr int kForwardBlockThreads = 128;
//! Blocks a SM: 12 warps of up to 168 registers (perf log f3: at 128 the rows held across the position spilled).
inline constexpr int kForwardBlocksPerSm = 3;
//! Heads whose loads a lane issues together, before their stores (a store may alias a later load).
inline constexpr int kForwardBatch = 2;

// An index as loaded (int32: `lo`, `hi` zero): arithmetic on it where it is loaded would wait for the
// load there, so its value is formed only where it is used.
struct RawIndex {
  uint32_t lo = 0, hi = 0;
};
__device__ __forceinline__ RawIndex load_raw_index(const void* array, bool is_int64, int64_t index) {
  RawIndex r;
  if (is_int64) {
    const uint2 v = static_cast<const uint2*>(array)[index];
    r.lo = v.x, r.hi = v.y;
  } else {
    r.lo = static_cast<const uint32_t*>(array)[index];
  }
  return r;
}
__device__ __forceinline__ int64_t index_value(const RawIndex& r, bool is_int64) {
  return is_int64 ? static_cast<int64_t>((uint64_t{r.hi} << 32) | r.lo) : int64_t{static_cast<int32_t>(r.lo)};
}

// Prefetches into L2 the rows item (b, t, part) will read that need no position: the lane's chunks of
// its k, v and q rows and its per-token tables, so that its loads once the position is in find them.
template <typename T, int N>
__device__ __forceinline__ void forward_prefetch(const ForwardArgs<T>& a, int64_t b, int64_t t, int part, int lane) {
  const int slot = a.units <= 32 ? lane / a.units : 0;
  const int u = a.units <= 32 ? lane % a.units : lane;
  if (slot >= a.slots || u >= a.units) return;
  const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, u);
  auto prefetch = [](const T* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p) : "memory"); };
  if (a.cos.data != nullptr && pl.rotated) {
    prefetch(a.cos.row(b, t) + pl.lo);
    prefetch(a.sin.row(b, t) + pl.lo);
  }
  const int parts = 1 << a.parts_log2;
  for (int64_t j = slot + int64_t{a.slots} * part; j < a.heads + a.q_heads; j += int64_t{a.slots} * parts) {
    const T* x = j < a.heads ? a.k.row(b, j, t) : a.q.row(b, j - a.heads, t);
    prefetch(x + pl.lo);
    prefetch(x + pl.hi);
    if (j < a.heads) {
      prefetch(a.v.row(b, j, t) + pl.lo);
      prefetch(a.v.row(b, j, t) + pl.hi);
    }
  }
}

// The cache row a position names, or -1 when it is out of range.
template <typename T>
__device__ __forceinline__ int64_t forward_row(const ForwardArgs<T>& a, const RawIndex& position) {
  int64_t p = index_value(position, a.positions_are_int64);
  if (p < 0) p += a.cache_len;
  return p >= 0 && p < a.cache_len ? p : -1;
}

// The rotary tables of one unit, in fp32: cos and sin of the elements of its lo and hi chunks.
template <int N>
struct UnitTables {
  RopeChunk<N> cos, sin;
};

//! Where the rotary tables come from (a template parameter: one path an instance).
enum class TableSource : int { kPerToken, kCacheT, kCacheF32 };

// The tables of unit `pl` of token (b, t); `table_row` is its row of the table cache (position id).
template <TableSource kSource, typename T, int N>
__device__ __forceinline__ UnitTables<N> load_unit_tables(const ForwardArgs<T>& a, int64_t b, int64_t t,
                                                          int64_t table_row, const UnitPlace& pl) {
  UnitTables<N> tb;
  if constexpr (kSource == TableSource::kPerToken) {
    tb.cos = load_chunk<N>(a.cos.row(b, t) + pl.lo, pl.hi - pl.lo, 0);
    tb.sin = load_chunk<N>(a.sin.row(b, t) + pl.lo, pl.hi - pl.lo, 0);
  } else {
    // One angle a pair: cos in columns [0, R/2), sin in [R/2, R) of the row.
    using E = std::conditional_t<kSource == TableSource::kCacheF32, float, T>;
    const E* cs = static_cast<const E*>(a.table_cache) + table_row * a.rotary_dim;
    const E* sn = cs + a.rotary_dim / 2;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int64_t lo = pl.cross ? pl.pair_lo + i : pl.pair_lo + i / 2;
      const int64_t hi = pl.cross ? lo : pl.pair_hi + i / 2;
      tb.cos.lo[i] = to_float(cs[lo]);
      tb.sin.lo[i] = to_float(sn[lo]);
      tb.cos.hi[i] = to_float(cs[hi]);
      tb.sin.hi[i] = to_float(sn[hi]);
    }
  }
  return tb;
}

// Stores a unit of one row: as loaded when it is not rotated (bit-exact), else rotated and rounded once.
template <typename T, int N>
__device__ __forceinline__ void store_unit(T* row, const UnitPlace& pl, const Vec<T, N>& lo, const Vec<T, N>& hi,
                                           const RopeChunk<N>& rotated) {
  store_vec(row + pl.lo, pl.rotated ? Vec<T, N>::from_float(rotated.lo) : lo);
  store_vec(row + pl.hi, pl.rotated ? Vec<T, N>::from_float(rotated.hi) : hi);
}

// Whether token t of batch b has a position id in range (always, with per-token tables).
template <typename T>
__device__ __forceinline__ bool position_id_ok(const ForwardArgs<T>& a, int64_t b, int64_t t) {
  if (a.table_cache == nullptr) return true;
  const int64_t id =
      index_value(load_raw_index(a.position_ids, a.positions_are_int64, b * a.position_ids_batch_stride + t),
                  a.positions_are_int64);
  return id >= 0 && id < a.max_position;
}

// Whether token t of batch b is the last to write cache row r: no later token names r with a position
// id in range. Checked only when the block's bitmask says that a row with r's hash is named twice:
// then the warp scans the later positions.
template <typename T>
__device__ __forceinline__ bool last_writer(const ForwardArgs<T>& a, const uint32_t* dup, int64_t b, int64_t t,
                                            int64_t r, int lane) {
  if (a.mask_words == 0) return true;
  const uint64_t h = static_cast<uint64_t>(r) & static_cast<uint64_t>(a.mask_words * 32 - 1);
  if (((dup[h >> 5] >> (h & 31)) & 1u) == 0) return true;
  for (int64_t base = t + 1; base < a.seq_len; base += 32) {
    const int64_t u = base + lane;
    if (__any_sync(0xffffffffu, u < a.seq_len &&
                                    forward_row(a, load_raw_index(a.positions, a.positions_are_int64, u)) == r &&
                                    position_id_ok(a, b, u)))
      return false;
  }
  return true;
}

// One batch of a lane's heads (k or q, and v chunks), loaded.
template <typename T, int N>
struct HeadBatch {
  Vec<T, N> x_lo[kForwardBatch], x_hi[kForwardBatch], v_lo[kForwardBatch], v_hi[kForwardBatch];

  __device__ __forceinline__ void load(const ForwardArgs<T>& a, int64_t b, int64_t t, const UnitPlace& pl, int slot,
                                       int64_t p0) {
    const int parts = 1 << a.parts_log2;
#pragma unroll
    for (int k = 0; k < kForwardBatch; ++k) {
      const int64_t j = slot + a.slots * (p0 + int64_t{k} * parts);
      if (j < a.heads) {
        const T* kr = a.k.row(b, j, t);
        const T* vr = a.v.row(b, j, t);
        x_lo[k] = load_vec<cub::LOAD_CS, T, N>(kr + pl.lo);
        x_hi[k] = load_vec<cub::LOAD_CS, T, N>(kr + pl.hi);
        v_lo[k] = load_vec<cub::LOAD_CS, T, N>(vr + pl.lo);
        v_hi[k] = load_vec<cub::LOAD_CS, T, N>(vr + pl.hi);
      } else if (j < a.heads + a.q_heads) {
        const T* qr = a.q.row(b, j - a.heads, t);
        x_lo[k] = load_vec<cub::LOAD_CS, T, N>(qr + pl.lo);
        x_hi[k] = load_vec<cub::LOAD_CS, T, N>(qr + pl.hi);
      }
    }
  }

  // Rotates and stores what load() read: k into cache row r (when `write`) and key_out, v into row r, q.
  __device__ __forceinline__ void store(const ForwardArgs<T>& a, int64_t b, int64_t t, const UnitPlace& pl,
                                        const UnitTables<N>& tb, int slot, int64_t p0, int64_t r, bool write) const {
    const int parts = 1 << a.parts_log2;
#pragma unroll
    for (int k = 0; k < kForwardBatch; ++k) {
      const int64_t j = slot + a.slots * (p0 + int64_t{k} * parts);
      if (j >= a.heads + a.q_heads) break;
      RopeChunk<N> x;
      x_lo[k].to_float(x.lo);
      x_hi[k].to_float(x.hi);
      if (pl.rotated) x = pl.cross ? rope_forward(x, tb.cos, tb.sin) : rope_forward_interleaved(x, tb.cos, tb.sin);
      if (j < a.heads) {
        if (write) {
          store_unit(a.k_cache.row(b, j, r), pl, x_lo[k], x_hi[k], x);
          store_vec(a.v_cache.row(b, j, r) + pl.lo, v_lo[k]);
          store_vec(a.v_cache.row(b, j, r) + pl.hi, v_hi[k]);
        }
        if (a.k_out.data != nullptr) store_unit(a.k_out.row(b, j, t), pl, x_lo[k], x_hi[k], x);
      } else {
        store_unit(a.q_out.row(b, j - a.heads, t), pl, x_lo[k], x_hi[k], x);
      }
    }
  }
};

// One warp's share of token (b, t): heads slot + slots (part + parts k), every unit of their rows. The
// first batch's rows (and per-token tables) are loaded before the position is looked at, so that the
// position's round trip and theirs overlap.
template <TableSource kSource, typename T, int N>
__device__ __forceinline__ void forward_item(const ForwardArgs<T>& a, const uint32_t* dup, int64_t b, int64_t t,
                                             int part, int lane) {
  const RawIndex position = load_raw_index(a.positions, a.positions_are_int64, t);
  RawIndex id;
  if constexpr (kSource != TableSource::kPerToken)
    id = load_raw_index(a.position_ids, a.positions_are_int64, b * a.position_ids_batch_stride + t);
  const int slot = a.units <= 32 ? lane / a.units : 0;
  const int first_unit = a.units <= 32 ? lane % a.units : lane;
  const bool active = slot < a.slots && first_unit < a.units;
  UnitPlace pl{};
  Vec<T, N> cos_lo, cos_hi, sin_lo, sin_hi;
  HeadBatch<T, N> first;
  if (active) {
    pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, first_unit);
    if constexpr (kSource == TableSource::kPerToken) {
      if (pl.rotated) {
        cos_lo = load_vec<cub::LOAD_DEFAULT, T, N>(a.cos.row(b, t) + pl.lo);
        cos_hi = load_vec<cub::LOAD_DEFAULT, T, N>(a.cos.row(b, t) + pl.hi);
        sin_lo = load_vec<cub::LOAD_DEFAULT, T, N>(a.sin.row(b, t) + pl.lo);
        sin_hi = load_vec<cub::LOAD_DEFAULT, T, N>(a.sin.row(b, t) + pl.hi);
      }
    }
    first.load(a, b, t, pl, slot, part);
  }
  const int64_t r = forward_row(a, position);
  int64_t table_row = 0;
  bool tables_ok = true;
  if constexpr (kSource != TableSource::kPerToken) {
    table_row = index_value(id, a.positions_are_int64);
    tables_ok = table_row >= 0 && table_row < a.max_position;
  }
  if (part == 0 && lane == 0 && a.error_flag != nullptr) {
    if (r < 0) atomicOr(a.error_flag, kErrorPositionOutOfRange);
    if (!tables_ok) atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
  }
  if (!tables_ok) return;                                           // its rotation is undefined: nothing written
  const bool write = r >= 0 && last_writer(a, dup, b, t, r, lane);  // (every lane: a warp vote)
  if (!active) return;
  const int parts = 1 << a.parts_log2;
  const int64_t all_heads = a.heads + a.q_heads;
  const int64_t step = int64_t{kForwardBatch} * parts;
  UnitTables<N> tb{};
  if (kSource == TableSource::kPerToken && pl.rotated) {
    cos_lo.to_float(tb.cos.lo);
    cos_hi.to_float(tb.cos.hi);
    sin_lo.to_float(tb.sin.lo);
    sin_hi.to_float(tb.sin.hi);
  } else if (pl.rotated) {
    tb = load_unit_tables<kSource, T, N>(a, b, t, table_row, pl);
  }
  first.store(a, b, t, pl, tb, slot, part, r, write);
  // The first unit's later batches (more heads than a pass of the item), then the lane's later units.
  for (int u = first_unit;;) {
#pragma unroll 1
    for (int64_t p0 = part + (u == first_unit ? step : 0); slot + a.slots * p0 < all_heads; p0 += step) {
      HeadBatch<T, N> next;
      next.load(a, b, t, pl, slot, p0);
      next.store(a, b, t, pl, tb, slot, p0, r, write);
    }
    u += 32;
    if (u >= a.units) break;
    pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, u);
    if (pl.rotated) tb = load_unit_tables<kSource, T, N>(a, b, t, table_row, pl);
  }
}

//! The forward. N: elements a chunk (16 bytes, or 1 when a row or stride is not 16-byte aligned).
//! Each block marks which cache rows (hashed into its bitmask) are named twice, so that only the
//! tokens of such rows check whether a later token overwrites theirs (the last one wins).
template <typename T, int N, TableSource kSource>
__global__ void __launch_bounds__(kForwardBlockThreads, kForwardBlocksPerSm) forward_kernel(const ForwardArgs<T> a) {
  extern __shared__ uint32_t masks[];  // [seen | named twice], mask_words each
  uint32_t* seen = masks;
  uint32_t* dup = masks + a.mask_words;
  const int lane = threadIdx.x & 31;
  const int64_t items = (a.batch * a.seq_len) << a.parts_log2;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  const int64_t first_item = int64_t{threadIdx.x / 32} * gridDim.x + blockIdx.x;
  // The first item's rows go to L2 before the bitmask's build, so that their round trips overlap.
  if (first_item < items) {
    uint64_t t = 0;
    const int64_t b = static_cast<int64_t>(a.div_seq.divmod(static_cast<uint64_t>(first_item >> a.parts_log2), t));
    forward_prefetch<T, N>(a, b, static_cast<int64_t>(t), static_cast<int>(first_item & ((1 << a.parts_log2) - 1)),
                           lane);
  }
  if (a.mask_words > 0) {
    for (int64_t i = threadIdx.x; i < 2 * a.mask_words; i += blockDim.x) masks[i] = 0;
    __syncthreads();
    const uint64_t hash = static_cast<uint64_t>(a.mask_words * 32 - 1);
    constexpr int kLoads = 4;
    for (int64_t t0 = threadIdx.x; t0 < a.seq_len; t0 += kLoads * int64_t{blockDim.x}) {
      RawIndex raw[kLoads];  // every load issued before any arithmetic on one (a round trip for all)
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int64_t t = t0 + k * int64_t{blockDim.x};
        raw[k] = load_raw_index(a.positions, a.positions_are_int64, t < a.seq_len ? t : t0);
      }
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int64_t r = forward_row(a, raw[k]);
        if (t0 + k * int64_t{blockDim.x} >= a.seq_len || r < 0) continue;
        const uint64_t h = static_cast<uint64_t>(r) & hash;
        const uint32_t bit = 1u << (h & 31);
        if (atomicOr(&seen[h >> 5], bit) & bit) atomicOr(&dup[h >> 5], bit);
      }
    }
    __syncthreads();
  }
  for (int64_t item = first_item; item < items; item += warps) {
    uint64_t t = 0;
    const int64_t b = static_cast<int64_t>(a.div_seq.divmod(static_cast<uint64_t>(item >> a.parts_log2), t));
    forward_item<kSource, T, N>(a, dup, b, static_cast<int64_t>(t), static_cast<int>(item & ((1 << a.parts_log2) - 1)),
                                lane);
  }
}

}  // namespace kvrope::detail
