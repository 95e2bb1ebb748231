// Launch policy per GPU architecture: the measured values the planner sizes launches with.
#pragma once

namespace kvrope::detail {

//! The fused kernel's largest block (its __launch_bounds__): leaves the token work 168 registers.
inline constexpr int kMaxBlockThreads = 384;

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
