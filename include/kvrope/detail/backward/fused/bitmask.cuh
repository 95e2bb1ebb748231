// The fused kernel's bitmask of the cache rows named by cache_position, one bit a row in shared memory,
// and the named barriers of the warps that build and read it.
#pragma once

#include <cstdint>

#include "../args.cuh"
#include "../policy.cuh"
#include "../token_io.cuh"

namespace kvrope::detail {

//! The cache rows [w0, w0 + wlen) one bitmask covers.
struct RowWindow {
  int64_t w0, wlen;
};

template <typename T>
__host__ __device__ __forceinline__ RowWindow row_window(const FusedArgs<T>& a, int64_t win) {
  const int64_t w0 = win * a.window_rows;
  return {w0, a.cache_len - w0 < a.window_rows ? a.cache_len - w0 : a.window_rows};
}

//! Hardware barrier ids of the fused kernel besides __syncthreads (id 0).
enum NamedBarrier : int {
  kCopyWarps = 1,     //!< the copy warps alone (a later window's bitmask)
  kMaskReady = 2,     //!< the token warps arrive with their share of the bitmask, the copy warps wait
  kMaskBuilders = 3,  //!< the bitmask's builders alone (the token warps, beside the bulk-copy warp)
};

template <NamedBarrier kId>
__device__ __forceinline__ void named_barrier_sync(int threads) {
  asm volatile("bar.sync %0, %1;" ::"n"(static_cast<int>(kId)), "r"(threads) : "memory");
}
template <NamedBarrier kId>
__device__ __forceinline__ void named_barrier_arrive(int threads) {
  asm volatile("bar.arrive %0, %1;" ::"n"(static_cast<int>(kId)), "r"(threads) : "memory");
}

struct NoHook {
  __device__ void operator()() const {}
};

// Marks the rows [w0, w0 + wlen) named by cache_position in `mask`; sets *repeats when a row is named
// twice. `after_loads` runs once a thread, when its first loads are issued and before any is awaited.
template <typename T, typename F = NoHook>
__device__ void build_mask(const FusedArgs<T>& a, uint32_t* mask, int64_t w0, int64_t wlen, int thread, int threads,
                           int* repeats, F&& after_loads = {}) {
  bool hooked = false;
  for (int64_t t0 = thread; t0 < a.seq_len; t0 += kMaskLoads * int64_t{threads}) {
    // All loads before any arithmetic on one; slots past the end reload t0 so no branch splits them.
    RawIndex raw[kMaskLoads];
#pragma unroll
    for (int u = 0; u < kMaskLoads; ++u) {
      const int64_t t = t0 + u * int64_t{threads};
      raw[u] = load_position(a, t < a.seq_len ? t : t0);
    }
    if (!hooked) {
      hooked = true;
      after_loads();
    }
#pragma unroll
    for (int u = 0; u < kMaskLoads; ++u) {
      const int64_t r = t0 + u * int64_t{threads} < a.seq_len ? position_row(a, raw[u]) : -1;
      if (r >= w0 && r < w0 + wlen) {
        const uint32_t bit = 1u << ((r - w0) & 31);
        if (atomicOr(&mask[(r - w0) >> 5], bit) & bit) atomicOr(repeats, 1);
      }
    }
  }
  if (!hooked) after_loads();
}

// The copy warps' own bitmask of window w (the token warps of the block do not take part).
template <typename T>
__device__ __forceinline__ void copy_warps_mask(const FusedArgs<T>& a, uint32_t* mask, const RowWindow& w,
                                                int copy_thread, int copy_threads, int* repeats) {
  named_barrier_sync<kCopyWarps>(copy_threads);
  for (int64_t i = copy_thread; i < a.window_rows / 32; i += copy_threads) mask[i] = 0;
  named_barrier_sync<kCopyWarps>(copy_threads);
  build_mask(a, mask, w.w0, w.wlen, copy_thread, copy_threads, repeats);
  named_barrier_sync<kCopyWarps>(copy_threads);
}

}  // namespace kvrope::detail
