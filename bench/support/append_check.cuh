// The serve suites' check, on the device (a decode case's caches are 16 GiB): element-wise distances, in
// units in the last place of the element's own format, between kv_cache_rope_append's outputs and the naive
// reference's, and a scan of the whole caches for rows written that no token names; for the cases checked on
// the host (NVFP4, mRoPE, MLA), the scan, the gather of the rows written and the NVFP4 oracle's answers.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <kvrope/append_params.cuh>
#include <kvrope/detail/common/nvfp4.cuh>

namespace kvrope_bench {

// What one region of the outputs compared: elements, those not bit-identical, those beyond the region's
// tolerance, the largest distance and the first element beyond it (UINT64_MAX: none).
struct CompareCounts {
  unsigned long long elements = 0, not_exact = 0, bad = 0, first_bad = ~0ull;
  unsigned int max_dist = 0, unused = 0;
};

enum AppendRegion : int {
  kRegionQ,
  kRegionK,
  kRegionV,
  kRegionKeyRows,
  kRegionValueRows,
  kRegionKeyOther,
  kRegionValueOther,
  kAppendRegions
};

inline const char* append_region_name(int r) {
  constexpr const char* names[] = {
      "q", "k", "v", "key cache rows", "value cache rows", "key cache elsewhere", "value cache elsewhere"};
  return names[r];
}

template <typename E>
__device__ inline uint32_t bits_of(E x) {
  static_assert(sizeof(E) <= 4, "16- and 8-bit formats (and fp32)");
  uint32_t u = 0;
  memcpy(&u, &x, sizeof(E));
  return u;
}

template <typename E>
__device__ inline float value_of(E x) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else if constexpr (std::is_same_v<E, __half>) {
    return __half2float(x);
  } else if constexpr (std::is_same_v<E, float>) {
    return x;
  } else {
    return static_cast<float>(x);  // fp8
  }
}

// Units in the last place between a and b (sign-magnitude bits mapped onto a line, +0 = -0): 0 when the bits
// match, UINT_MAX when either is NaN (and the bits differ).
template <typename E>
__device__ inline uint32_t ulp_distance(E a, E b) {
  const uint32_t ua = bits_of(a), ub = bits_of(b);
  if (ua == ub) return 0;
  if (isnan(value_of(a)) || isnan(value_of(b))) return 0xFFFFFFFFu;
  constexpr uint32_t sign = 1u << (8 * sizeof(E) - 1);
  const int64_t oa = (ua & sign) ? -static_cast<int64_t>(ua & ~sign) : static_cast<int64_t>(ua);
  const int64_t ob = (ub & sign) ? -static_cast<int64_t>(ub & ~sign) : static_cast<int64_t>(ub);
  const int64_t d = oa > ob ? oa - ob : ob - oa;
  return d >= 0xFFFFFFFFll ? 0xFFFFFFFEu : static_cast<uint32_t>(d);
}

//! Values this close are one rounding apart whatever their ulps: fp32 evaluation orders of x c - y s
//! differ by a few fp32 ulps of |x| + |y| (normal inputs), which near zero is many ulps of the result.
inline constexpr float kAppendAbsTolerance = 1.0f / (1 << 18);

// The distance a region with tolerance `tol` counts: ulp_distance, but where a tolerance is given at
// most 1 when the values differ by kAppendAbsTolerance or less.
template <typename E>
__device__ inline uint32_t rounding_distance(E a, E b, uint32_t tol) {
  const uint32_t d = ulp_distance(a, b);
  return tol > 0 && d > 1 && fabsf(value_of(a) - value_of(b)) <= kAppendAbsTolerance ? 1u : d;
}

// One thread's share of a region, added to the device counts once at its end.
struct LocalCounts {
  unsigned long long elements = 0, not_exact = 0, bad = 0, first_bad = ~0ull;
  unsigned int max_dist = 0;
  __device__ void add(uint32_t dist, uint32_t tol, unsigned long long index) {
    ++elements;
    if (dist == 0) return;
    ++not_exact;
    if (dist > max_dist) max_dist = dist;
    if (dist > tol) {
      ++bad;
      if (index < first_bad) first_bad = index;
    }
  }
  __device__ void flush(CompareCounts* c) const {
    if (elements == 0) return;
    atomicAdd(&c->elements, elements);
    if (not_exact == 0) return;
    atomicAdd(&c->not_exact, not_exact);
    atomicMax(&c->max_dist, max_dist);
    if (bad == 0) return;
    atomicAdd(&c->bad, bad);
    atomicMin(&c->first_bad, first_bad);
  }
};

__device__ inline int64_t check_begin() { return blockIdx.x * int64_t{blockDim.x} + threadIdx.x; }
__device__ inline int64_t check_stride() { return int64_t{gridDim.x} * blockDim.x; }

//! The packed qkv [T, W] after a call against what it should hold: columns [0, q_end) q (want_q, within
//! tol_q), [q_end, k_end) k (want_k, within tol_k), the rest v (want_v, bit-exact).
template <typename T>
__global__ void compare_qkv(const T* got, const T* want_q, const T* want_k, const T* want_v, int64_t n, int64_t W,
                            int64_t q_end, int64_t k_end, uint32_t tol_q, uint32_t tol_k, CompareCounts* counts) {
  LocalCounts q, k, v;
  for (int64_t i = check_begin(); i < n; i += check_stride()) {
    const int64_t col = i % W;
    const unsigned long long at = static_cast<unsigned long long>(i);
    if (col < q_end) {
      q.add(rounding_distance(got[i], want_q[i], tol_q), tol_q, at);
    } else if (col < k_end) {
      k.add(rounding_distance(got[i], want_k[i], tol_k), tol_k, at);
    } else {
      v.add(ulp_distance(got[i], want_v[i]), 0, at);
    }
  }
  q.flush(counts + kRegionQ);
  k.flush(counts + kRegionK);
  v.flush(counts + kRegionV);
}

//! Every element of a paged cache (slots [0, slots), H heads, D elements): a slot that token t writes
//! (writer[slot] = t) against row t of `want` [T, H, D] within tol; any other slot must still hold the fill
//! pattern. The index of a bad element is (slot H + h) D + d.
template <typename C>
__global__ void compare_cache(kvrope::PagedCache<const C> cache, int64_t P, int64_t H, int64_t D, int64_t slots,
                              const int* writer, const C* want, uint32_t pattern, uint32_t tol, CompareCounts* rows,
                              CompareCounts* other) {
  LocalCounts written, rest;
  const int64_t n = slots * H * D;
  for (int64_t i = check_begin(); i < n; i += check_stride()) {
    const int64_t d = i % D, h = (i / D) % H, slot = i / (D * H);
    const C got = cache.row(slot / P, slot % P, h)[d];
    const int t = writer[slot];
    const unsigned long long at = static_cast<unsigned long long>(i);
    if (t >= 0) {
      written.add(rounding_distance(got, want[(t * H + h) * D + d], tol), tol, at);
    } else {
      rest.add(bits_of(got) == pattern ? 0u : 1u, 0, at);
    }
  }
  written.flush(rows);
  rest.flush(other);
}

//! The groups checked against the float64 reference (NVFP4 caches, mRoPE: support/append_case.cuh,
//! check_reference; MLA: support/mla_case.cuh): every byte of a cache's rows (or of its NVFP4 block scales) that no
//! token writes (writer[slot] < 0) still holds the fill pattern. `cache` is viewed in bytes (strides in bytes), rows of
//! row_bytes; the index of a bad byte is (slot H + h) row_bytes + b.
__global__ void compare_untouched_rows(kvrope::PagedCache<const uint8_t> cache, int64_t row_bytes, int64_t P, int64_t H,
                                       int64_t slots, const int* writer, uint8_t pattern, CompareCounts* other) {
  LocalCounts rest;
  const int64_t n = slots * H * row_bytes;
  for (int64_t i = check_begin(); i < n; i += check_stride()) {
    const int64_t b = i % row_bytes, h = (i / row_bytes) % H, slot = i / (row_bytes * H);
    if (writer[slot] >= 0) continue;
    rest.add(cache.row(slot / P, slot % P, h)[b] == pattern ? 0u : 1u, 0, static_cast<unsigned long long>(i));
  }
  rest.flush(other);
}

//! Row t of `rows` [T, H, row_bytes] = the bytes of the cache row of slots[t] (strides in bytes; every slot
//! in range: the suites' cases).
__global__ void gather_row_bytes(kvrope::PagedCache<const uint8_t> cache, const int64_t* slots, int64_t P, int64_t H,
                                 int64_t row_bytes, int64_t n, uint8_t* rows) {
  for (int64_t i = check_begin(); i < n; i += check_stride()) {
    const int64_t b = i % row_bytes, h = (i / row_bytes) % H, t = i / (row_bytes * H);
    const int64_t slot = slots[t];
    rows[i] = cache.row(slot / P, slot % P, h)[b];
  }
}

//! One (amax, global scale) a thread: an NVFP4 block scale's quotient and reciprocal as the GPU computes them
//! (kvrope::detail::nvfp4_block_scale, the kernels' own instructions), for check_append's oracle
//! (verify::Nvfp4Oracle): with them it compares each block bit for bit.
__global__ void nvfp4_block_scale_answers(const float* asked, int64_t n, float* answers) {
  for (int64_t i = check_begin(); i < n; i += check_stride()) {
    const kvrope::detail::Nvfp4Scale s = kvrope::detail::nvfp4_block_scale(asked[2 * i], asked[2 * i + 1]);
    answers[2 * i] = s.quotient;
    answers[2 * i + 1] = s.inv;
  }
}

//! Row t of `rows` [T, H, D] = the cache row of slots[t] (every slot in range: the suites' cases).
template <typename C>
__global__ void gather_cache_rows(kvrope::PagedCache<const C> cache, const int64_t* slots, int64_t P, int64_t H,
                                  int64_t D, int64_t n, C* rows) {
  for (int64_t i = check_begin(); i < n; i += check_stride()) {
    const int64_t d = i % D, h = (i / D) % H, t = i / (D * H);
    const int64_t slot = slots[t];
    rows[i] = cache.row(slot / P, slot % P, h)[d];
  }
}

}  // namespace kvrope_bench
