// The forward's launch values, measured on an H200 (docs/performance-log.md, "The forward").
#pragma once

#include <cstdint>

namespace kvrope::detail {

//! The block with S > 1: 256 threads, so half as many blocks load the positions for the run check as
//! with 128 (S > 1 calls up to 12 % faster).
inline constexpr int kForwardBlockThreads = 256;
//! The block with S = 1 (no run check): 128 threads spread a decode step over twice the SMs (1-11 % faster).
inline constexpr int kForwardDecodeBlockThreads = 128;
//! Blocks of 256 a SM the launch bounds ask for: 16 warps of up to 128 registers (24 of 80 spilled: 5-59 % slower).
inline constexpr int kForwardBlocksPerSm = 2;
//! Most rows a repeat bitmask covers (8 KiB each); longer caches hash rows onto it, and a collision
//! only costs its tokens a scan of the later positions.
inline constexpr int64_t kForwardMaskRows = 65536;

}  // namespace kvrope::detail
