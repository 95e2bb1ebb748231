// Launch parameters per GPU architecture (see docs/perf-notes.md for how they were chosen).
#pragma once

namespace kvrope {

//! Block size and resident blocks per SM of the persistent grid. The grid is
//! min(SM count x blocks_per_sm, blocks the work can use).
struct LaunchTuning {
  int block_threads = 512;  //!< a multiple of 32, at most kMaxBlockThreads
  int blocks_per_sm = 2;
  //! Out-of-place: how many bytes a token warp moves per copy warp's byte in the same time; each
  //! block gives token work warps x token_bytes / (token_bytes + weight x copy_bytes) of its warps.
  double token_warp_weight = 0.6;
};

//! The largest block the kernels are compiled for (their __launch_bounds__).
inline constexpr int kMaxBlockThreads = 512;

//! Tuned launch parameters for a device of compute capability major.minor.
inline LaunchTuning default_tuning(int cc_major, int /*cc_minor*/) {
  if (cc_major >= 10) return LaunchTuning{512, 2, 0.6};  // Blackwell: derived, not measured (docs/perf-notes.md)
  if (cc_major == 9) return LaunchTuning{512, 2, 0.6};   // Hopper: measured on an H200
  return LaunchTuning{256, 4, 0.6};
}

}  // namespace kvrope
