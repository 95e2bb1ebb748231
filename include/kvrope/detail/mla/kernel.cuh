// The MLA append's kernel (docs/design.md, "Formats"), three roles by block: latent tiles (a tile's slots staged
// and scanned once, a warp a latent row), query rows (q_lanes lanes a row), q_nope's copy. Built from the append's
// pieces: units of rotated rows (common/rotary_units.cuh), the rotation (rope.cuh), the one store path of T and
// fp8 rows (append/formats.cuh), the slot table and the scan of later slots (append/slots.cuh), the error flag.
#pragma once

#include <cstdint>

#include "../../core/vec.cuh"
#include "../../error_flag.cuh"
#include "../../rope.cuh"
#include "../append/formats.cuh"
#include "../append/rows.cuh"  // load_chunks
#include "../append/slots.cuh"
#include "../common/dependent_launch.cuh"
#include "../common/position.cuh"
#include "../common/rotary_units.cuh"
#include "args.cuh"

namespace kvrope::detail {

//! Token u's position, or -1 when it is outside [0, max_position).
template <typename T, typename C>
__device__ __forceinline__ int64_t mla_position(const MlaArgs<T, C>& a, const RawIndex& raw) {
  const int64_t p = index_value(raw, a.positions_are_int64);
  return p >= 0 && p < a.max_position ? p : -1;
}

//! The table row of position p (in range).
template <typename T, typename C>
__device__ __forceinline__ const unsigned char* mla_table_row(const MlaArgs<T, C>& a, int64_t p) {
  return static_cast<const unsigned char*>(a.table) + p * mla_table_bytes(a);
}

//! Rotates one unit of a rotated row (q_pe or k_pe: R elements, all rotated) with the angles of its token's
//! table row `table`, and rounds it to T.
template <typename T, typename C, int N>
__device__ __forceinline__ void mla_rotate_unit(const MlaArgs<T, C>& a, const unsigned char* table, int rotary_dim,
                                                const UnitPlace& pl, UnitChunks<T, N>& x) {
  RopeChunk<N> f, c, s;
  x.lo.to_float(f.lo);
  x.hi.to_float(f.hi);
  if (a.table_f32) {
    const float* cs = reinterpret_cast<const float*>(table);
    load_staged_angles<N>(cs, cs + rotary_dim / 2, pl, c, s);
  } else {
    const T* cs = reinterpret_cast<const T*>(table);
    load_staged_angles<N>(cs, cs + rotary_dim / 2, pl, c, s);
  }
  f = pl.cross ? rope_forward(f, c, s) : rope_forward_interleaved(f, c, s);
  x.lo = Vec<T, N>::from_float(f.lo);
  x.hi = Vec<T, N>::from_float(f.hi);
}

//! A latent row in registers (a warp a row): its token's position (-1: out of range), each lane's first kv_c
//! chunks (all of them with L compiled in) and its first k_pe unit, rotated.
template <typename T, int N, int kL>
struct MlaLatentRow {
  static constexpr int kEarly = kL ? (kL / N + 31) / 32 : 1;
  int64_t position;
  Vec<T, N> early[kEarly];
  UnitChunks<T, N> x;
};

//! Loads the latent row of `token` (a whole warp): what MlaLatentRow holds, so that the stores wait for nothing.
template <typename T, typename C, int N, int kL, int kR>
__device__ __forceinline__ void mla_latent_load(const MlaArgs<T, C>& a, const MlaGeometry& g, int64_t token,
                                                MlaLatentRow<T, N, kL>& r) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int R = kR ? kR : static_cast<int>(a.rotary_dim);
  const int rot_units = kR ? kR / (2 * N) : g.rot_units;
  const int latent_chunks = kL ? kL / N : g.latent_chunks;
  constexpr int kEarly = MlaLatentRow<T, N, kL>::kEarly;
  r.position = mla_position(a, load_raw_index(a.positions, a.positions_are_int64, token));
  const T* kv_c = a.kv_c + token * a.kv_c_stride;
#pragma unroll
  for (int i = 0; i < kEarly; ++i)
    if (lane + 32 * i < latent_chunks) r.early[i] = load_vec<cub::LOAD_CS, T, N>(kv_c + (lane + 32 * i) * N);
  if (r.position >= 0 && lane < rot_units) {
    const UnitPlace pl = unit_place<N>(a.style, R, R, rot_units, lane);
    r.x = load_chunks<T, N>(a.k_pe + token * a.k_pe_stride, pl);
    mla_rotate_unit<T, C, N>(a, mla_table_row(a, r.position), R, pl, r.x);
  }
}

//! Writes the latent row of `token`, loaded in `r`, to cache row `slot` (a whole warp; -1: none): kv_c copied
//! (quantized with `scale`) to its latent row and RoPE(k_pe) to its rope row.
template <typename T, typename C, int N, int kL, int kR>
__device__ __forceinline__ void mla_latent_store(const MlaArgs<T, C>& a, const MlaGeometry& g, int64_t token,
                                                 const MlaLatentRow<T, N, kL>& r, int64_t slot,
                                                 const StoreScale& scale) {
  if (slot < 0) return;  // (the whole warp)
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int R = kR ? kR : static_cast<int>(a.rotary_dim);
  const int rot_units = kR ? kR / (2 * N) : g.rot_units;
  const int latent_chunks = kL ? kL / N : g.latent_chunks;
  constexpr int kEarly = MlaLatentRow<T, N, kL>::kEarly;
  uint64_t offset = 0;
  const auto page = static_cast<int64_t>(a.div_page.divmod(static_cast<uint64_t>(slot), offset));
  C* const latent = a.latent.row(page, static_cast<int64_t>(offset));
  C* const rope = a.rope.row(page, static_cast<int64_t>(offset));
#pragma unroll
  for (int i = 0; i < kEarly; ++i)
    if (lane + 32 * i < latent_chunks) store_chunk<C>(latent + (lane + 32 * i) * N, r.early[i], scale);
  if (lane < rot_units) store_unit(rope, unit_place<N>(a.style, R, R, rot_units, lane), r.x, scale);
  // The rest (generic L and R: kv_c past the first 32 chunks, k_pe past the first 32 units).
  const T* kv_c = a.kv_c + token * a.kv_c_stride;
  for (int u = lane + 32 * kEarly; u < latent_chunks; u += 32)
    store_chunk<C>(latent + u * N, load_vec<cub::LOAD_CS, T, N>(kv_c + u * N), scale);
  const T* k_pe = a.k_pe + token * a.k_pe_stride;
  for (int u = lane + 32; u < rot_units; u += 32) {
    const UnitPlace more = unit_place<N>(a.style, R, R, rot_units, u);
    UnitChunks<T, N> y = load_chunks<T, N>(k_pe, more);
    mla_rotate_unit<T, C, N>(a, mla_table_row(a, r.position), R, more, y);
    store_unit(rope, more, y, scale);
  }
}

//! A latent tile's staged state (static shared memory, for the largest tile): `slot[i]` the cache row token
//! first + i writes (-1: none), and the slot table (append/slots.cuh) of the tile's slots.
struct MlaTileState {
  int64_t slot[kMlaTileTokens];
  unsigned long long keys[kMlaHashSlots];
  int last[kMlaHashSlots];
  int later[kMlaHashSlots];
};

//! Stages the latent tile of `count` tokens from `first` (every thread of the block; it ends with a barrier):
//! each token's slot, kept only when the token is the last with its position in range to name it, in the tile
//! (the table's `last`) or after it (one scan of every later slot against the table). A bad position or slot
//! sets its bit of the error flag.
template <typename T, typename C>
__device__ __forceinline__ void stage_mla_tile(const MlaArgs<T, C>& a, int64_t first, int count, MlaTileState& s) {
  const int tid = static_cast<int>(threadIdx.x);
  const SlotTable st{s.keys, s.last, s.later, kMlaHashSlots};
  const auto valid = [&](int64_t u) {
    return mla_position(a, load_raw_index(a.positions, a.positions_are_int64, u)) >= 0;
  };
  for (int e = tid; e < kMlaHashSlots; e += kMlaBlockThreads) {
    s.keys[e] = kAppendNoSlot;
    s.last[e] = -1;
    s.later[e] = 0;
  }
  if (tid < count) {
    const int64_t t = first + tid;
    int64_t slot = a.slots[t];
    if (!valid(t)) {
      if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
      slot = -1;
    } else if (slot >= a.num_slots) {
      if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrorSlotOutOfRange);
      slot = -1;
    }
    s.slot[tid] = slot < 0 ? -1 : slot;
  }
  __syncthreads();
  // A tile of one token (decode) needs no table: its slot is compared with each later one.
  const bool one = count == 1;
  const int64_t own = s.slot[0];
  if (!one) {
    if (tid < count && s.slot[tid] >= 0) atomicMax(&s.last[st.insert(s.slot[tid])], tid);
    __syncthreads();
  }
  if (!one || own >= 0)
    for_later_slots(a.slots, a.tokens, first + count + tid, kMlaBlockThreads, [&](int64_t slot, int64_t u) {
      if (slot < 0 || slot >= a.num_slots) return;
      const int e = one ? (slot == own ? 0 : -1) : st.find(slot);
      if (e >= 0 && valid(u)) atomicOr(&s.later[e], 1);
    });
  __syncthreads();
  if (tid < count && s.slot[tid] >= 0) {
    const int e = one ? 0 : st.find(s.slot[tid]);
    if ((!one && s.last[e] != tid) || s.later[e] != 0) s.slot[tid] = -1;  // a later token writes the slot
  }
  __syncthreads();
}

//! The latent tile from `first` (a block): its warps' first rows and the cache's scale load while the tile is
//! staged (the scale loaded at the store was a round trip after the staging); then warp w writes the tile's
//! rows w, w + 4, ..., each next row loading before the current one is stored.
template <typename T, typename C, int N, int kL, int kR>
__device__ __forceinline__ void mla_latent_tile(const MlaArgs<T, C>& a, const MlaGeometry& g, int64_t first) {
  __shared__ MlaTileState s;
  constexpr int kWarps = kMlaBlockThreads / 32;
  const int64_t left = a.tokens - first;
  const int count = static_cast<int>(left < g.tile_tokens ? left : g.tile_tokens);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  MlaLatentRow<T, N, kL> r;
  if (warp < count) mla_latent_load<T, C, N, kL, kR>(a, g, first + warp, r);
  StoreScale scale;
  if constexpr (kIsFp8<C>) {
    if (a.kv_scale != nullptr) scale = store_scale(*a.kv_scale);
  }
  stage_mla_tile(a, first, count, s);
  for (int i = warp; i < count; i += kWarps) {
    MlaLatentRow<T, N, kL> next;
    if (i + kWarps < count) mla_latent_load<T, C, N, kL, kR>(a, g, first + i + kWarps, next);
    mla_latent_store<T, C, N, kL, kR>(a, g, first + i, r, s.slot[i], scale);
    r = next;
  }
}

//! Query row j of `token` (valid position), q_lanes lanes: RoPE(q_pe) to its place.
template <typename T, typename C, int N, int kR>
__device__ __forceinline__ void mla_query_row(const MlaArgs<T, C>& a, const MlaGeometry& g, int64_t token,
                                              int64_t position, int j, int lane) {
  const int R = kR ? kR : static_cast<int>(a.rotary_dim);
  const int rot_units = kR ? kR / (2 * N) : g.rot_units;
  const int lanes = g.q_lanes;
  const bool fp8 = a.q_rot8.data != nullptr;
  StoreScale scale;
  if (fp8 && a.q_scale != nullptr) scale = store_scale(*a.q_scale);
  const unsigned char* table = mla_table_row(a, position);
  const T* q_pe = a.q_pe.row(token, j);
  for (int u = lane; u < rot_units; u += lanes) {
    const UnitPlace pl = unit_place<N>(a.style, R, R, rot_units, u);
    UnitChunks<T, N> x = load_chunks<T, N>(q_pe, pl);
    mla_rotate_unit<T, C, N>(a, table, R, pl, x);
    if (fp8)
      store_unit(a.q_rot8.row(token, j), pl, x, scale);
    else
      store_unit(a.q_rot.row(token, j), pl, x, StoreScale{});
  }
}

//! Copy warp `warp`: q_nope's rows [g.copy_rows warp, g.copy_rows (warp + 1)) of the T Hq (row token Hq + head),
//! chunk c of each by lane c % 32, kMlaCopyRowLoads chunks a row a lane in flight. Only the rows of tokens with
//! their position in range are read and stored (in T, or fp8 with query_scale): the positions first, as the
//! query rows' chain waits for theirs before their table rows.
template <typename T, typename C, int N>
__device__ __forceinline__ void mla_copy_nope(const MlaArgs<T, C>& a, const MlaGeometry& g, uint32_t warp) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const uint32_t rows = static_cast<uint32_t>(a.tokens * a.q_heads);  // (< 2^32: validate)
  const bool fp8 = a.q_copy8.data != nullptr;
  uint32_t token[kMlaCopyRows], head[kMlaCopyRows];
  bool ok[kMlaCopyRows];
#pragma unroll
  for (int r = 0; r < kMlaCopyRows; ++r) {
    const uint32_t row = warp * g.copy_rows + r;
    token[r] = g.div_heads.div32(row);
    head[r] = row - token[r] * g.div_heads.divisor;
    ok[r] = r < g.copy_rows && row < rows &&
            mla_position(a, load_raw_index(a.positions, a.positions_are_int64, token[r])) >= 0;
  }
  StoreScale scale;
  if (fp8 && a.q_scale != nullptr) scale = store_scale(*a.q_scale);
  for (int c0 = lane; c0 < g.nope_chunks; c0 += 32 * kMlaCopyRowLoads) {
    Vec<T, N> x[kMlaCopyRows][kMlaCopyRowLoads];
#pragma unroll
    for (int r = 0; r < kMlaCopyRows; ++r)
#pragma unroll
      for (int k = 0; k < kMlaCopyRowLoads; ++k)
        if (ok[r] && c0 + 32 * k < g.nope_chunks)
          x[r][k] = load_vec<cub::LOAD_CS, T, N>(a.q_nope.row(token[r], head[r]) + (c0 + 32 * k) * N);
#pragma unroll
    for (int r = 0; r < kMlaCopyRows; ++r)
#pragma unroll
      for (int k = 0; k < kMlaCopyRowLoads; ++k) {
        const int c = c0 + 32 * k;
        if (!ok[r] || c >= g.nope_chunks) continue;
        if (fp8)
          store_chunk<__nv_fp8_e4m3>(a.q_copy8.row(token[r], head[r]) + c * N, x[r][k], scale);
        else
          store_chunk<T>(a.q_copy.row(token[r], head[r]) + c * N, x[r][k], StoreScale{});
      }
  }
}

//! The MLA append, three roles by block (plan.cuh): a latent tile each of the first g.latent_blocks; then query
//! rows, g.query_warps warps a token, each reading its token's position once; then q_nope's copy. N: elements
//! a chunk (16 bytes of T, or 1); kL, kR: L and R compiled in (0: read at run time).
template <typename T, typename C, int N, int kL, int kR>
__global__ void __launch_bounds__(kMlaBlockThreads, kMlaBlocksPerSm)
    mla_append_kernel(const MlaArgs<T, C> a, const MlaGeometry g) {
  wait_for_prior_grids();  // (enable_pdl: the kernel before may still be writing q, kv_c, k_pe)
  allow_dependent_grids();
  constexpr int kWarps = kMlaBlockThreads / 32;
  const int block = static_cast<int>(blockIdx.x);
  if (block < g.latent_blocks) {  // (the whole block)
    mla_latent_tile<T, C, N, kL, kR>(a, g, int64_t{block} * g.tile_tokens);
    return;
  }
  if (block >= g.latent_blocks + g.query_blocks) {  // (the whole block)
    const auto copy_block = static_cast<uint32_t>(block - g.latent_blocks - g.query_blocks);
    mla_copy_nope<T, C, N>(a, g, copy_block * kWarps + threadIdx.x / 32);
    return;
  }
  const uint32_t warp = static_cast<uint32_t>(block - g.latent_blocks) * kWarps + threadIdx.x / 32;
  const int64_t token = g.div_query_warps.div32(warp);
  if (token >= a.tokens) return;  // (the whole warp)
  const int sub = static_cast<int>(warp - static_cast<uint32_t>(token) * g.div_query_warps.divisor);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int j = sub * (32 / g.q_lanes) + lane / g.q_lanes;
  if (j >= a.q_heads) return;
  const int64_t position = mla_position(a, load_raw_index(a.positions, a.positions_are_int64, token));
  if (position < 0) return;
  mla_query_row<T, C, N, kR>(a, g, token, position, j, lane & (g.q_lanes - 1));
}

}  // namespace kvrope::detail
