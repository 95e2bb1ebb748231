// Positions and indices as the kernels load them (int32 or int64 arrays), and the cache row a position names.
#pragma once

#include <cstdint>

namespace kvrope::detail {

//! An index as loaded, its words not yet looked at (int32: `lo`, `hi` zero): arithmetic where it is
//! loaded would wait for the load there, so index_value forms it where it is used. 8-byte aligned: the
//! target of an 8-byte cp.async.
struct alignas(8) RawIndex {
  uint32_t lo = 0, hi = 0;
};

__device__ __forceinline__ RawIndex load_raw_index(const void* array, bool is_int64, int64_t index) {
  RawIndex r;
  if (is_int64) {
    const uint2 v = static_cast<const uint2*>(array)[index];
    r.lo = v.x;
    r.hi = v.y;
  } else {
    r.lo = static_cast<const uint32_t*>(array)[index];
  }
  return r;
}

__host__ __device__ __forceinline__ int64_t index_value(const RawIndex& r, bool is_int64) {
  return is_int64 ? static_cast<int64_t>((uint64_t{r.hi} << 32) | r.lo) : int64_t{static_cast<int32_t>(r.lo)};
}

//! The cache row position `p` names (negatives wrap once, as in PyTorch indexing), or -1 when it is
//! outside [-cache_len, cache_len).
__host__ __device__ __forceinline__ int64_t wrapped_row(int64_t p, int64_t cache_len) {
  if (p < 0) p += cache_len;
  return p >= 0 && p < cache_len ? p : -1;
}

}  // namespace kvrope::detail
