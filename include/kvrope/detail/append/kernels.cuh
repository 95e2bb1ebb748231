// The append's two kernels (docs/design.md, "The serving forward"): each deals tokens' rows to groups of
// lanes that run a TokenWalk (rows.cuh); they differ in how a token learns its position and whether its
// slot is its own to write.
#pragma once

#include <cstdint>

#include "../../error_flag.cuh"
#include "args.cuh"
#include "policy.cuh"
#include "rows.cuh"
#include "slots.cuh"
#include "tile.cuh"

namespace kvrope::detail {

//! The few-token path: group i of the grid takes token i / g.slices, slice i % g.slices; a warp's groups
//! share a token (g.slices is a multiple of the groups a warp), so a warp scans the later slots for its
//! token's slot when its rows include a k or v row. Nothing staged, no barrier.
template <typename T, typename C, int N, bool kSingle>
__global__ void __launch_bounds__(kAppendTokenBlockThreads) append_token_kernel(const AppendArgs<T, C> a,
                                                                                const AppendGeometry g) {
  const int lane = static_cast<int>(threadIdx.x) & (g.lanes - 1);
  const uint32_t group = (blockIdx.x * kAppendTokenBlockThreads + threadIdx.x) / g.lanes;
  const uint32_t token32 = g.div_slices.div32(group);
  const int64_t token = token32;
  if (token >= a.tokens) return;  // (whole warps)
  const int slice = static_cast<int>(group - token32 * g.div_slices.divisor);
  TokenWalk<T, C, N, kSingle, kAppendTokenRowsPerGroup> walk;
  walk.begin(a, g, token, slice, lane);  // first: the row loads need nothing loaded
  const int64_t p = append_position(a, token);
  int64_t slot = a.heads > 0 ? a.slots[token] : -1;
  const bool in_range = slot >= 0 && slot < a.num_slots;
  // The group's first k or v row, if any: j >= Hq with j = slice (mod slices).
  const int q = static_cast<int>(a.q_heads);
  const int first_kv = slice >= q ? slice : slice + (q - slice + g.slices - 1) / g.slices * g.slices;
  if (in_range && __any_sync(0xffffffffu, first_kv < g.per_token) && later_names_slot(a, token, slot)) slot = -1;
  if (slice == 0 && lane == 0 && a.error_flag != nullptr) {
    if (p < 0)
      atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
    else if (slot >= a.num_slots)
      atomicOr(a.error_flag, kErrorSlotOutOfRange);
  }
  walk.run(a, g, p, in_range ? slot : -1);
}

//! The tile path: a block takes tiles of g.tile_tokens consecutive tokens in turn and stages each
//! (stage_tile); its groups then take the tile's (token, slice) items, g.slices a token. A group's first
//! rows of a tile load while the tile is staged.
template <typename T, typename C, int N, bool kSingle>
__global__ void __launch_bounds__(kAppendBlockThreads, kAppendBlocksPerSm) append_tile_kernel(const AppendArgs<T, C> a,
                                                                                             const AppendGeometry g) {
  extern __shared__ __align__(16) unsigned char shared[];
  const int lane = static_cast<int>(threadIdx.x) & (g.lanes - 1);
  const int groups = kAppendBlockThreads / g.lanes;
  const int group = static_cast<int>(threadIdx.x) / g.lanes;
  for (int64_t tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const int64_t first = tile * g.tile_tokens;
    const int64_t left = a.tokens - first;
    const AppendTile tl = append_tile(shared, g, first, static_cast<int>(left < g.tile_tokens ? left : g.tile_tokens));
    const int items = tl.count * g.slices;
    TokenWalk<T, C, N, kSingle, kAppendRowsInFlight> walk;
    if (group < items) walk.begin(a, g, first + group / g.slices, group % g.slices, lane);
    stage_tile(a, tl);
    for (int item = group; item < items; item += groups) {
      const int i = item / g.slices;
      if (item != group) walk.begin(a, g, first + i, item % g.slices, lane);
      walk.run(a, g, tl.position[i], tl.slot[i]);
    }
    __syncthreads();  // every group has read the tile's staged state before the next tile replaces it
  }
}

}  // namespace kvrope::detail
