// The append's launch values.
#pragma once

#include <cstdint>

namespace kvrope::detail {

//! Threads a block.
inline constexpr int kAppendBlockThreads = 256;
//! Blocks of kAppendBlockThreads a SM the launch bounds ask for: up to 128 registers a thread (the
//! vector path needs 80-89; at 3 blocks, 85 registers, it spilled 20 bytes; at 4, 64, 120 bytes).
inline constexpr int kAppendBlocksPerSm = 2;
//! Rows a group of lanes loads before it finishes any (the vector path): bytes in flight a SM.
#ifdef KVROPE_DEV_APPEND_ROWS  // (a development override, measured on the H200, then removed)
inline constexpr int kAppendRowsInFlight = KVROPE_DEV_APPEND_ROWS;
#else
inline constexpr int kAppendRowsInFlight = 2;
#endif
//! Bits of each repeat bitmask a token: the hashed slots collide rarely at four bits a token.
inline constexpr int64_t kAppendMaskBitsPerToken = 4;
//! Most 32-bit words of a repeat bitmask (8 KiB each; the two take 16 KiB of the default 48 KiB).
inline constexpr int64_t kAppendMaskMaxWords = 2048;

}  // namespace kvrope::detail
