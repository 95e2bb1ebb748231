// The append's launch values.
#pragma once

#include <cstdint>

namespace kvrope::detail {

//! Threads a block.
inline constexpr int kAppendBlockThreads = 256;
//! Blocks of kAppendBlockThreads a SM the launch bounds ask for: up to 128 registers a thread (the
//! register-buffer paths need 80-92; at 3 blocks, 85 registers, they spilled 20 bytes; at 4, 64, 120 bytes).
inline constexpr int kAppendBlocksPerSm = 2;
//! The same for the ring path (rows in shared memory, 80 registers): its 16 warps a SM issued half
//! the cycles, stalled on fixed-latency dependences (ncu, prefill 1 x 8,192), so it takes more warps.
#ifndef KVROPE_DEV_APPEND_RING_BLOCKS
inline constexpr int kAppendRingBlocksPerSm = 3;
#else
inline constexpr int kAppendRingBlocksPerSm = KVROPE_DEV_APPEND_RING_BLOCKS;
#endif
//! Rows a group of lanes holds in each of its two register buffers (the vector path): one buffer is
//! in flight while the other is finished, so a SM keeps 2 x 2 x 512 x 32 bytes of rows loading.
inline constexpr int kAppendRowsInFlight = 2;  // (3: prefill 1.500 -> 1.641 x floor, 4: 1.709)
//! Rows a group of the vector path keeps loading: a ring of this many rows a group in shared memory,
//! filled by cp.async, one row issued as one is finished (0: the two register buffers above).
#ifndef KVROPE_DEV_APPEND_STAGES
inline constexpr int kAppendRowStages = 4;
#else
inline constexpr int kAppendRowStages = KVROPE_DEV_APPEND_STAGES;
#endif
//! Whether the instance with chunks of N elements of T (kSingle: one unit a lane) loads rows through rings.
template <typename T>
__host__ __device__ constexpr bool append_has_ring(int n, bool single) {
  return kAppendRowStages > 0 && single && n * static_cast<int>(sizeof(T)) == 16;
}
//! Most tokens a tile (its slot table and its scan of later slots are sized by it).
inline constexpr int kAppendTileMaxTokens = 128;
//! Slots a thread loads at once while scanning the later tokens for a tile's slots.
inline constexpr int kAppendSlotLoads = 8;
//! Threads a block of the few-token path (4 warps: small calls still spread over many SMs).
inline constexpr int kAppendTokenBlockThreads = 128;
//! Rows of one token a group of the few-token path takes (their angles read once, a warp's setup
//! shared by more rows).
#ifndef KVROPE_DEV_APPEND_TOKEN_ROWS
inline constexpr int kAppendTokenRows = 2;
#else
inline constexpr int kAppendTokenRows = KVROPE_DEV_APPEND_TOKEN_ROWS;
#endif
//! Most tokens a call the few-token path takes (a warp checks every later slot, 32 lanes x
//! kAppendSlotLoads a round).
#ifndef KVROPE_DEV_APPEND_TOKEN_MAX
inline constexpr int kAppendTokenMaxTokens = 1024;
#else
inline constexpr int kAppendTokenMaxTokens = KVROPE_DEV_APPEND_TOKEN_MAX;
#endif
//! Most shared memory a tile's staged state takes: 64 tokens of fp32 R = 128 table rows, or 128 of
//! bf16, fit; with the rings, kAppendRingBlocksPerSm blocks fit a SM.
#ifndef KVROPE_DEV_APPEND_BUDGET_KIB
inline constexpr int kAppendSharedBudget = 40 * 1024;
#else
inline constexpr int kAppendSharedBudget = KVROPE_DEV_APPEND_BUDGET_KIB * 1024;
#endif

}  // namespace kvrope::detail
