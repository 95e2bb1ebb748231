// Which token writes a slot: a token's position check, the scan of later tokens' slots (the last token
// naming a slot wins), and a tile's slot table in shared memory.
#pragma once

#include <cstdint>

#include "../common/position.cuh"
#include "args.cuh"
#include "policy.cuh"

namespace kvrope::detail {

//! Position p, or -1 when it is outside [0, max_position).
template <typename T, typename C>
__device__ __forceinline__ int64_t checked_position(const AppendArgs<T, C>& a, int64_t p) {
  return p >= 0 && p < a.max_position ? p : -1;
}

//! Token t's position in stream `stream` of positions (mRoPE; else stream 0), as given.
template <typename T, typename C>
__device__ __forceinline__ int64_t stream_position(const AppendArgs<T, C>& a, int64_t t, int stream) {
  const int64_t at = t + stream * a.position_stream_stride;
  return index_value(load_raw_index(a.positions, a.positions_are_int64, at), a.positions_are_int64);
}

//! Token t's position (mRoPE: its first stream's), or -1 when it (mRoPE: any of its three) is outside
//! [0, max_position).
template <typename T, typename C>
__device__ __forceinline__ int64_t append_position(const AppendArgs<T, C>& a, int64_t t) {
  const int64_t p = checked_position(a, stream_position(a, t, 0));
  if (a.mrope.kind == MropeKind::kNone) return p;
  const int64_t h = checked_position(a, stream_position(a, t, 1)), w = checked_position(a, stream_position(a, t, 2));
  return h < 0 || w < 0 ? -1 : p;
}

//! Calls f(s, u) for each token u = first, first + stride, ... below `tokens`, with its slot s = slots[u]: a
//! thread loads kAppendSlotLoads slots a round, all in flight before any is used.
template <typename F>
__device__ __forceinline__ void for_later_slots(const int64_t* slots, int64_t tokens, int64_t first, int64_t stride,
                                                F&& f) {
  for (int64_t u0 = first; u0 < tokens; u0 += kAppendSlotLoads * stride) {
    int64_t s[kAppendSlotLoads];
#pragma unroll
    for (int k = 0; k < kAppendSlotLoads; ++k) {
      const int64_t u = u0 + k * stride;
      s[k] = u < tokens ? slots[u] : -1;
    }
#pragma unroll
    for (int k = 0; k < kAppendSlotLoads; ++k) f(s[k], u0 + k * stride);
  }
}

//! The same over an append call's tokens.
template <typename T, typename C, typename F>
__device__ __forceinline__ void for_later_slots(const AppendArgs<T, C>& a, int64_t first, int64_t stride, F&& f) {
  for_later_slots(a.slots, a.tokens, first, stride, static_cast<F&&>(f));
}

//! The first round of a warp's scan of the slots after a token's (later_names_slot): lane l's
//! kAppendSlotLoads slots, tokens token + 1 + l + 32 k (-1 past the call's end).
struct LaterSlots {
  int64_t s[kAppendSlotLoads];
};

//! Loads the first round of the scan after `token`, so that it is in flight beside the token's position.
template <typename T, typename C>
__device__ __forceinline__ LaterSlots first_later_slots(const AppendArgs<T, C>& a, int64_t token) {
  LaterSlots l;
  const int64_t first = token + 1 + (threadIdx.x & 31);
#pragma unroll
  for (int k = 0; k < kAppendSlotLoads; ++k) l.s[k] = first + 32 * k < a.tokens ? a.slots[first + 32 * k] : -1;
  return l;
}

//! Whether a later token of the call with its position in range (kMrope: its three) names `slot` (in
//! range), the scan's first round loaded (first_later_slots): the whole warp scans, every lane must call
//! it. The last writer of a slot is the only token this is false for. The later slots alone first (a
//! compare a slot: the common call, where none names it, pays no position load or branch a slot); only
//! when one does, which of those tokens count.
template <bool kMrope, typename T, typename C>
__device__ __forceinline__ bool later_names_slot(const AppendArgs<T, C>& a, int64_t token, int64_t slot,
                                                 const LaterSlots& head) {
  const int64_t first = token + 1 + (threadIdx.x & 31);
  bool named = false;
#pragma unroll
  for (int k = 0; k < kAppendSlotLoads; ++k) named |= head.s[k] == slot;
  for_later_slots(a, first + 32 * kAppendSlotLoads, 32, [&](int64_t s, int64_t) { named |= s == slot; });
  if (!__any_sync(0xffffffffu, named)) return false;
  // (one token at a time: only repeated slots come here, and mRoPE's three positions checked in a batched
  // scan held 17 more registers)
  bool found = false;
  for (int64_t u = first; u < a.tokens; u += 32)
    if (a.slots[u] == slot && (kMrope ? append_position(a, u) : checked_position(a, stream_position(a, u, 0))) >= 0)
      found = true;
  return __any_sync(0xffffffffu, found);
}

//! An empty key of a tile's slot table (no slot in range has all bits set).
inline constexpr unsigned long long kAppendNoSlot = ~0ull;

//! A tile's slot table: open addressing over `size` entries (a power of two, at least twice the tile's
//! tokens), keys the slots; `last` the tile's last token naming a key, `later` whether a token after the
//! tile does (both with their positions in range).
struct SlotTable {
  unsigned long long* keys;
  int* last;
  int* later;
  int size;

  __device__ __forceinline__ int hash(int64_t slot) const {
    return static_cast<int>((static_cast<uint64_t>(slot) * 0x9E3779B97F4A7C15ull) >> 32) & (size - 1);
  }
  //! The entry of `slot`, inserted if absent.
  __device__ __forceinline__ int insert(int64_t slot) const {
    for (int e = hash(slot);; e = (e + 1) & (size - 1)) {
      const unsigned long long prev = atomicCAS(&keys[e], kAppendNoSlot, static_cast<unsigned long long>(slot));
      if (prev == kAppendNoSlot || prev == static_cast<unsigned long long>(slot)) return e;
    }
  }
  //! The entry of `slot`, or -1 when no token of the tile names it.
  __device__ __forceinline__ int find(int64_t slot) const {
    for (int e = hash(slot);; e = (e + 1) & (size - 1)) {
      const unsigned long long key = keys[e];
      if (key == static_cast<unsigned long long>(slot)) return e;
      if (key == kAppendNoSlot) return -1;
    }
  }
};

}  // namespace kvrope::detail
