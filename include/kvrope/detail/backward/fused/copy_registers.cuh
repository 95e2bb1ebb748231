// The fused kernel's register copy: copy warps move the cache rows not in cache_position through
// registers (out of place, where the bulk copy does not run: unaligned rows, or before sm_90).
#pragma once

#include <cstdint>

#include "../../../core/vec.cuh"
#include "../../common/divmod.cuh"
#include "../args.cuh"
#include "../policy.cuh"
#include "bitmask.cuh"

namespace kvrope::detail {

template <int kDivisor>
__device__ __forceinline__ uint64_t divmod_by(uint64_t n, uint64_t& rem, const FastDivmod& runtime) {
  if constexpr (kDivisor > 0) {
    const uint64_t q = n / kDivisor;
    rem = n - q * kDivisor;
    return q;
  } else {
    return runtime.divmod(n, rem);
  }
}

// Out-of-place copy work over the cache rows [w0, w0 + wlen) of every (b, head): rows marked in the
// bitmask are written as zeros without being read, all others are copied.
template <typename T, int kHeadDim, int kVec>
__device__ void copy_window(const FusedArgs<T>& a, const uint32_t* mask, int64_t w0, int64_t wlen, uint64_t thread,
                            uint64_t threads) {
  using V = Vec<T, kVec>;
  constexpr int kRowVecs = kHeadDim > 0 ? kHeadDim / kVec : 0;
  const int64_t row_vecs = a.head_dim / kVec;
  const FastDivmod div_row_vecs(static_cast<uint32_t>(row_vecs));
  const FastDivmod div_wlen(static_cast<uint32_t>(wlen));
  const uint64_t per_tensor = static_cast<uint64_t>(a.batch * a.heads * wlen * row_vecs);
  const uint64_t total = 2 * per_tensor;
  const uint64_t stride = threads;
  for (uint64_t base = thread; base < total; base += stride * kCopyUnroll) {
    V value[kCopyUnroll];
    T* dst[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const uint64_t i = base + u * stride;
      dst[u] = nullptr;
      if (i < total) {
        const bool is_value = i >= per_tensor;
        uint64_t c, s_local, j;
        const uint64_t row = divmod_by<kRowVecs>(is_value ? i - per_tensor : i, c, div_row_vecs);
        const uint64_t outer = div_wlen.divmod(row, s_local);
        const uint64_t b = a.div_heads.divmod(outer, j);
        const int64_t s = w0 + static_cast<int64_t>(s_local);
        const int64_t col = static_cast<int64_t>(c) * kVec;
        const bool zero = (mask[s_local >> 5] >> (s_local & 31)) & 1u;
        const HeadRows<const T>& src = is_value ? a.gv : a.gk;
        if (zero && a.token_zeros) continue;  // the token warps write this row's zeros
        dst[u] = (is_value ? a.gv_out : a.gk_out).row(b, j, s) + col;
        value[u] = zero ? V::zeros() : load_vec<cub::LOAD_CS, T, kVec>(src.row(b, j, s) + col);
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (dst[u]) store_vec<cub::STORE_CS>(dst[u], value[u]);
    }
  }
}

//! The register-copy role: copy warps [token_warps, warps) of every block, once the first window's
//! bitmask is built; a later window's bitmask they build alone.
template <typename T, int kHeadDim, int kVec>
__device__ __forceinline__ void register_copy_role(const FusedArgs<T>& a, uint32_t* mask, int* repeats) {
  const int copy_threads = blockDim.x - a.token_warps * 32;
  const int copy_thread = threadIdx.x - a.token_warps * 32;
  const uint64_t thread = uint64_t{blockIdx.x} * copy_threads + copy_thread;
  const uint64_t threads = uint64_t{gridDim.x} * copy_threads;
  for (int64_t win = 0; win < a.windows; ++win) {
    const RowWindow rows = row_window(a, win);
    if (win > 0) copy_warps_mask(a, mask, rows, copy_thread, copy_threads, repeats);
    copy_window<T, kHeadDim, kVec>(a, mask, rows.w0, rows.wlen, thread, threads);
  }
}

}  // namespace kvrope::detail
