// The append kernel: a block takes tiles of consecutive tokens; it stages each tile's table rows and the
// slots its tokens write in shared memory, then a group of lanes a head row (q, k or v of one token),
// each lane a unit (two chunks of the row). q and k are RMS-normed (optionally) and rotated, k and v
// written to their cache slots.
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

//! An empty key of a tile's slot table (no slot in range has all bits set).
inline constexpr unsigned long long kAppendNoSlot = ~0ull;

// A tile's staged state in shared memory (AppendShared): `slot[i]` is the slot token first + i writes,
// -1 when it writes no cache row, -2 when its position is out of range (it writes nothing).
struct AppendTile {
  int64_t first;
  int count;
  unsigned char* table;
  int64_t* slot;
  unsigned long long* keys;
  int* last;   // the tile's last token naming the key's slot with its position in range
  int* later;  // 1: a later token of the call names it (with its position in range)
};

__device__ __forceinline__ AppendTile append_tile(unsigned char* shared, const AppendShared& at, int64_t first,
                                                  int count) {
  return {first,
          count,
          shared + at.table,
          reinterpret_cast<int64_t*>(shared + at.slots),
          reinterpret_cast<unsigned long long*>(shared + at.keys),
          reinterpret_cast<int*>(shared + at.last),
          reinterpret_cast<int*>(shared + at.later)};
}

__device__ __forceinline__ int slot_hash(int64_t slot, int hash_slots) {
  return static_cast<int>((static_cast<uint64_t>(slot) * 0x9E3779B97F4A7C15ull) >> 32) & (hash_slots - 1);
}

// The entry of `slot` in the tile's slot table, inserted if absent (the table holds twice the tile's tokens).
__device__ __forceinline__ int insert_slot(const AppendTile& tl, int hash_slots, int64_t slot) {
  for (int e = slot_hash(slot, hash_slots);; e = (e + 1) & (hash_slots - 1)) {
    const unsigned long long prev = atomicCAS(&tl.keys[e], kAppendNoSlot, static_cast<unsigned long long>(slot));
    if (prev == kAppendNoSlot || prev == static_cast<unsigned long long>(slot)) return e;
  }
}

// The entry of `slot`, or -1 when no token of the tile names it.
__device__ __forceinline__ int find_slot(const AppendTile& tl, int hash_slots, int64_t slot) {
  for (int e = slot_hash(slot, hash_slots);; e = (e + 1) & (hash_slots - 1)) {
    const unsigned long long key = tl.keys[e];
    if (key == static_cast<unsigned long long>(slot)) return e;
    if (key == kAppendNoSlot) return -1;
  }
}

// Token t's position, or -1 when it is outside [0, max_position).
template <typename T, typename C>
__device__ __forceinline__ int64_t append_position(const AppendArgs<T, C>& a, int64_t t) {
  const int64_t p = index_value(load_raw_index(a.positions, a.positions_are_int64, t), a.positions_are_int64);
  return p >= 0 && p < a.max_position ? p : -1;
}

// Copies `bytes` (16, 8 or 4) from global to shared memory without a register (sm_80+: cp.async).
__device__ __forceinline__ void copy_to_shared_async(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if (bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else if (bytes == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
#else
  if (bytes == 16)
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  else if (bytes == 8)
    *static_cast<uint2*>(dst) = *static_cast<const uint2*>(src);
  else
    *static_cast<uint32_t*>(dst) = *static_cast<const uint32_t*>(src);
#endif
}

__device__ __forceinline__ void wait_shared_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Closes the thread's current group of asynchronous copies (possibly empty).
__device__ __forceinline__ void commit_shared_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most `kPending` of the thread's latest groups are still copying.
template <int kPending>
__device__ __forceinline__ void wait_shared_copies_but() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Calls f(s, u) for each token u = first, first + stride, ... below a.tokens, with its slot s: a thread
// loads kAppendSlotLoads slots a round, all in flight before any is used.
template <typename T, typename C, typename F>
__device__ __forceinline__ void for_later_slots(const AppendArgs<T, C>& a, int64_t first, int64_t stride, F&& f) {
  for (int64_t u0 = first; u0 < a.tokens; u0 += kAppendSlotLoads * stride) {
    int64_t s[kAppendSlotLoads];
#pragma unroll
    for (int k = 0; k < kAppendSlotLoads; ++k) {
      const int64_t u = u0 + k * stride;
      s[k] = u < a.tokens ? a.slots[u] : -1;
    }
#pragma unroll
    for (int k = 0; k < kAppendSlotLoads; ++k) f(s[k], u0 + k * stride);
  }
}

// Stages tile `tl` (every thread of the block; it ends with a barrier): each token's slot, its table row
// (copied while the later tokens' slots are scanned), and whether it is the last to write its slot: no
// later token with its position in range names it, in the tile (the slot table's `last`) or after it
// (a scan of every later slot against the table). A bad position or slot sets its bit of the error flag.
template <typename T, typename C>
__device__ __forceinline__ void stage_tile(const AppendArgs<T, C>& a, const AppendTile& tl) {
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int hs = a.hash_slots;
  for (int e = tid; e < hs; e += threads) {
    tl.keys[e] = kAppendNoSlot;
    tl.last[e] = -1;
    tl.later[e] = 0;
  }
  for (int i = tid; i < tl.count; i += threads) {
    const int64_t t = tl.first + i;
    int64_t s = hs > 0 ? a.slots[t] : -1;
    if (append_position(a, t) < 0) {
      if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
      s = -2;
    } else {
      if (s >= a.num_slots) {
        if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrorSlotOutOfRange);
        s = -1;
      }
      s = s < 0 ? -1 : s;
    }
    tl.slot[i] = s;
  }
  // The table rows, a copy a thread (each thread loads the position its copy needs).
  const int bytes = static_cast<int>(append_table_bytes(a));
  const int step = a.table_copy_bytes;
  const int copies = bytes / step;
  for (int c = tid; c < tl.count * copies; c += threads) {
    const int i = c / copies, b = (c - i * copies) * step;
    const int64_t p = append_position(a, tl.first + i);
    if (p < 0) continue;
    const unsigned char* src = static_cast<const unsigned char*>(a.table) + p * bytes + b;
    unsigned char* dst = tl.table + int64_t{i} * a.table_row_bytes + b;
    if (step >= 4)
      copy_to_shared_async(dst, src, step);
    else
      *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src);
  }
  __syncthreads();
  if (hs > 0) {
    // A tile of one token (decode) needs no table: its slot is compared with each later one.
    const bool one = tl.count == 1;
    const int64_t own = tl.slot[0];
    if (!one) {
      for (int i = tid; i < tl.count; i += threads)
        if (tl.slot[i] >= 0) atomicMax(&tl.last[insert_slot(tl, hs, tl.slot[i])], i);
      __syncthreads();
    }
    if (!one || own >= 0)
      for_later_slots(a, tl.first + tl.count + tid, threads, [&](int64_t s, int64_t u) {
        if (s < 0 || s >= a.num_slots) return;
        const int e = one ? (s == own ? 0 : -1) : find_slot(tl, hs, s);
        if (e >= 0 && append_position(a, u) >= 0) atomicOr(&tl.later[e], 1);
      });
    __syncthreads();
    for (int i = tid; i < tl.count; i += threads) {
      if (tl.slot[i] < 0) continue;
      const int e = one ? 0 : find_slot(tl, hs, tl.slot[i]);
      if ((!one && tl.last[e] != i) || tl.later[e] != 0) tl.slot[i] = -1;  // a later token writes the slot
    }
  }
  wait_shared_copies();
  __syncthreads();
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
  int64_t token;
  int local;  // the token's index in its tile
  int head;
  RowKind kind;
};

// Row j of a token (j in [0, Hq + 2 H): q heads, then k heads, then v heads).
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

// Row r of tile `tl`: a token's rows are numbered j in [0, Hq + 2 H).
template <typename T, typename C>
__device__ __forceinline__ AppendRow append_row(const AppendArgs<T, C>& a, const AppendTile& tl, int r) {
  const int local = static_cast<int>(a.div_rows.div32(static_cast<uint32_t>(r)));
  return token_row(a, tl.first + local, local, r - local * static_cast<int>(a.div_rows.divisor));
}

template <typename T, typename C>
__device__ __forceinline__ const T* row_source(const AppendArgs<T, C>& a, const AppendRow& r) {
  return r.kind == RowKind::kQuery ? a.q.row(r.token, r.head)
         : r.kind == RowKind::kKey ? a.k.row(r.token, r.head)
                                   : a.v.row(r.token, r.head);
}

// A unit's two chunks as loaded.
template <typename T, int N>
struct UnitChunks {
  Vec<T, N> lo, hi;
};

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

// A row's context once its token's staged state is known.
template <typename T, typename C>
struct AppendRowContext {
  AppendRow r;
  const unsigned char* table;  // the token's staged table row
  C* cache_row;                // the cache row to write, or null
  float scale;                 // the cache's scale (fp8)
  const T* norm;               // the norm weights, or null
  float inv_rms;               // the row's norm factor
};

// The scale of row r's cache (fp8 caches' k or v rows; else 1).
template <typename T, typename C>
__device__ __forceinline__ float row_scale(const AppendArgs<T, C>& a, const AppendRow& r) {
  if constexpr (kIsFp8<C>) {
    const float* scale = r.kind == RowKind::kKey ? a.k_scale : r.kind == RowKind::kValue ? a.v_scale : nullptr;
    if (scale != nullptr) return scale[a.scale_per_head ? r.head : 0];
  }
  return 1.0f;
}

// The context of row `r` whose token's table row is at `table`, whose slot to write is `slot` (-1:
// none, -2: its position is out of range) and whose cache scale is `scale` (row_scale): false when the
// token writes nothing.
template <typename T, typename C>
__device__ __forceinline__ bool row_context(const AppendArgs<T, C>& a, const AppendRow& r, const unsigned char* table,
                                            int64_t slot, float scale, AppendRowContext<T, C>& ctx) {
  ctx.r = r;
  if (slot == -2) return false;
  ctx.table = table;
  ctx.cache_row = nullptr;
  ctx.scale = scale;
  if (r.kind != RowKind::kQuery && slot >= 0) {
    uint64_t offset = 0;
    const uint64_t page = a.div_page.divmod(static_cast<uint64_t>(slot), offset);
    const PagedCache<C>& cache = r.kind == RowKind::kKey ? a.k_cache : a.v_cache;
    ctx.cache_row = cache.row(static_cast<int64_t>(page), static_cast<int64_t>(offset), r.head);
  }
  ctx.norm = r.kind == RowKind::kQuery ? a.q_norm : r.kind == RowKind::kKey ? a.k_norm : nullptr;
  ctx.inv_rms = 1.0f;
  return true;
}

// The same for row `r` of tile `tl`, from the tile's staged state.
template <typename T, typename C>
__device__ __forceinline__ bool row_context(const AppendArgs<T, C>& a, const AppendTile& tl, const AppendRow& r,
                                            AppendRowContext<T, C>& ctx) {
  return row_context(a, r, tl.table + int64_t{r.local} * a.table_row_bytes, tl.slot[r.local], row_scale(a, r), ctx);
}

template <typename T, typename C>
__device__ __forceinline__ float row_inv_rms(const AppendArgs<T, C>& a, float square_sum) {
  return rsqrtf(square_sum / static_cast<float>(a.head_dim) + a.norm_eps);
}

// K consecutive elements of E at p (aligned to their size, a power of two of bytes), in fp32: one access
// of up to 16 bytes, or two.
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

// A unit's angles from its token's staged table row (cos at `cs`, sin at `sn`), as load_cached_angles
// gives them, in whole accesses: the pairs span the chunks (N angles from pair_lo), or each chunk holds
// N / 2 pairs (N / 2 angles from pair_lo and from pair_hi).
template <int N, typename E>
__device__ __forceinline__ void load_staged_angles(const E* cs, const E* sn, const UnitPlace& pl, RopeChunk<N>& c,
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

// Normalizes (when asked), rotates and rounds one unit of a q or k row; v rows come out as loaded.
template <typename T, typename C, int N>
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
    if (a.table_f32) {
      const float* cs = reinterpret_cast<const float*>(ctx.table);
      load_staged_angles<N>(cs, cs + a.rotary_dim / 2, pl, c, s);
    } else {
      const T* cs = reinterpret_cast<const T*>(ctx.table);
      load_staged_angles<N>(cs, cs + a.rotary_dim / 2, pl, c, s);
    }
    f = pl.cross ? rope_forward(f, c, s) : rope_forward_interleaved(f, c, s);
  }
  x.lo = Vec<T, N>::from_float(f.lo);
  x.hi = Vec<T, N>::from_float(f.hi);
}

// Stores a finished unit wherever its row goes.
template <typename T, typename C, int N>
__device__ __forceinline__ void store_unit(const AppendArgs<T, C>& a, const AppendRowContext<T, C>& ctx,
                                           const UnitPlace& pl, const UnitChunks<T, N>& x) {
  auto store_pair = [&](T* row) {
    store_vec(row + pl.lo, x.lo);
    store_vec(row + pl.hi, x.hi);
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
    store_cache_chunk<T, C, N>(ctx.cache_row + pl.lo, x.lo, ctx.scale);
    store_cache_chunk<T, C, N>(ctx.cache_row + pl.hi, x.hi, ctx.scale);
  }
}

// Finishes and stores a row from the unit lane holds (every lane of the row's group: the norm's sum is a
// group shuffle).
template <typename T, typename C, int N>
__device__ __forceinline__ void finish_row(const AppendArgs<T, C>& a, AppendRowContext<T, C>& ctx, const UnitPlace& pl,
                                           bool active, UnitChunks<T, N>& x) {
  if (ctx.norm != nullptr) ctx.inv_rms = row_inv_rms(a, group_sum(active ? unit_square_sum(x) : 0.0f, a.lanes));
  if (active) {
    finish_unit<T, C, N>(a, ctx, pl, x);
    store_unit<T, C, N>(a, ctx, pl, x);
  }
}

// The same for row r of tile `tl`.
template <typename T, typename C, int N>
__device__ __forceinline__ void finish_row(const AppendArgs<T, C>& a, const AppendTile& tl, int r, const UnitPlace& pl,
                                           bool active, UnitChunks<T, N>& x) {
  AppendRowContext<T, C> ctx;
  if (row_context(a, tl, append_row(a, tl, r), ctx)) finish_row<T, C, N>(a, ctx, pl, active, x);
}

//! The append. N: elements a chunk (16 bytes, or 1 when a row or stride is not aligned). A block takes
//! tiles (a.tile_tokens consecutive tokens, or a one-token tile's share of a.row_splits) in turn and
//! stages each (stage_tile); its groups of a.lanes lanes then take the tile's rows. kSingle: a lane holds one unit of
//! its row (units <= lanes), a group kAppendRowsInFlight rows in each of two buffers, the next rows loading while the
//! current ones are finished (the first ones before the tile is staged); else each lane loops over the units of its row
//! (the norm then reads the row twice).
template <typename T, typename C, int N, bool kSingle>
__global__ void __launch_bounds__(kAppendBlockThreads, kAppendBlocksPerSm) append_kernel(const AppendArgs<T, C> a) {
  extern __shared__ __align__(16) unsigned char shared[];
  const AppendShared at = append_shared_layout(a.tile_tokens, a.hash_slots, a.table_row_bytes);
  const int lanes = a.lanes;
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int groups = static_cast<int>(blockDim.x) / lanes;
  const int group = static_cast<int>(threadIdx.x) / lanes;
  const int per_token = static_cast<int>(a.div_rows.divisor);
  for (int64_t tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {
    const int64_t tokens_tile = tile / a.row_splits;
    const int64_t first = tokens_tile * a.tile_tokens;
    const int64_t left = a.tokens - first;
    const AppendTile tl = append_tile(shared, at, first, static_cast<int>(left < a.tile_tokens ? left : a.tile_tokens));
    // This block's rows of the tile: [begin, rows).
    const int begin = static_cast<int>(tile - tokens_tile * a.row_splits) * a.split_rows;
    const int rows = tl.count * per_token < begin + a.split_rows ? tl.count * per_token : begin + a.split_rows;
    if constexpr (append_has_rings<T>(N, kSingle)) {
      // A ring of kStages rows a group in shared memory, each lane's two chunks at [stage][half][thread]
      // (16-byte accesses of consecutive threads: no bank conflicts); a lane reads back only what it
      // copied, so its own waits order the ring and no barrier is needed.
      constexpr int kStages = kAppendRowStages;
      const bool active = lane < a.units;
      const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, lane);
      const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
      uint4* const ring = reinterpret_cast<uint4*>(shared + append_ring_offset(at.bytes)) + tid;
      auto issue = [&](int r, int stage) {
        if (r < rows && active) {
          const T* src = row_source(a, append_row(a, tl, r));
          copy_to_shared_async(ring + (2 * stage) * threads, src + pl.lo, 16);
          copy_to_shared_async(ring + (2 * stage + 1) * threads, src + pl.hi, 16);
        }
        commit_shared_copies();  // one group a row, empty past the end, so that the waits count rows
      };
      const int r0 = begin + group;
#pragma unroll
      for (int k = 0; k < kStages - 1; ++k) issue(r0 + k * groups, k);
      stage_tile(a, tl);  // (waits for every copy so far: the first rows too)
      int stage = 0;
      for (int r = r0; r < rows; r += groups) {
        issue(r + (kStages - 1) * groups, stage == 0 ? kStages - 1 : stage - 1);
        wait_shared_copies_but<kStages - 1>();
        UnitChunks<T, N> x;
        if (active) {
          const uint4 lo = ring[(2 * stage) * threads], hi = ring[(2 * stage + 1) * threads];
          memcpy(&x.lo, &lo, 16);
          memcpy(&x.hi, &hi, 16);
        }
        finish_row<T, C, N>(a, tl, r, pl, active, x);
        stage = stage + 1 == kStages ? 0 : stage + 1;
      }
    } else if constexpr (kSingle) {
      constexpr int kRows = kAppendRowsInFlight;
      const bool active = lane < a.units;
      const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, lane);
      UnitChunks<T, N> x[kRows], next[kRows];
      // Buffer rows: r0 + k groups, k < kRows (the block's groups cover consecutive rows at each k).
      auto load_rows = [&](int r0, UnitChunks<T, N>(&buf)[kRows]) {
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          const int r = r0 + k * groups;
          if (r < rows && active) buf[k] = load_chunks<T, N>(row_source(a, append_row(a, tl, r)), pl);
        }
      };
      load_rows(begin + group, x);
      stage_tile(a, tl);
      for (int r0 = begin + group; r0 < rows; r0 += kRows * groups) {
        const int n0 = r0 + kRows * groups;
        if (n0 < rows) load_rows(n0, next);
#pragma unroll
        for (int k = 0; k < kRows; ++k)
          if (r0 + k * groups < rows) finish_row<T, C, N>(a, tl, r0 + k * groups, pl, active, x[k]);
#pragma unroll
        for (int k = 0; k < kRows; ++k) x[k] = next[k];
      }
    } else {
      stage_tile(a, tl);
      for (int r = begin + group; r < rows; r += groups) {
        AppendRowContext<T, C> ctx;
        const AppendRow row = append_row(a, tl, r);
        if (!row_context(a, tl, row, ctx)) continue;
        const T* src = row_source(a, row);
        if (ctx.norm != nullptr) {
          float sum = 0.0f;
          for (int u = lane; u < a.units; u += lanes)
            sum += unit_square_sum(
                load_chunks<T, N>(src, unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, u)));
          ctx.inv_rms = row_inv_rms(a, group_sum(sum, lanes));
        }
        for (int u = lane; u < a.units; u += lanes) {
          const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, u);
          UnitChunks<T, N> y = load_chunks<T, N>(src, pl);
          finish_unit<T, C, N>(a, ctx, pl, y);
          store_unit<T, C, N>(a, ctx, pl, y);
        }
      }
    }
    __syncthreads();  // the tile's staged state is read by every group before the next tile replaces it
  }
}

}  // namespace kvrope::detail
