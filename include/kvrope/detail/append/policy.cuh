// The append's launch values.
#pragma once

namespace kvrope::detail {

//! Threads a block of the tile path.
inline constexpr int kAppendBlockThreads = 256;
//! Blocks of kAppendBlockThreads a SM the launch bounds ask for: up to 128 registers a thread.
inline constexpr int kAppendBlocksPerSm = 2;
//! Rows a group loads before it finishes any of them (per lane: this many pairs of 16-byte loads in flight).
inline constexpr int kAppendRowsInFlight = 4;
//! Most tokens a tile (its slot table and its scan of later slots are sized by it).
inline constexpr int kAppendTileMaxTokens = 128;
//! Slots a thread loads at once while scanning the later tokens for a slot.
inline constexpr int kAppendSlotLoads = 8;
//! Threads a block of the few-token path (4 warps: small calls still spread over many SMs).
inline constexpr int kAppendTokenBlockThreads = 128;
//! Rows a group of the few-token path takes (two lost: decode 2.358 -> 2.847 x (floor + empty), #47).
inline constexpr int kAppendTokenRowsPerGroup = 1;
//! Most tokens a call the few-token path takes (a warp checks every later slot, 32 lanes x
//! kAppendSlotLoads a round).
inline constexpr int kAppendTokenMaxTokens = 1024;

}  // namespace kvrope::detail
