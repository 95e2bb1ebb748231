// A tile of the tile path: consecutive tokens whose table rows, slots and positions a block stages in
// shared memory, each slot kept only by the last token that writes it.
#pragma once

#include <cstdint>

#include "../../error_flag.cuh"
#include "../common/async_copy.cuh"
#include "args.cuh"
#include "slots.cuh"

namespace kvrope::detail {

//! Where a tile's staged state lies in dynamic shared memory (byte offsets), and its size: the table
//! rows [tile_tokens][table_row_bytes], each token's slot to write, then the slot table (keys, last, later).
struct TileLayout {
  int table, slots, keys, last, later, bytes;
};

__host__ __device__ inline TileLayout tile_layout(int tile_tokens, int hash_slots, int table_row_bytes) {
  TileLayout s{};
  s.table = 0;
  s.slots = tile_tokens * table_row_bytes;  // (a multiple of 16)
  s.keys = s.slots + tile_tokens * 8;
  s.last = s.keys + hash_slots * 8;
  s.later = s.last + hash_slots * 4;
  s.bytes = s.later + hash_slots * 4;
  return s;
}

//! Where the row rings start: after the staged state, at a 16-byte boundary.
__host__ __device__ inline int ring_offset(int staged_bytes) { return (staged_bytes + 15) / 16 * 16; }

//! A tile's staged state: `slot[i]` is the slot token first + i writes, -1 when it writes no cache row,
//! -2 when its position is out of range (it writes nothing); `table` its table rows.
struct AppendTile {
  int64_t first;
  int count;
  unsigned char* table;
  int64_t* slot;
  SlotTable slots;
};

__device__ __forceinline__ AppendTile append_tile(unsigned char* shared, const TileLayout& at, int hash_slots,
                                                  int64_t first, int count) {
  return {first,
          count,
          shared + at.table,
          reinterpret_cast<int64_t*>(shared + at.slots),
          {reinterpret_cast<unsigned long long*>(shared + at.keys), reinterpret_cast<int*>(shared + at.last),
           reinterpret_cast<int*>(shared + at.later), hash_slots}};
}

//! With mRoPE: the staged table row of each of the tile's tokens holds, for each pair i, cos and sin from
//! the table cache's row of the position of the pair's stream, so that the rows are finished as without
//! mRoPE. A pair a thread, plain loads (a token with a position out of range stages nothing: it writes
//! nothing).
template <typename T, typename C>
__device__ __forceinline__ void stage_mrope_rows(const AppendArgs<T, C>& a, const AppendGeometry& g,
                                                 const AppendTile& tl) {
  const int pairs = static_cast<int>(a.rotary_dim / 2);
  const int64_t bytes = append_table_bytes(a);
  const bool wide = bytes == 4 * a.rotary_dim;  // fp32 elements, else 16-bit ones
  for (int c = static_cast<int>(threadIdx.x); c < tl.count * pairs; c += static_cast<int>(blockDim.x)) {
    const int i = c / pairs, pair = c - i * pairs;
    const int64_t p = stream_position(a, tl.first + i, a.mrope.stream(pair));
    if (p < 0 || p >= a.max_position) continue;
    const unsigned char* src = static_cast<const unsigned char*>(a.table) + p * bytes;
    unsigned char* dst = tl.table + int64_t{i} * g.table_row_bytes;
    if (wide) {
      reinterpret_cast<uint32_t*>(dst)[pair] = reinterpret_cast<const uint32_t*>(src)[pair];
      reinterpret_cast<uint32_t*>(dst)[pairs + pair] = reinterpret_cast<const uint32_t*>(src)[pairs + pair];
    } else {
      reinterpret_cast<uint16_t*>(dst)[pair] = reinterpret_cast<const uint16_t*>(src)[pair];
      reinterpret_cast<uint16_t*>(dst)[pairs + pair] = reinterpret_cast<const uint16_t*>(src)[pairs + pair];
    }
  }
}

//! Stages tile `tl` (every thread of the block; it ends with a barrier): each token's slot, its table
//! row (copied while the later tokens' slots are scanned), and whether it is the last to write its slot:
//! no later token with its position in range names it, in the tile (the slot table's `last`) or after
//! it (a scan of every later slot against the table). A bad position or slot sets its bit of the error flag.
template <typename T, typename C>
__device__ __forceinline__ void stage_tile(const AppendArgs<T, C>& a, const AppendGeometry& g, const AppendTile& tl) {
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const SlotTable& st = tl.slots;
  const int hs = st.size;
  for (int e = tid; e < hs; e += threads) {
    st.keys[e] = kAppendNoSlot;
    st.last[e] = -1;
    st.later[e] = 0;
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
  // The table rows, a copy a thread (each thread loads the position its copy needs); with mRoPE each row
  // composed from its token's three rows.
  const int bytes = static_cast<int>(append_table_bytes(a));
  const int step = g.table_copy_bytes;
  const bool mrope = a.mrope.kind != MropeKind::kNone;
  const int copies = mrope ? 0 : bytes / step;
  if (mrope) stage_mrope_rows(a, g, tl);
  for (int c = tid; c < tl.count * copies; c += threads) {
    const int i = c / copies, b = (c - i * copies) * step;
    const int64_t p = append_position(a, tl.first + i);
    if (p < 0) continue;
    const unsigned char* src = static_cast<const unsigned char*>(a.table) + p * bytes + b;
    unsigned char* dst = tl.table + int64_t{i} * g.table_row_bytes + b;
    if (step >= 4)
      copy_async(dst, src, step);
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
  }
  wait_async_copies();
  __syncthreads();
}

}  // namespace kvrope::detail
