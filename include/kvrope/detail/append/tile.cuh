// A tile of the tile path: consecutive tokens whose positions and slots a block stages in shared memory,
// each slot kept only by the last token that writes it.
#pragma once

#include <cstdint>

#include "../../error_flag.cuh"
#include "args.cuh"
#include "slots.cuh"

namespace kvrope::detail {

//! Where a tile's staged state lies in dynamic shared memory (byte offsets), and its size: each token's
//! slot and position, then the slot table (keys, last, later).
struct TileLayout {
  int slot, position, keys, last, later, bytes;
};

__host__ __device__ inline TileLayout tile_layout(int tile_tokens, int hash_slots) {
  TileLayout s{};
  s.slot = 0;
  s.position = tile_tokens * 8;
  s.keys = s.position + tile_tokens * 8;
  s.last = s.keys + hash_slots * 8;
  s.later = s.last + hash_slots * 4;
  s.bytes = s.later + hash_slots * 4;
  return s;
}

//! A tile's staged state: `slot[i]` is the slot token first + i writes (-1: none), `position[i]` its
//! position (-1: out of range, the token writes nothing).
struct AppendTile {
  int64_t first;
  int count;
  int64_t* slot;
  int64_t* position;
  SlotTable table;
};

__device__ __forceinline__ AppendTile append_tile(unsigned char* shared, const AppendGeometry& g, int64_t first,
                                                  int count) {
  const TileLayout at = tile_layout(g.tile_tokens, g.hash_slots);
  return {first,
          count,
          reinterpret_cast<int64_t*>(shared + at.slot),
          reinterpret_cast<int64_t*>(shared + at.position),
          {reinterpret_cast<unsigned long long*>(shared + at.keys), reinterpret_cast<int*>(shared + at.last),
           reinterpret_cast<int*>(shared + at.later), g.hash_slots}};
}

//! Stages tile `tl` (every thread of the block; it ends with a barrier): each token's position and slot,
//! and whether it is the last to write its slot: no later token with its position in range names it,
//! in the tile (the slot table's `last`) or after it (a scan of every later slot against the table). A
//! bad position or slot sets its bit of the error flag.
template <typename T, typename C>
__device__ __forceinline__ void stage_tile(const AppendArgs<T, C>& a, const AppendTile& tl) {
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const SlotTable& st = tl.table;
  const bool has_slots = st.size > 0;
  for (int e = tid; e < st.size; e += threads) {
    st.keys[e] = kAppendNoSlot;
    st.last[e] = -1;
    st.later[e] = 0;
  }
  for (int i = tid; i < tl.count; i += threads) {
    const int64_t t = tl.first + i;
    int64_t s = has_slots ? a.slots[t] : -1;
    const int64_t p = append_position(a, t);
    if (p < 0) {
      if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
      s = -1;
    } else if (s >= a.num_slots) {
      if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrorSlotOutOfRange);
      s = -1;
    }
    tl.slot[i] = s < 0 ? -1 : s;
    tl.position[i] = p;
  }
  __syncthreads();
  if (!has_slots) return;
  // A tile of one token needs no table: its slot is compared with each later one.
  const bool one = tl.count == 1;
  const int64_t own = tl.slot[0];
  if (!one) {
    for (int i = tid; i < tl.count; i += threads)
      if (tl.slot[i] >= 0) atomicMax(&st.last[st.insert(tl.slot[i])], i);
    __syncthreads();
  }
  if (!one || own >= 0)
    for_later_slots(a, tl.first + tl.count + tid, threads, [&](int64_t s, int64_t u) {
      if (s < 0 || s >= a.num_slots) return;
      const int e = one ? (s == own ? 0 : -1) : st.find(s);
      if (e >= 0 && append_position(a, u) >= 0) atomicOr(&st.later[e], 1);
    });
  __syncthreads();
  for (int i = tid; i < tl.count; i += threads) {
    if (tl.slot[i] < 0) continue;
    const int e = one ? 0 : st.find(tl.slot[i]);
    if ((!one && st.last[e] != i) || st.later[e] != 0) tl.slot[i] = -1;  // a later token writes the slot
  }
  __syncthreads();
}

}  // namespace kvrope::detail
