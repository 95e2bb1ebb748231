// The MLA append's kernel (docs/design.md, "The MLA append"): a warp a token's latent row, and warps of its query
// rows, q_lanes lanes a row. Built from the append's pieces: units of rotated rows (common/rotary_units.cuh), the
// rotation (rope.cuh), the one store path of T and fp8 rows (append/formats.cuh), the last-writer scan of slots
// (append/slots.cuh), the error flag's bits.
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

//! The latent row of `token` (a whole warp): the error flag's bits, then, when the token's position is valid and
//! its slot in range and not named by a later valid token, kv_c copied (quantized) to its latent row and
//! RoPE(k_pe) to its rope row. A lane's first kv_c chunks (all of them with L compiled in) and its first k_pe
//! unit, rotated, are loaded before the scan of later slots, which then hides their latency; only the stores wait
//! for it.
template <typename T, typename C, int N, int kL, int kR>
__device__ __forceinline__ void mla_latent_row(const MlaArgs<T, C>& a, const MlaGeometry& g, int64_t token,
                                               int64_t position, int64_t slot) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (lane == 0 && a.error_flag != nullptr) {
    if (position < 0)
      atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
    else if (slot >= a.num_slots)
      atomicOr(a.error_flag, kErrorSlotOutOfRange);
  }
  if (position < 0 || slot < 0 || slot >= a.num_slots) return;  // (the whole warp)
  const int R = kR ? kR : static_cast<int>(a.rotary_dim);
  const int rot_units = kR ? kR / (2 * N) : g.rot_units;
  const int latent_chunks = kL ? kL / N : g.latent_chunks;
  constexpr int kEarly = kL ? (kL / N + 31) / 32 : 1;  // kv_c chunks a lane loads before the scan
  const T* kv_c = a.kv_c + token * a.kv_c_stride;
  Vec<T, N> early[kEarly];
#pragma unroll
  for (int i = 0; i < kEarly; ++i)
    if (lane + 32 * i < latent_chunks) early[i] = load_vec<cub::LOAD_CS, T, N>(kv_c + (lane + 32 * i) * N);
  const unsigned char* table = static_cast<const unsigned char*>(a.table) + position * mla_table_bytes(a);
  const T* k_pe = a.k_pe + token * a.k_pe_stride;
  const UnitPlace pl = unit_place<N>(a.style, R, R, rot_units, lane);
  UnitChunks<T, N> x;
  if (lane < rot_units) {
    x = load_chunks<T, N>(k_pe, pl);
    mla_rotate_unit<T, C, N>(a, table, R, pl, x);
  }
  StoreScale scale;
  if constexpr (kIsFp8<C>) {
    if (a.kv_scale != nullptr) scale = store_scale(*a.kv_scale);
  }
  const auto valid = [&](int64_t u) {
    return mla_position(a, load_raw_index(a.positions, a.positions_are_int64, u)) >= 0;
  };
  if (later_names_slot(a.slots, a.tokens, token, slot, valid)) return;
  uint64_t offset = 0;
  const auto page = static_cast<int64_t>(a.div_page.divmod(static_cast<uint64_t>(slot), offset));
  C* const latent = a.latent.row(page, static_cast<int64_t>(offset));
  C* const rope = a.rope.row(page, static_cast<int64_t>(offset));
#pragma unroll
  for (int i = 0; i < kEarly; ++i)
    if (lane + 32 * i < latent_chunks) store_chunk<C>(latent + (lane + 32 * i) * N, early[i], scale);
  if (lane < rot_units) store_unit(rope, pl, x, scale);
  // The rest (generic L and R: kv_c past the first 32 chunks, k_pe past the first 32 units).
  for (int u = lane + 32 * kEarly; u < latent_chunks; u += 32)
    store_chunk<C>(latent + u * N, load_vec<cub::LOAD_CS, T, N>(kv_c + u * N), scale);
  for (int u = lane + 32; u < rot_units; u += 32) {
    const UnitPlace more = unit_place<N>(a.style, R, R, rot_units, u);
    UnitChunks<T, N> y = load_chunks<T, N>(k_pe, more);
    mla_rotate_unit<T, C, N>(a, table, R, more, y);
    store_unit(rope, more, y, scale);
  }
}

//! Query row j of `token` (valid position), q_lanes lanes: RoPE(q_pe) to its place, q_nope copied if asked.
template <typename T, typename C, int N, int kR>
__device__ __forceinline__ void mla_query_row(const MlaArgs<T, C>& a, const MlaGeometry& g, int64_t token,
                                              int64_t position, int j, int lane) {
  const int R = kR ? kR : static_cast<int>(a.rotary_dim);
  const int rot_units = kR ? kR / (2 * N) : g.rot_units;
  const int lanes = g.q_lanes;
  const bool fp8 = a.q_rot8.data != nullptr;
  StoreScale scale;
  if (fp8 && a.q_scale != nullptr) scale = store_scale(*a.q_scale);
  const unsigned char* table = static_cast<const unsigned char*>(a.table) + position * mla_table_bytes(a);
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
  if (g.nope_chunks == 0) return;
  const T* q_nope = a.q_nope.row(token, j);
  for (int u = lane; u < g.nope_chunks; u += lanes) {
    const Vec<T, N> x = load_vec<cub::LOAD_CS, T, N>(q_nope + u * N);
    if (fp8)
      store_chunk<__nv_fp8_e4m3>(a.q_copy8.row(token, j) + u * N, x, scale);
    else
      store_chunk<T>(a.q_copy.row(token, j) + u * N, x, StoreScale{});
  }
}

//! The MLA append: g.token_warps warps a token (plan.cuh). Warp 0 of a token takes its latent row (and the error
//! flag), warp w > 0 query rows [(w - 1) 32 / q_lanes, w 32 / q_lanes). Each warp reads its token's position
//! once; the latent warp its slot. N: elements a chunk (16 bytes of T, or 1); kL, kR: L and R compiled in (0:
//! read at run time).
template <typename T, typename C, int N, int kL, int kR>
__global__ void __launch_bounds__(kMlaBlockThreads) mla_append_kernel(const MlaArgs<T, C> a, const MlaGeometry g) {
  wait_for_prior_grids();  // (enable_pdl: the kernel before may still be writing q, kv_c, k_pe)
  allow_dependent_grids();
  const uint32_t warp = blockIdx.x * (kMlaBlockThreads / 32) + threadIdx.x / 32;
  const int64_t token = g.div_token_warps.div32(warp);
  if (token >= a.tokens) return;  // (the whole warp)
  const int sub = static_cast<int>(warp - static_cast<uint32_t>(token) * g.div_token_warps.divisor);
  const RawIndex raw = load_raw_index(a.positions, a.positions_are_int64, token);
  if (sub == 0) {
    const int64_t slot = a.slots[token];
    mla_latent_row<T, C, N, kL, kR>(a, g, token, mla_position(a, raw), slot);
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int j = (sub - 1) * (32 / g.q_lanes) + lane / g.q_lanes;
  const int64_t position = mla_position(a, raw);
  if (position < 0 || j >= a.q_heads) return;
  mla_query_row<T, C, N, kR>(a, g, token, position, j, lane & (g.q_lanes - 1));
}

}  // namespace kvrope::detail
