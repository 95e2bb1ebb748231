// The append's launch values.
#pragma once

namespace kvrope::detail {

//! Threads a block of the tile path.
inline constexpr int kAppendBlockThreads = 256;
//! Blocks of kAppendBlockThreads a SM the launch bounds ask for: up to 128 registers a thread (the
//! vector path needs 80-89; at 3 blocks, 85 registers, it spilled 20 bytes; at 4, 64, 120 bytes).
inline constexpr int kAppendBlocksPerSm = 2;
//! Rows a group of the vector path keeps loading: a ring of this many rows a group in shared memory,
//! filled by cp.async, one row issued as one is finished (prefill >= 64 MB 1.472 x floor; register
//! buffers 1.497, 4 rows 1.462, 8 rows 1.486: performance log #46).
inline constexpr int kAppendRowStages = 6;
//! Rows a group of one unit a lane finishes in one pass of a one-token tile: the split of a small
//! call's tiles over blocks counts them (the rows measured in #46 with this split).
inline constexpr int kAppendGroupRowsAPass = 2;
//! Most tokens a tile (its slot table and its scan of later slots are sized by it).
inline constexpr int kAppendTileMaxTokens = 128;
//! Slots a thread loads at once while scanning the later tokens for a slot.
inline constexpr int kAppendSlotLoads = 8;
//! Threads a block of the few-token path (4 warps: small calls still spread over many SMs).
inline constexpr int kAppendTokenBlockThreads = 128;
//! Most tokens a call the few-token path takes (a warp checks every later slot, 32 lanes x
//! kAppendSlotLoads a round).
inline constexpr int kAppendTokenMaxTokens = 1024;  // (T = 1,024 on tiles: 12.66-17.65 us, here 12.50-17.12)
//! Most shared memory a tile's staged state takes (the rows' rings come on top).
inline constexpr int kAppendSharedBudget = 48 * 1024;

}  // namespace kvrope::detail
