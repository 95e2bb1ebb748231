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

//! Positions a builder thread loads before its atomics: one round trip for all (perf log v10).
inline constexpr int kMaskLoads = 4;

inline constexpr int kBulkStageBytes = 32768;  // a chunk at most; 6 stages fit 227 KiB (perf log v3)
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

//! 16-byte copies in flight per copy thread (perf log v1: 4 left the copy short of bandwidth).
inline constexpr int kCopyUnroll = 8;

//! Elements per access of the token work, at most 4 (8 bytes of bf16): a lane's chunk pairs, tables
//! and head-sum accumulators then fit its registers (perf log v4).
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
//! In place a token is split over warps only while they number at most this many a SM (perf log v15).
inline constexpr int64_t kInPlaceSplitWarpsPerSm = 4;

//! Launch values per architecture. Figures cite docs/performance-log.md by version.
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
    384,    // v3: 168 registers a thread hold four head iterations' rows in flight
    2,      // v3: at most two a SM (the occupancy query decides; the bulk ring leaves one)
    true,   // v3: the bulk copy leaves the token warps all their registers (1.92 -> 1.55 x floor)
    6,      // v3: 192 KiB of loads in flight a SM
    2,      // v3.1: 4 loads in flight while 2 stores drain
    32768,  // v3: a chunk a stage
    1,      // v4: 4 was slower on 8 MiB caches, 0 slower on the 1 MiB one
    6,      // v5: a full ring before the bitmask
    2,      // v15: case 9 (S = 2048) 1 % faster than with 1
    8,      // v6: blocks share chunks of large caches, 5-7 % faster
    0.6,    // v2: 0.35 and 1.0 slower on the token-heavy cases
    64,     // v11: above it the bulk copy of the fused kernel is faster
    128,    // v12: 192 and 256 slower on case 8 (becomes 160 with 4 token warps)
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
