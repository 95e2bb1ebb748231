// The backward's launch policy: the shapes its kernels are built around, and the measured values per GPU
// architecture the planner sizes launches with (docs/performance-log.md).
#pragma once

#include <cstdint>

namespace kvrope::detail {

//! The fused kernel's largest block (its __launch_bounds__): leaves the token work 168 registers.
inline constexpr int kMaxBlockThreads = 384;

//! Bytes of dynamic shared memory for a window of `window_rows` rows (one bit each).
__host__ __device__ inline constexpr int64_t mask_bytes(int64_t window_rows) { return window_rows / 32 * 4; }

//! The most rows one bitmask covers (8 KiB of shared memory); longer caches take several windows.
inline constexpr int64_t kMaxWindowRows = 65536;

//! Positions a builder thread loads before its atomics: one round trip for all (8 were 4-7 % slower).
inline constexpr int kMaskLoads = 4;

inline constexpr int kBulkStageBytes = 32768;  // a chunk at most; 6 stages fit 227 KiB
inline constexpr int kMaxBulkStages = 6;       // stages of the ring at most
inline constexpr int kMaxBulkSlack = 8;        // stores still reading their stage at most
inline constexpr int kBulkAlign = 128;
inline constexpr int64_t kMinBulkChunkBytes = 4096;  // small caches' chunks are halved down to this

//! Offset of the stage ring in the kernel's dynamic shared memory, after the bitmask.
__host__ __device__ inline constexpr int64_t bulk_ring_offset(int64_t mask_bytes) {
  return (mask_bytes + kBulkAlign - 1) / kBulkAlign * kBulkAlign;
}
//! Bytes of a ring of `stages` stages, their barriers and the index of the chunk each holds.
__host__ __device__ inline constexpr int64_t bulk_ring_bytes(int stages) {
  return int64_t{stages} * (kBulkStageBytes + 16);
}

//! 16-byte copies in flight per copy thread: 64 KB a SM, above the ~48 KB the bandwidth-latency product needs.
inline constexpr int kCopyUnroll = 8;

//! Elements per access of the token work, at most 4 (8 bytes of bf16): a lane's chunk pairs, tables
//! and head-sum accumulators then fit its registers (8 spilled 184-280 bytes at 168 registers).
inline constexpr int kTokenVecMax = 4;

//! The decode kernel's block size bound (its __launch_bounds__ on sm_90; on sm_100 the launch's clamp).
inline constexpr int kDecodeMaxBlockThreads = 256;
//! Out of place: the (gK, gV) 16-byte vector pairs of a copy thread's round (two rounds in registers).
inline constexpr int kDecodeCopyPairs = 4;

// Whether a head dim suits the decode kernel: a power of two from two 16-byte vectors of T to 256,
// so that a row is whole 16-byte vectors and its half a power of two of them, at most 32 (a warp
// covers a row's chunk pairs, or a power of two of rows at once).
template <typename T>
__host__ __device__ inline constexpr bool decode_head_dim_ok(int64_t head_dim) {
  return head_dim >= 2 * int64_t{16 / sizeof(T)} && head_dim <= 256 && (head_dim & (head_dim - 1)) == 0;
}

//! The most warps a token of the decode kernel has.
inline constexpr int kDecodeMaxTokenWarps = 4;

//! The most dynamic shared memory a fused launch asks for: the largest bitmask and the bulk-copy ring.
inline constexpr int64_t kMaxSharedBytes =
    bulk_ring_offset(mask_bytes(kMaxWindowRows)) + bulk_ring_bytes(kMaxBulkStages);
//! A bulk copy of at most this many chunks a block is a small cache: its token warps write the zero rows.
inline constexpr int64_t kSpeculateChunksPerBlock = 8;
//! In place a token is split over warps only while they number at most this many a SM (suite 14.31 -> 14.13 us).
inline constexpr int64_t kInPlaceSplitWarpsPerSm = 4;

//! Launch values per architecture.
struct LaunchPolicy {
  int block_threads;                    //!< fused kernel block, a multiple of 32 in [64, kMaxBlockThreads]
  int blocks_per_sm;                    //!< resident fused blocks per SM (the grid is one wave)
  bool bulk_copy;                       //!< out of place: copy the caches with the bulk-copy engine (sm_90+)
  int bulk_stages;                      //!< 32 KiB stages in a block's bulk-copy ring (2 to 6)
  int bulk_store_slack;                 //!< chunk stores still reading their stage when it is refilled
  int bulk_chunk_bytes;                 //!< the most bytes of one bulk-copy chunk (4 KiB to a stage)
  int bulk_min_chunks_per_block;        //!< small caches: chunks halved until each block has this many
  int bulk_speculate_chunks;            //!< chunks a block loads before its bitmask is built
  int bulk_speculate_mask_rounds;       //!< ... only when the bitmask's positions load in this many rounds
  int bulk_share_min_chunks_per_block;  //!< with a workspace, blocks share chunks above this many a block
  double token_warp_weight;             //!< register copy: a token warp's bytes per copy warp byte (warp split)
  int decode_copy_max_mib;              //!< S = 1 out of place: the decode kernel for caches up to this size
  int decode_block_threads;             //!< S = 1 out of place: the decode kernel's block
};

//! Hopper, measured on an H200 (docs/performance-log.md).
inline constexpr LaunchPolicy kHopperPolicy{
    384,    // 168 registers a thread hold four head iterations' rows in flight; fused at 256 0.4-0.8 % slower
    2,      // at most two a SM (the occupancy query decides; the bulk ring leaves one)
    true,   // the bulk copy leaves the token warps all their registers (fused 1.924 -> 1.841 x floor)
    6,      // a 192 KiB ring a SM; shallower rings up to 3 % slower
    2,      // 4 loads in flight while 2 stores drain; 1 and 3 1.5 % and 0.6 % slower
    32768,  // a chunk a stage; 16 KiB chunks 25-40 % slower
    1,      // 4 cost the 8 MiB caches 1-2 us, 0 cost case 8 2.4 us
    6,      // a full ring before the bitmask: 9 small cases 14.09 -> 13.36 us
    2,      // case 9 (S = 2048) 1 % faster than with 1
    8,      // blocks share chunks of large caches, 5-7 % faster; 6 made case 5 7 % slower
    0.6,    // 1.924 x floor against 2.234 at 1.0; 0.35 slower on the token-heavy cases
    64,     // above it the fused kernel's bulk copy is faster (case 10: 133-134 against 142 us)
    128,    // case 8 3.06-3.14 us against 3.26-3.28 at 256, 192 slower (becomes 160 with 4 token warps)
};

//! Blackwell: Hopper's values, derived from its bandwidth and latency (no B200 to measure on).
inline constexpr LaunchPolicy kBlackwellPolicy = kHopperPolicy;

//! Before sm_90 (no bulk-copy engine): 256-thread blocks, four a SM, the register copy.
inline constexpr LaunchPolicy kPreHopperPolicy{256, 4, false, 6, 2, 32768, 1, 6, 2, 8, 0.6, 64, 128};

//! The policy of a device of compute capability `cc_major`.x.
constexpr LaunchPolicy policy_for(int cc_major) {
  return cc_major >= 10 ? kBlackwellPolicy : cc_major == 9 ? kHopperPolicy : kPreHopperPolicy;
}

}  // namespace kvrope::detail
