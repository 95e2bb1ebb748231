// The bulk copy's chunks: a window's cache rows cut into chunks of consecutive rows, numbered cache-major,
// then batch, head, rows; how blocks share them. Host and device (the planner sizes them).
#pragma once

#include <cstdint>

#include "../../common/divmod.cuh"
#include "../args.cuh"
#include "../policy.cuh"
#include "bitmask.cuh"

namespace kvrope::detail {

//! A chunk, and the walk from one to the next without divisions: the copy warp is a single warp,
//! so every instruction of its per-chunk work is on the critical path.
struct BulkCursor {
  int64_t k, j, b;  // chunk within the slab, head, batch
  bool value;       // gv (else gk)
  int64_t r0, n;    // its rows [r0, r0 + n)

  __host__ __device__ __forceinline__ void rows(const BulkWindow& w) {
    r0 = w.w0 + k * w.rows_per_chunk;
    n = w.w0 + w.wlen - r0 < w.rows_per_chunk ? w.w0 + w.wlen - r0 : w.rows_per_chunk;
  }
  __host__ __device__ __forceinline__ static BulkCursor at(const BulkWindow& w, int64_t c) {
    BulkCursor out;
    uint64_t k = 0, j = 0;
    const int64_t slab = static_cast<int64_t>(w.div_slab.divmod(static_cast<uint64_t>(c), k));
    out.k = static_cast<int64_t>(k);
    out.value = slab >= w.batch * w.heads;
    const int64_t bh = out.value ? slab - w.batch * w.heads : slab;
    out.b = static_cast<int64_t>(w.div_heads.divmod(static_cast<uint64_t>(bh), j));
    out.j = static_cast<int64_t>(j);
    out.rows(w);
    return out;
  }
  __host__ __device__ __forceinline__ void next(const BulkWindow& w) {
    if (++k == w.per_slab) {
      k = 0;
      if (++j == w.heads) {
        j = 0;
        if (++b == w.batch) {
          b = 0;
          value = true;
        }
      }
    }
    rows(w);
  }
};

//! The block's share of a window's chunks: a contiguous range, so that its cursor only walks forward.
struct BulkRange {
  int64_t begin, end;
};
//! Chunks each of `blocks` blocks takes of `total`, in contiguous ranges.
__host__ __device__ __forceinline__ int64_t bulk_chunks_per_block(int64_t total, int64_t blocks) {
  return (total + blocks - 1) / blocks;
}
//! Block `block`'s range when every block takes `per_block` of the `total` chunks.
__host__ __device__ __forceinline__ BulkRange bulk_range_of(int64_t total, int64_t per_block, int64_t block) {
  const int64_t begin = block * per_block < total ? block * per_block : total;
  return {begin, begin + per_block < total ? begin + per_block : total};
}
__host__ __device__ __forceinline__ BulkRange bulk_range(const BulkWindow& w, int64_t block, int64_t blocks) {
  return bulk_range_of(w.total, bulk_chunks_per_block(w.total, blocks), block);
}

//! A copy warp's chunks: its block's range, then (FusedArgs::share_chunks) tickets drawn from a counter
//! all blocks share, so faster SMs copy more (copy-heavy cases 5-7 % faster). Lane 0 holds two tickets asked ahead.
struct ChunkSource {
  int64_t next, end;          // the block's range still to take
  int64_t shared_first = 0;   // the first chunk handed out by ticket
  uint32_t shared_count = 0;  // chunks handed out by ticket (0: none)
  unsigned int* tickets = nullptr;
  uint32_t ahead0 = 0, ahead1 = 0;  // lane 0: the next two tickets; `odd` says which is older
  bool odd = false;

  __device__ __forceinline__ static ChunkSource of(const BulkRange& r) { return ChunkSource{r.begin, r.end}; }

  // All lanes alike; returns false when the warp's chunks are done.
  __device__ __forceinline__ bool take(int64_t* chunk, int lane) {
    if (next < end) {
      *chunk = next++;
      return true;
    }
    if (shared_count == 0) return false;
    uint32_t t = 0;
    if (lane == 0) {
      // The older ticket is used and its register refilled; the other stays in flight.
      if (odd) {
        t = ahead1;
        if (t < shared_count) ahead1 = atomicAdd(tickets, 1u);
      } else {
        t = ahead0;
        if (t < shared_count) ahead0 = atomicAdd(tickets, 1u);
      }
    }
    odd = !odd;
    t = __shfl_sync(0xffffffffu, t, 0);
    if (t >= shared_count) {
      shared_count = 0;
      return false;
    }
    *chunk = shared_first + t;
    return true;
  }
};

template <typename T>
__host__ __device__ __forceinline__ BulkWindow bulk_window(const FusedArgs<T>& a, const RowWindow& rows) {
  const int64_t stage_rows = kBulkStageBytes / (a.head_dim * int64_t{sizeof(T)});
  const int64_t chunk_rows = a.bulk_chunk_rows > 0 && a.bulk_chunk_rows < stage_rows ? a.bulk_chunk_rows : stage_rows;
  BulkWindow w{rows.w0, rows.wlen, chunk_rows, 0, 0, a.heads, a.batch, {}, {}};
  w.per_slab = (rows.wlen + w.rows_per_chunk - 1) / w.rows_per_chunk;
  w.total = 2 * a.batch * a.heads * w.per_slab;
  w.div_slab = FastDivmod(static_cast<uint32_t>(w.per_slab));
  w.div_heads = FastDivmod(static_cast<uint32_t>(a.heads));
  return w;
}

}  // namespace kvrope::detail
