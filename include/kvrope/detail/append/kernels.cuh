// The append's two kernels (docs/design.md, "The serving forward"): the few-token kernel, a warp a few
// rows of one token with nothing staged; the tile kernel, a block a tile of consecutive tokens staged in
// shared memory, its rows loaded through cp.async rings.
#pragma once

#include <cstdint>

#include "../../error_flag.cuh"
#include "../common/async_copy.cuh"
#include "../common/dependent_launch.cuh"
#include "args.cuh"
#include "policy.cuh"
#include "rows.cuh"
#include "slots.cuh"
#include "tile.cuh"

namespace kvrope::detail {

//! The few-token path (vector chunks, a lane one unit): g.token_warps warps a token, rows
//! j = w (32 / lanes) + lane / lanes of its warp w. Nothing staged and no barrier, so a row's longest
//! chain is its position, then its table row, then its stores. A warp with a k or v row scans the later
//! tokens' slots for its token's (the last writer wins). kQ8: the instance can write q in fp8. kMrope: the
//! instance for positions [3, T] (mRoPE): a row's chain loads its token's three positions and each pair's
//! angle from its stream's table row (the ordinary instances keep their registers: performance log #52).
template <typename T, typename C, int N, bool kQ8, bool kMrope>
__global__ void __launch_bounds__(kAppendTokenBlockThreads)
    append_token_kernel(const AppendArgs<T, C> a, const AppendGeometry g) {
  wait_for_prior_grids();  // (enable_pdl: the kernel before may still be writing q, k, v)
  allow_dependent_grids();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const uint32_t warp = blockIdx.x * (kAppendTokenBlockThreads / 32) + threadIdx.x / 32;
  const int64_t token = g.div_token_warps.div32(warp);
  if (token >= a.tokens) return;  // (the whole warp)
  // The chain's heads first: the position (then the table row), the slot and the later slots (the scan).
  const RawIndex raw_position = load_raw_index(a.positions, a.positions_are_int64, token);
  RawIndex raw_streams[2];  // mRoPE: the token's second and third positions
  if constexpr (kMrope) {
#pragma unroll
    for (int k = 0; k < 2; ++k)
      raw_streams[k] = load_raw_index(a.positions, a.positions_are_int64, token + (k + 1) * a.position_stream_stride);
  }
  int64_t slot = a.heads > 0 ? a.slots[token] : -1;
  const int rows_per_warp = 32 / g.lanes;
  const int first = static_cast<int>(warp - static_cast<uint32_t>(token) * g.div_token_warps.divisor) * rows_per_warp;
  const int per_token = static_cast<int>(g.div_rows.divisor);
  // A warp with a k or v row scans the later tokens' slots: its first round in flight beside the position.
  const bool scans = a.heads > 0 && first + rows_per_warp > a.q_heads && first < per_token;  // (warp-uniform)
  LaterSlots later{};
  if (scans) later = first_later_slots(a, token);
  const int j = first + lane / g.lanes;
  const int unit = lane & (g.lanes - 1);
  const bool row_ok = j < per_token, active = row_ok && unit < g.units;
  const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, g.rotary_units, unit);
  const int unit_stream = kMrope ? mrope_unit_stream<N>(a.mrope, pl) : 0;  // (off the chain: no position needed)
  const AppendRow r = token_row(a, token, 0, j);
  UnitChunks<T, N> x;
  if (active) x = load_chunks<T, N>(row_source(a, r), pl);  // nothing it needs is loaded
  const CallScales scales = call_scales<kQ8>(a);            // in flight beside the position, off its chain
  int64_t p = checked_position(a, index_value(raw_position, a.positions_are_int64));
  int64_t stream_p[2] = {0, 0};
  if constexpr (kMrope) {
#pragma unroll
    for (int k = 0; k < 2; ++k) stream_p[k] = checked_position(a, index_value(raw_streams[k], a.positions_are_int64));
    if (stream_p[0] < 0 || stream_p[1] < 0) p = -1;
  }
  const bool in_range = slot >= 0 && slot < a.num_slots;
  if (scans && in_range && later_names_slot<kMrope>(a, token, slot, later)) slot = -1;  // (not this token's to write)
  if (first == 0 && lane == 0 && a.error_flag != nullptr) {
    if (p < 0)
      atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
    else if (slot >= a.num_slots)
      atomicOr(a.error_flag, kErrorSlotOutOfRange);
  }
  if (!row_ok) return;  // (whole groups)
  AppendRowContext<T, C> ctx;
  const unsigned char* table = static_cast<const unsigned char*>(a.table);
  // mRoPE: a unit of one stream reads that stream's row as an ordinary unit reads its token's.
  const int64_t unit_p = unit_stream == 1 ? stream_p[0] : unit_stream == 2 ? stream_p[1] : p;
  if (row_context(a, r, table + unit_p * append_table_bytes(a), p < 0 ? -2 : in_range ? slot : -1, scales, ctx)) {
    if constexpr (kMrope) {
      ctx.mixed_streams = unit_stream < 0;
#pragma unroll
      for (int k = 0; k < 2; ++k) ctx.stream_table[k] = table + stream_p[k] * append_table_bytes(a);
    }
    finish_row<T, C, N, kQ8, kMrope>(a, g.lanes, ctx, pl, active, x);
  }
}

//! The tile path. A block takes tiles (g.tile_tokens consecutive tokens, or a one-token tile's share of
//! g.row_splits) in turn and stages each (stage_tile); its groups of g.lanes lanes then take the tile's
//! rows. kRings (vector chunks of 16 bytes, a lane one unit): a ring of kAppendRowStages rows a group in
//! shared memory, filled by cp.async, the next rows loading while the current one is finished (the first
//! ones while the tile is staged). Else each lane loops over the units of its row (the norm then reads
//! the row twice). kQ8: the instance can write q in fp8 (query_out_fp8).
template <typename T, typename C, int N, bool kRings, bool kQ8>
__global__ void __launch_bounds__(kAppendBlockThreads, kAppendBlocksPerSm)
    append_tile_kernel(const AppendArgs<T, C> a, const AppendGeometry g) {
  extern __shared__ __align__(16) unsigned char shared[];
  wait_for_prior_grids();  // (enable_pdl: the kernel before may still be writing q, k, v)
  allow_dependent_grids();
  const TileLayout at = tile_layout(g.tile_tokens, g.hash_slots, g.table_row_bytes);
  const int lanes = g.lanes;
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int groups = static_cast<int>(blockDim.x) / lanes;
  const int group = static_cast<int>(threadIdx.x) / lanes;
  const int per_token = static_cast<int>(g.div_rows.divisor);
  const CallScales scales = call_scales<kQ8>(a);
  for (int64_t tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const int64_t tokens_tile = tile / g.row_splits;
    const int64_t first = tokens_tile * g.tile_tokens;
    const int64_t left = a.tokens - first;
    const AppendTile tl =
        append_tile(shared, at, g.hash_slots, first, static_cast<int>(left < g.tile_tokens ? left : g.tile_tokens));
    // This block's rows of the tile: [begin, rows).
    const int begin = static_cast<int>(tile - tokens_tile * g.row_splits) * g.split_rows;
    const int rows = tl.count * per_token < begin + g.split_rows ? tl.count * per_token : begin + g.split_rows;
    if constexpr (kRings) {
      // Each lane's two chunks at [stage][half][thread] (16-byte accesses of consecutive threads: no bank
      // conflicts); a lane reads back only what it copied, so its own waits order the ring and no barrier
      // is needed.
      constexpr int kStages = kAppendRowStages;
      const bool active = lane < g.units;
      const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, g.rotary_units, lane);
      const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
      uint4* const ring = reinterpret_cast<uint4*>(shared + ring_offset(at.bytes)) + tid;
      auto issue = [&](int r, int stage) {
        if (r < rows && active) {
          const T* src = row_source(a, tile_row(a, g, tl, r));
          copy_async(ring + (2 * stage) * threads, src + pl.lo, 16);
          copy_async(ring + (2 * stage + 1) * threads, src + pl.hi, 16);
        }
        commit_async_copies();  // one group a row, empty past the end, so that the waits count rows
      };
      const int r0 = begin + group;
#pragma unroll
      for (int k = 0; k < kStages - 1; ++k) issue(r0 + k * groups, k);
      stage_tile(a, g, tl);  // (waits for every copy so far: the first rows too)
      int stage = 0;
      for (int r = r0; r < rows; r += groups) {
        issue(r + (kStages - 1) * groups, stage == 0 ? kStages - 1 : stage - 1);
        wait_async_copies<kStages - 1>();
        UnitChunks<T, N> x;
        if (active) {
          const uint4 lo = ring[(2 * stage) * threads], hi = ring[(2 * stage + 1) * threads];
          memcpy(&x.lo, &lo, 16);
          memcpy(&x.hi, &hi, 16);
        }
        AppendRowContext<T, C> ctx;
        if (row_context(a, g, tl, tile_row(a, g, tl, r), scales, ctx))
          finish_row<T, C, N, kQ8>(a, lanes, ctx, pl, active, x);
        stage = stage + 1 == kStages ? 0 : stage + 1;
      }
    } else {
      stage_tile(a, g, tl);
      for (int r = begin + group; r < rows; r += groups) {
        AppendRowContext<T, C> ctx;
        const AppendRow row = tile_row(a, g, tl, r);
        if (!row_context(a, g, tl, row, scales, ctx)) continue;
        const T* src = row_source(a, row);
        if (ctx.norm != nullptr) {
          float sum = 0.0f;
          for (int u = lane; u < g.units; u += lanes)
            sum += unit_square_sum(
                load_chunks<T, N>(src, unit_place<N>(a.style, a.rotary_dim, a.head_dim, g.rotary_units, u)));
          ctx.inv_rms = row_inv_rms(a, group_sum(sum, lanes));
        }
        for (int u = lane; u < g.units; u += lanes) {
          const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, g.rotary_units, u);
          UnitChunks<T, N> y = load_chunks<T, N>(src, pl);
          finish_unit<T, C, N>(a, ctx, pl, y);
          store_row_unit<T, C, N, kQ8>(a, ctx, pl, y);
        }
      }
    }
    __syncthreads();  // the tile's staged state is read by every group before the next tile replaces it
  }
}

}  // namespace kvrope::detail
