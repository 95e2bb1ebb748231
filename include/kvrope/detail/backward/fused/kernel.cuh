// The fused backward kernel: token work (gather, RoPE backward, head sums, in-place zeroing) and copy
// work (the cache rows not in cache_position) in one persistent launch.
#pragma once

#include <cstdint>

#include "../args.cuh"
#include "../policy.cuh"
#include "bitmask.cuh"
#include "copy_bulk.cuh"
#include "copy_registers.cuh"
#include "token_work.cuh"

namespace kvrope::detail {

// The first window's bitmask, by the token warps beside a bulk-copy warp (released with kMaskReady), else
// by the whole block. In place it only tells whether a row repeats (returned), window by window.
template <bool kInPlace, typename T, typename Hook>
__device__ __forceinline__ bool build_first_mask(const FusedArgs<T>& a, uint32_t* mask, int* repeats, bool token_warp,
                                                 Hook&& in_place_hook) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (copy_bulk.cuh: the bulk-copy role)
  const bool bulk_build = a.bulk;
#else
  constexpr bool bulk_build = false;
#endif
  const int builders = bulk_build ? a.token_warps * 32 : static_cast<int>(blockDim.x);
  const bool masked = !(kInPlace && a.seq_len <= 1);  // one position a batch cannot repeat
  if (masked) {
    if (threadIdx.x == 0) *repeats = 0;
    for (int64_t i = threadIdx.x; i < a.window_rows / 32; i += builders) mask[i] = 0;
    if (bulk_build) {
      named_barrier_sync<kMaskBuilders>(builders);
    } else {
      __syncthreads();
    }
    if (kInPlace) {
      build_mask(a, mask, 0, row_window(a, 0).wlen, threadIdx.x, builders, repeats, in_place_hook);
    } else {
      build_mask(a, mask, 0, row_window(a, 0).wlen, threadIdx.x, builders, repeats);
    }
  }
  if (kInPlace) {
    if (!masked) return false;
    __syncthreads();
    for (int64_t win = 1; win < a.windows && !*repeats; ++win) {
      const RowWindow rows = row_window(a, win);
      for (int64_t i = threadIdx.x; i < a.window_rows / 32; i += blockDim.x) mask[i] = 0;
      __syncthreads();
      build_mask(a, mask, rows.w0, rows.wlen, threadIdx.x, blockDim.x, repeats);
      __syncthreads();
    }
    return *repeats != 0;
  }
  if (token_warp) {
    named_barrier_arrive<kMaskReady>(blockDim.x);
  } else {
    named_barrier_sync<kMaskReady>(blockDim.x);
  }
  return false;
}

//! The fused backward (kHeadDim 0: D at run time; kVec: elements a copy access). Out of place each block
//! splits its warps between the token role and a copy role; in place every warp does token work.
//! kGeneral (with kHeadDim 0 only): the interleaved style, partial rotary, table gradients summed over
//! the batch; the default instances hold none of it.
template <typename T, int kHeadDim, int kVec, bool kInPlace, bool kGeneral = false>
__global__ void __launch_bounds__(kMaxBlockThreads) backward_kernel(const FusedArgs<T> a) {
  extern __shared__ __align__(kBulkAlign) uint32_t mask[];
  __shared__ int repeats;
  __shared__ RawIndex next_positions[kMaxBlockThreads / 32];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const bool token_warp = kInPlace || warp < a.token_warps;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (copy_bulk.cuh: the bulk-copy role)
  if (!kInPlace && a.bulk && !token_warp) {
    bulk_copy_role(a, mask, &repeats, lane);
    return;
  }
#endif
  const FirstItem first = token_warp ? first_item<kInPlace, kGeneral>(a, warp, lane) : FirstItem{};
  const TokenLayout<kHeadDim, kTokenVec<kVec>> layout(a.head_dim, a.heads, 1 << a.token_parts_log2);
  // In place, the first item's gK / gV rows go to L2 as soon as its position is in (1.1-1.3 % faster).
  const bool repeat = build_first_mask<kInPlace>(a, mask, &repeats, token_warp, [&] {
    if (a.token_prefetch && first.cursor.item < token_count<kGeneral>(a) << a.token_parts_log2) {
      const int64_t r = position_row(a, first.position);
      if (r >= 0) prefetch_token_rows(a, first.cursor, r, lane);
    }
  });
  if (token_warp) {
    token_role<kInPlace, kGeneral>(a, layout, first, &next_positions[warp], repeat);
    return;
  }
  register_copy_role<T, kHeadDim, kVec>(a, mask, &repeats);
}

}  // namespace kvrope::detail
