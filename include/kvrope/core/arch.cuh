// Launch parameters per GPU architecture (see docs/perf-notes.md for how they were chosen).
#pragma once

namespace kvrope {

//! Block size and resident blocks per SM of the persistent grid. The grid is
//! min(SM count x blocks_per_sm, blocks the work can use).
struct LaunchTuning {
  int block_threads = 384;  //!< a multiple of 32, from 64 to kMaxBlockThreads (clamped)
  int blocks_per_sm = 2;
  //! Out-of-place without the bulk-copy engine (the scalar path, or before sm_90): how many bytes a
  //! token warp moves per copy warp's byte in the same time; each block gives token work
  //! warps x token_bytes / (token_bytes + weight x copy_bytes) of its warps. (With the bulk copy,
  //! one warp per block copies and all others do token work.)
  double token_warp_weight = 0.6;
  //! Out-of-place with the bulk copy (sm_90+): stages of 32 KiB in each block's shared-memory ring
  //! (at most 6), and how many chunk stores may still be reading their stage when the copy warp
  //! refills the oldest one (1 to stages - 1): stages - slack chunk loads stay in flight.
  int bulk_stages = 6;
  int bulk_store_slack = 2;
  //! Out-of-place: copy the caches with the bulk-copy engine where it can (sm_90+, 16-byte aligned
  //! rows); false: copy warps move them through registers, split by token_warp_weight.
  bool bulk_copy = true;
  //! With the bulk copy: small caches are cut into chunks of fewer rows (halving down to 4 KiB) until
  //! the grid's blocks have at least this many chunks each; 0 keeps every chunk a full 32 KiB stage.
  //! 1 on the H200 (docs/perf-notes.md, v4): only caches with fewer 32 KiB chunks than blocks (1 MiB
  //! and less) are cut; 4 was slower on 8 MiB caches, 0 slower on the 1 MiB one.
  int bulk_min_chunks_per_block = 1;
  //! With the bulk copy of a small cache (at most 8 chunks per block), or any cache with
  //! bulk_speculate_large: how many of its chunks each block loads at the kernel's start, before its
  //! bitmask of rows in cache_position is built (0 to bulk_stages). Only when the token warps load
  //! every position in at most bulk_speculate_mask_rounds rounds: a later round would queue behind
  //! these loads.
  int bulk_speculate_chunks = 6;
  //! With the bulk copy of a small cache (when its chunks are speculated, above): the token warps
  //! write the zeros of the cache-input gradient rows in cache_position (as the in-place variant
  //! does) and the copy warp skips those rows, which shortens the copy warp's chain; false, or a
  //! larger cache: the copy warp writes them.
  bool token_zeros = true;
  //! With the bulk copy: each token warp adds its share of the bitmask after its first item (whose
  //! position and rows then load ahead of the bitmask's positions), not before. Measured slower on
  //! the H200 (the copy's data then waits behind the token traffic: docs/perf-notes.md, v5), so off.
  bool mask_after_first_item = false;
  //! With the bulk copy and a workspace (BackwardParams::workspace): blocks take the chunks of a
  //! large cache (more than bulk_share_min_chunks_per_block chunks per block, at most 65 536 rows:
  //! one bitmask window) past their first ring's worth from a shared counter at run time; false:
  //! each block copies a fixed range, as without a workspace.
  bool bulk_share_chunks = true;
  //! With the bulk copy: the most bytes a chunk of the copy holds (4 KiB to the 32 KiB stage,
  //! rounded down to whole rows; a chunk has at least one row).
  int bulk_chunk_bytes = 32768;
  //! With the bulk copy: blocks speculate their first chunks (bulk_speculate_chunks) for caches of
  //! any size, not only small ones, when the positions fit one round of the bitmask's loads.
  bool bulk_speculate_large = true;
  //! With the bulk copy and a workspace (bulk_share_chunks): the blocks share a cache's chunks only
  //! when it has more than this many per block (and more than the rings hold).
  int bulk_share_min_chunks_per_block = 8;
  //! In-place, on the vectorized path (every pointer and stride 16-byte aligned) where the kernel
  //! has sm_90 code (BackwardPlan::token_prefetch says what applied): token warps prefetch into L2
  //! (prefetch.global.L2, a lane a row) the rows of an item that do not depend on its position (cos,
  //! sin, and the key rows when the table gradients are asked for) before the item needs them: once
  //! it has its position, only its gK and gV rows still come from DRAM. 0: never; 1: each next
  //! item's, when its position is fetched; 2: also the first item's, at the kernel's start, while the
  //! block builds its bitmask (more than one position a batch); 3: as 2, and the first item's gK and
  //! gV rows too, as soon as its position is in (during the block's bitmask build);
  //! clamped to 0-3. 3 on the H200: 1.1-1.3 % off the in-place geomean of the 13 cases with S > 1
  //! against 2 (cases 1, 4 and 16 3-8 % faster, case 9 2-4 % slower; docs/perf-notes.md, v16). The
  //! prefetch instruction needs neither sm_90 nor aligned rows; those limits are where it was
  //! measured. Out of place it was slower (v9, and by lane in v10): the prefetches compete with the
  //! cache copy.
  int in_place_token_prefetch = 3;
  //! In-place: the grid has a block per token item, up to one wave, instead of the fewest blocks
  //! whose warps hold the items, and the first items are dealt to the blocks in turn (item w to
  //! block w mod grid) instead of filling one block's warps before the next: a launch with fewer
  //! items than the device has warps spreads them over the SMs. On by default on every device;
  //! measured on the H200 only: 5 % off the in-place 16-case geomean, 18-25 % off leaderboard cases
  //! 10 and 12 (one position a batch, 32 and 4 tokens; 3 % off case 8, one token) (docs/perf-notes.md,
  //! v10). Out of place out_of_place_spread_items applies instead.
  bool in_place_spread_items = true;
  //! Out of place: the first token items dealt to the blocks in turn (item w to block w mod grid), as
  //! in_place_spread_items does in place, instead of filling one block's token warps before the next;
  //! the grid is the copy's either way. On the H200 0.6 % off the fused 16-case geomean, cases 4, 5
  //! and 7 1-3 % faster, case 10 0.6 % slower (docs/perf-notes.md, v15).
  bool out_of_place_spread_items = true;
  //! Calls with one new token a batch (S == 1, a decoding step) on the vectorized path, with a head
  //! dim that is a power of two from two 16-byte vectors to 256 (D = 16 to 256 in bf16 or fp16, 8 to
  //! 256 in fp32): a kernel of their own, with no bitmask and a short path from its entry
  //! to its loads (BackwardPlan::decode). In place always; out of place when both caches together
  //! hold at most decode_copy_max_mib MiB (its copy goes through registers; larger caches keep the
  //! bulk copy). (docs/perf-notes.md, v11.)
  bool decode_kernel = true;
  int decode_copy_max_mib = 64;
  //! Out of place, the decode kernel's threads per block (clamped to one warp more than a token's
  //! warps, decode_token_warps, and to 256; the first warps of the first B blocks do the tokens,
  //! every other thread copies). In place its blocks are a token's warps, one a token. With 4 warps
  //! a token (H = 8, D = 128) the default 128 becomes 160: 2 blocks a SM at 168 registers. On the
  //! H200 192 and 256 were slower for leaderboard case 8 (3.1-3.4 against 2.85 us; v12).
  int decode_block_threads = 128;
  //! The decode kernel's warps a token: 1, 2 or 4 (rounded down to a power of two, and at most the
  //! 16-byte chunks of half a row), each covering a share of the chunks of every head, so that the
  //! warps of a token never meet; 0: chosen by the kernel's rule (detail::decode_token_warps: in place
  //! the most that leave no lane without a head, out of place twice that; H = 8, D = 128, bf16: 2 in
  //! place, 4 out of place). On the H200 these were 5-7 % faster than one warp (docs/perf-notes.md,
  //! v12; v11's warps split the heads and met behind a barrier, and lost to one warp).
  int decode_token_warps = 0;
  //! The fused kernel's warps a token: 1, 2, 4 or 8 (other values: rounded down to a power of two, at
  //! most 8; as asked, even where lanes are then left without a head row chunk); 0: chosen
  //! (token_parts_log2 in backward.cuh: as many as the token warps allow, at most 8 and no more than
  //! leave every lane a head row chunk; in place only while the tokens' warps number at most four a
  //! SM). Calls with S = 1 take the decode kernel, which has decode_token_warps instead. On the H200,
  //! in place, one warp a token was never slower than two and 2-10 % faster than the earlier rule's
  //! two or four on leaderboard cases 1, 4 and 16; out of place the rule's two or four were 5-12 %
  //! faster than one (docs/perf-notes.md, v15).
  int token_parts = 0;
  //! With the bulk copy: bulk_speculate_chunks applies only when the token warps load every position
  //! of the bitmask in at most this many rounds (kMaskLoads positions a thread a round; below 1: 1).
  //! 2 on the H200: leaderboard case 9 (S = 2048, two rounds) 1 % faster than with 1, the others
  //! equal (docs/perf-notes.md, v15).
  int bulk_speculate_mask_rounds = 2;
};

//! The largest block the kernels are compiled for (their __launch_bounds__): 384 threads leave the
//! token work 168 registers, enough to hold the rows of four head iterations at once (see
//! docs/perf-notes.md, v3).
inline constexpr int kMaxBlockThreads = 384;

//! Tuned launch parameters for a device of compute capability major.minor.
inline LaunchTuning default_tuning(int cc_major, int /*cc_minor*/) {
  if (cc_major >= 10) return LaunchTuning{384, 2, 0.6, 6, 2, true};  // Blackwell: derived, not measured (docs/perf-notes.md)
  if (cc_major == 9) return LaunchTuning{384, 2, 0.6, 6, 2, true};   // Hopper: measured on an H200
  return LaunchTuning{256, 4, 0.6, 6, 2, true};
}

}  // namespace kvrope
