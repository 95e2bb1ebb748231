// The append's launch values.
#pragma once

#include <cstdint>

namespace kvrope::detail {

//! Threads a block.
inline constexpr int kAppendBlockThreads = 256;
//! Blocks of kAppendBlockThreads a SM the launch bounds ask for: up to 128 registers a thread (the
//! vector path needs 80-89; at 3 blocks, 85 registers, it spilled 20 bytes; at 4, 64, 120 bytes).
inline constexpr int kAppendBlocksPerSm = 2;
//! Rows a group of lanes holds in each of its two register buffers (the vector path): one buffer is
//! in flight while the other is finished, so a SM keeps 2 x 2 x 512 x 32 bytes of rows loading.
inline constexpr int kAppendRowsInFlight = 2;  // (3: prefill 1.500 -> 1.641 x floor, 4: 1.709)
//! Rows a group of the vector path keeps loading: a ring of this many rows a group in shared memory,
//! filled by cp.async, one row issued as one is finished (0: the two register buffers above).
#ifndef KVROPE_DEV_APPEND_STAGES
inline constexpr int kAppendRowStages = 6;
#else
inline constexpr int kAppendRowStages = KVROPE_DEV_APPEND_STAGES;
#endif
//! Most tokens a tile (its slot table and its scan of later slots are sized by it).
inline constexpr int kAppendTileMaxTokens = 128;
//! Slots a thread loads at once while scanning the later tokens for a tile's slots.
inline constexpr int kAppendSlotLoads = 8;
//! Threads a block of the few-token path (4 warps: small calls still spread over many SMs).
inline constexpr int kAppendTokenBlockThreads = 128;
//! Most tokens a call the few-token path takes (a warp checks every later slot, 32 lanes x
//! kAppendSlotLoads a round).
#ifndef KVROPE_DEV_APPEND_TOKEN_MAX
inline constexpr int kAppendTokenMaxTokens = 1024;
#else
inline constexpr int kAppendTokenMaxTokens = KVROPE_DEV_APPEND_TOKEN_MAX;
#endif
//! Most dynamic shared memory of a block (the default limit: no attribute to set).
inline constexpr int kAppendSharedBudget = 48 * 1024;

}  // namespace kvrope::detail
