// The fused kernel's bulk copy (out of place, sm_90+): one warp a block keeps a ring of chunks of cache
// rows in flight through shared memory with cp.async.bulk; the other warps keep their registers.
#pragma once

#include <cuda/ptx>

#include <cstdint>

#include "../../common/async_copy.cuh"
#include "../../common/divmod.cuh"
#include "../args.cuh"
#include "bitmask.cuh"
#include "bulk_chunks.cuh"

namespace kvrope::detail {

__device__ __forceinline__ bool row_marked(const uint32_t* mask, int64_t local) {
  return (mask[local >> 5] >> (local & 31)) & 1u;
}

// The first row in [from, limit) marked in the mask (window-local rows), or limit, a word at a time;
// with `unmarked`, the first row not marked.
__device__ __forceinline__ int64_t next_marked(const uint32_t* mask, int64_t from, int64_t limit,
                                               bool unmarked = false) {
  for (int64_t base = from & ~int64_t{31}; base < limit; base += 32) {
    uint32_t word = mask[base >> 5] ^ (unmarked ? ~0u : 0u);
    if (base < from) word &= ~0u << (from - base);
    if (word != 0) {
      const int64_t at = base + __ffs(word) - 1;
      return at < limit ? at : limit;
    }
  }
  return limit;
}

// Calls f(r, n) for every maximal run [r, r + n) of chunk c's rows that are not marked in the mask,
// each run by one lane (the lane of its first row, rows lane, lane + 32, ...): a chunk with a few
// rows in cache_position is copied in a few bulk copies, not one per row.
template <typename F>
__device__ __forceinline__ void for_each_unmarked_run(const uint32_t* mask, const BulkWindow& w, const BulkCursor& c,
                                                      int lane, F&& f) {
  const int64_t base = c.r0 - w.w0;  // the chunk's first row in the window
  for (int64_t r = lane; r < c.n; r += 32) {
    if (row_marked(mask, base + r) || (r > 0 && !row_marked(mask, base + r - 1))) continue;
    f(r, next_marked(mask, base + r, base + c.n) - base - r);
  }
}

//! The copy warp's ring: `next` is the next chunk's stage, bit s of `phases` the parity stage s's barrier
//! completes next; `slack` stores may still read their stage when the oldest is refilled.
struct BulkRing {
  unsigned char* stages;
  uint64_t* bars;
  int64_t* chunk_of;  // the chunk each stage holds
  int count, slack;
  int next;
  uint32_t phases;

  __host__ __device__ __forceinline__ int after(int s) const { return s + 1 == count ? 0 : s + 1; }
  __host__ __device__ __forceinline__ unsigned char* stage(int s) const {
    return stages + int64_t{s} * kBulkStageBytes;
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (the bulk-copy role: sm_90+ device code only)

//! Chunk c's rows marked in the mask, and its runs of unmarked rows (each start of one: an unmarked row
//! first in the chunk or after a marked one), the same in every lane: lane k reads the chunk's k-th mask
//! word and the top bit of the word before it (no shuffles), rows outside the chunk counted as marked.
struct ChunkMarks {
  uint32_t marked, runs;

  // Packed in one word (marked | runs << 16; rows a chunk < 2^16), kUnknown where not counted yet.
  static constexpr uint32_t kUnknown = ~0u;
  __device__ __forceinline__ uint32_t packed() const { return marked | runs << 16; }
  __device__ __forceinline__ static ChunkMarks unpacked(uint32_t p) { return {p & 0xffffu, p >> 16}; }
};
// The marks of chunk c's mask words k0, k0 + step, ..., packed (ChunkMarks::packed): a lane's share of
// them (chunk_marks) or all of them (chunk_marks_lane).
__device__ __forceinline__ uint32_t chunk_word_marks(const uint32_t* mask, const BulkWindow& w, const BulkCursor& c,
                                                     int k0, int step) {
  const int base = static_cast<int>(c.r0 - w.w0), end = base + static_cast<int>(c.n);  // rows in the window
  const int first = base >> 5, words = ((end - 1) >> 5) - first + 1;
  uint32_t counts = 0;
  for (int k = k0; k < words; k += step) {
    const int row0 = (first + k) * 32;  // the word's first row
    const uint32_t outside =
        (row0 < base ? ~(~0u << (base - row0)) : 0u) | (row0 + 32 > end ? ~0u << (end - row0) : 0u);
    const uint32_t word = mask[first + k] & ~outside;
    const uint32_t stop = word | outside;                           // rows a run cannot hold
    const uint32_t below = k > 0 ? mask[first + k - 1] >> 31 : 1u;  // the row before the word's first
    counts += __popc(word) | __popc(~stop & (stop << 1 | below)) << 16;
  }
  return counts;
}
__device__ __forceinline__ ChunkMarks chunk_marks(const uint32_t* mask, const BulkWindow& w, const BulkCursor& c,
                                                  int lane) {
  return ChunkMarks::unpacked(__reduce_add_sync(0xffffffffu, chunk_word_marks(mask, w, c, lane, 32)));
}
//! chunk_marks by one lane alone, a word after another.
__device__ __forceinline__ ChunkMarks chunk_marks_lane(const uint32_t* mask, const BulkWindow& w, const BulkCursor& c) {
  return ChunkMarks::unpacked(chunk_word_marks(mask, w, c, 0, 1));
}

// A chunk of this many runs of unmarked rows or more is loaded and stored whole, its marked rows zeroed in the stage
// (random positions 2.81 -> 1.99 x floor against a bulk copy a run); fewer runs: a copy a run, no extra bytes.
inline constexpr uint32_t kBulkWholeChunkRuns = 3;

//! The copy warp's chunks of the first window (blocks drawing tickets ask for their first two).
template <typename T>
__device__ __forceinline__ ChunkSource first_chunks(const FusedArgs<T>& a, const BulkRange& range, int lane) {
  ChunkSource src = ChunkSource::of(range);
  if (a.share_chunks) {
    src.tickets = a.workspace;
    src.shared_first = int64_t{gridDim.x} * a.bulk_per_block;
    src.shared_count = static_cast<uint32_t>(a.bulk_first.total - src.shared_first);
    if (lane == 0) {
      src.ahead0 = atomicAdd(src.tickets, 1u);
      src.ahead1 = atomicAdd(src.tickets, 1u);
    }
  }
  return src;
}

//! After its last ticket a block counts itself done; the grid's last block zeroes the workspace for the
//! next call (fences: every block's tickets before its count, the counts before the reset).
__device__ __forceinline__ void release_tickets(unsigned int* workspace, int lane) {
  if (workspace != nullptr && lane == 0) {
    __threadfence();
    if (atomicAdd(workspace + 1, 1u) == gridDim.x - 1) {
      __threadfence();
      atomicExch(workspace, 0u);
      atomicExch(workspace + 1, 0u);
    }
  }
}

__device__ __forceinline__ void bulk_ring_init(const BulkRing& ring, int lane) {
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kMaxBulkStages; ++s)
      if (s < ring.count) cuda::ptx::mbarrier_init(ring.bars + s, 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncwarp();
}

// Starts loading chunk c (its marks m) into a stage, skipping the rows marked in the mask (their outputs
// are zeros) unless it loads whole (kBulkWholeChunkRuns); without the mask (speculated before it is
// built: m = {0, 1}) every row.
template <typename T>
__device__ __forceinline__ void bulk_load_chunk(const FusedArgs<T>& a, const uint32_t* mask, const BulkWindow& w,
                                                const BulkCursor& c, ChunkMarks m, unsigned char* stage, uint64_t* bar,
                                                bool use_mask, int lane) {
  const HeadRows<const T>& src = c.value ? a.gv : a.gk;
  const uint32_t row_bytes = static_cast<uint32_t>(a.head_dim * int64_t{sizeof(T)});
  const bool consecutive = src.seq_stride == a.head_dim;
  const bool whole = consecutive && (m.marked == 0 || m.runs >= kBulkWholeChunkRuns);  // one copy
  const uint32_t rows = static_cast<uint32_t>(c.n) - (whole ? 0 : m.marked);
  if (whole) {
    if (lane == 0) {
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                           rows * row_bytes);
      bulk_load(stage, src.row(c.b, c.j, c.r0), rows * row_bytes, bar);
    }
    return;
  }
  if (lane == 0)
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                         rows * row_bytes);
  __syncwarp();
  if (consecutive) {  // one copy a run of unmarked rows
    for_each_unmarked_run(mask, w, c, lane, [&](int64_t r, int64_t n) {
      bulk_load(stage + r * row_bytes, src.row(c.b, c.j, c.r0 + r), static_cast<uint32_t>(n) * row_bytes, bar);
    });
    return;
  }
  for (int64_t r = lane; r < c.n; r += 32)
    if (!use_mask || !row_marked(mask, c.r0 - w.w0 + r))
      bulk_load(stage + r * row_bytes, src.row(c.b, c.j, c.r0 + r), row_bytes, bar);
}

//! The block's share of the first window's chunks (bulk_range without its division: the host
//! computed the share).
template <typename T>
__device__ __forceinline__ BulkRange bulk_block_range(const FusedArgs<T>& a, int64_t block) {
  return bulk_range_of(a.bulk_first.total, a.bulk_per_block, block);
}

//! Loads the block's first a.bulk_speculate chunks into stages 0, 1, ... before the bitmask exists, a lane
//! a chunk where rows are consecutive. Returns how many were issued.
template <typename T>
__device__ __forceinline__ int64_t bulk_speculate(const FusedArgs<T>& a, const uint32_t* mask, const BulkRing& ring,
                                                  const BulkRange& range, int lane) {
  const int64_t count = range.end - range.begin < a.bulk_speculate ? range.end - range.begin : a.bulk_speculate;
  if (count <= 0) return 0;
  const BulkWindow& w = a.bulk_first;
  if (a.gk.seq_stride == a.head_dim && a.gv.seq_stride == a.head_dim) {
    if (lane < count) {
      const BulkCursor c = BulkCursor::at(w, range.begin + lane);
      const HeadRows<const T>& src = c.value ? a.gv : a.gk;
      const uint32_t bytes = static_cast<uint32_t>(c.n * a.head_dim * int64_t{sizeof(T)});
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           ring.bars + lane, bytes);
      bulk_load(ring.stage(lane), src.row(c.b, c.j, c.r0), bytes, ring.bars + lane);
    }
    return count;
  }
  BulkCursor c = BulkCursor::at(w, range.begin);
  for (int64_t i = 0; i < count; ++i, c.next(w))
    bulk_load_chunk(a, mask, w, c, ChunkMarks{0, 1}, ring.stage(static_cast<int>(i)), ring.bars + i, false, lane);
  return count;
}

// Writes zeros to `bytes` bytes at `out` (16-byte aligned, a multiple of 16) from the warp's registers.
__device__ __forceinline__ void zero_run(void* out, int64_t bytes, int lane) {
  uint4* p = static_cast<uint4*>(out);
  const int64_t units = bytes / 16;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll 4
  for (int64_t u = lane; u < units; u += 32) __stcs(p + u, zero);
}

// Zeros the marked rows of chunk c's stage, 16 bytes a step, each lane its own rows (a warp a row at a
// time, a dependent chain a row, took case 9 73 us against 39); lane i starts at the row's 16-byte unit i, so
// that the lanes' stores spread over the banks (every row starts on the same bank).
__device__ __forceinline__ void zero_marked_rows(unsigned char* stage, const uint32_t* mask, const BulkWindow& w,
                                                 const BulkCursor& c, int64_t row_bytes, int lane) {
  const int units = static_cast<int>(row_bytes / 16);
  const int first = lane % units;
  for (int64_t r = lane; r < c.n; r += 32) {
    if (!row_marked(mask, c.r0 - w.w0 + r)) continue;
    uint4* row = reinterpret_cast<uint4*>(stage + r * row_bytes);
    for (int i = 0, u = first; i < units; ++i, u = u + 1 == units ? 0 : u + 1) row[u] = make_uint4(0, 0, 0, 0);
  }
}

// Stores chunk c whole from its stage, every row of which is loaded: its marked rows zeroed there first,
// and a proxy fence orders those writes before the bulk store reads them (no cost measured).
// Commits nothing.
template <typename T>
__device__ __forceinline__ void bulk_store_whole(const FusedArgs<T>& a, const uint32_t* mask, const BulkWindow& w,
                                                 const BulkCursor& c, unsigned char* stage, int lane) {
  const int64_t row_bytes = a.head_dim * int64_t{sizeof(T)};
  zero_marked_rows(stage, mask, w, c, row_bytes, lane);  // (with a.token_zeros too: zeros twice)
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  __syncwarp();
  const HeadRows<T>& dst = c.value ? a.gv_out : a.gk_out;
  if (lane == 0) bulk_store(dst.row(c.b, c.j, c.r0), stage, c.n * row_bytes);
}

//! A small cache whose chunks were all speculated: lane i stores chunk i's unmarked runs, so the chunks
//! proceed side by side (the token warps write the zeros). A chunk of kBulkWholeChunkRuns runs or more
//! (scattered positions) is stored whole instead, by the warp, its marked rows zeroed in the stage (a
//! bulk store a run cost scattered small caches 1.9-2.9 x). Consecutive rows only.
template <typename T>
__device__ __forceinline__ void bulk_store_speculated(const FusedArgs<T>& a, const uint32_t* mask, const BulkRing& ring,
                                                      const BulkRange& range, int lane) {
  const BulkWindow& w = a.bulk_first;
  const int64_t row_bytes = a.head_dim * int64_t{sizeof(T)};
  bool whole = false;
  if (lane < range.end - range.begin) {
    const BulkCursor c = BulkCursor::at(w, range.begin + lane);
    const HeadRows<T>& dst = c.value ? a.gv_out : a.gk_out;
    unsigned char* stage = ring.stage(lane);
    const int64_t base = c.r0 - w.w0;                                  // the chunk's first row in the window
    whole = chunk_marks_lane(mask, w, c).runs >= kBulkWholeChunkRuns;  // counted while the load is in flight
    if (!whole) {
      while (!cuda::ptx::mbarrier_try_wait_parity(ring.bars + lane, 0u)) {
      }
      for (int64_t r = 0; r < c.n;) {
        const int64_t end = next_marked(mask, base + r, base + c.n) - base;  // rows [r, end) not marked
        if (end > r) bulk_store(dst.row(c.b, c.j, c.r0 + r), stage + r * row_bytes, (end - r) * row_bytes);
        r = end < c.n ? next_marked(mask, base + end, base + c.n, true) - base : c.n;  // past the marked ones
      }
    }
  }
  for (uint32_t left = __ballot_sync(0xffffffffu, whole); left != 0; left &= left - 1) {
    const int s = __ffs(left) - 1;
    const BulkCursor c = BulkCursor::at(w, range.begin + s);
    while (!cuda::ptx::mbarrier_try_wait_parity(ring.bars + s, 0u)) {
    }
    bulk_store_whole(a, mask, w, c, ring.stage(s), lane);
  }
  cuda::ptx::cp_async_bulk_commit_group();
}

// Stores the loaded chunk to gk_out / gv_out and zeros to its marked rows (unless a.token_zeros). Zeros go
// from registers (no stage writes), except in a chunk stored whole (kBulkWholeChunkRuns: bulk_store_whole). `marks`:
// the chunk's marks as its load counted them, packed (ChunkMarks::kUnknown: a speculated load's chunk).
template <typename T>
__device__ __forceinline__ void bulk_store_chunk(const FusedArgs<T>& a, const uint32_t* mask, const BulkWindow& w,
                                                 const BulkCursor& c, uint32_t marks, unsigned char* stage, int lane) {
  const HeadRows<T>& dst = c.value ? a.gv_out : a.gk_out;
  const int64_t row_bytes = a.head_dim * int64_t{sizeof(T)};
  const ChunkMarks m = marks == ChunkMarks::kUnknown ? chunk_marks(mask, w, c, lane) : ChunkMarks::unpacked(marks);
  const uint32_t marked = m.marked;
  const bool consecutive = dst.seq_stride == a.head_dim;
  if (marked == 0 && consecutive) {
    if (lane == 0) bulk_store(dst.row(c.b, c.j, c.r0), stage, c.n * row_bytes);
  } else if (m.runs >= kBulkWholeChunkRuns && consecutive) {  // every row is in the stage
    bulk_store_whole(a, mask, w, c, stage, lane);
  } else if (marked == static_cast<uint32_t>(c.n) && (consecutive || a.token_zeros)) {
    if (!a.token_zeros) zero_run(dst.row(c.b, c.j, c.r0), c.n * row_bytes, lane);
  } else {
    for (int64_t r = lane; r < c.n; r += 32) {  // each lane its own rows
      T* out = dst.row(c.b, c.j, c.r0 + r);
      if (row_marked(mask, c.r0 - w.w0 + r)) {
        if (a.token_zeros) continue;  // the token warps write this row's zeros
        const uint4 zero = make_uint4(0, 0, 0, 0);
        for (int64_t i = 0; i < row_bytes / 16; ++i) __stcs(reinterpret_cast<uint4*>(out) + i, zero);
      } else if (!consecutive) {
        bulk_store(out, stage + r * row_bytes, row_bytes);
      }
    }
    if (consecutive) {  // the loaded rows: one store per run of unmarked rows
      for_each_unmarked_run(mask, w, c, lane, [&](int64_t r, int64_t n) {
        bulk_store(dst.row(c.b, c.j, c.r0 + r), stage + r * row_bytes, n * row_bytes);
      });
    }
  }
  cuda::ptx::cp_async_bulk_commit_group();
}

// Waits until at most `pending` of this thread's bulk stores are still reading shared memory.
__device__ __forceinline__ void bulk_wait_reads(int pending) {
  switch (pending) {  // the count is an immediate of the instruction
    case 0: cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); break;
    case 1: cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{}); break;
    case 2: cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<2>{}); break;
    case 3: cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<3>{}); break;
    case 4: cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<4>{}); break;
    case 5: cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<5>{}); break;
    case 6: cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<6>{}); break;
    default: cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<7>{}); break;
  }
}

//! The copy warp's chunks of one window (the first `prefetched` already speculated): wait for chunk i,
//! store it, refill the stage of chunk i - slack + 1; count - slack loads and slack stores in flight.
template <typename T>
__device__ void bulk_copy_window(const FusedArgs<T>& a, const uint32_t* mask, const BulkWindow& w, BulkRing& ring,
                                 ChunkSource& src, int64_t prefetched, int lane) {
  int load_stage = ring.next, store_stage = ring.next;
  int64_t issued = 0;  // chunks taken (and loaded, or prefetched)
  bool more = true;
  uint32_t stage_marks = ChunkMarks::kUnknown;  // lane s: the marks of stage s's chunk, packed, from its load
  auto issue = [&] {
    int64_t c = 0;
    more = src.take(&c, lane);
    if (!more) return;
    uint32_t marks = ChunkMarks::kUnknown;
    if (issued >= prefetched) {
      const BulkCursor cursor = BulkCursor::at(w, c);
      const ChunkMarks m = chunk_marks(mask, w, cursor, lane);
      bulk_load_chunk(a, mask, w, cursor, m, ring.stage(load_stage), ring.bars + load_stage, true, lane);
      marks = m.packed();
    }
    if (lane == load_stage) stage_marks = marks;
    if (lane == 0) ring.chunk_of[load_stage] = c;
    __syncwarp();
    ++issued;
    load_stage = ring.after(load_stage);
  };
  while (more && issued < ring.count) issue();
  for (int64_t i = 0; i < issued; ++i) {
    const uint32_t parity = (ring.phases >> store_stage) & 1u;
    while (!cuda::ptx::mbarrier_try_wait_parity(ring.bars + store_stage, parity)) {
    }
    ring.phases ^= 1u << store_stage;
    const uint32_t marks = __shfl_sync(0xffffffffu, stage_marks, store_stage);
    bulk_store_chunk(a, mask, w, BulkCursor::at(w, ring.chunk_of[store_stage]), marks, ring.stage(store_stage), lane);
    store_stage = ring.after(store_stage);
    if (i - ring.slack + 1 >= 0 && more) {  // refill the stage of chunk i - slack + 1
      bulk_wait_reads(ring.slack - 1);
      __syncwarp();
      issue();
    }
  }
  bulk_wait_reads(0);  // the stages are free again
  __syncwarp();
  ring.next = store_stage;  // every chunk loaded was stored: load_stage == store_stage
}

//! Before the copy warp exits: every bulk store complete.
__device__ __forceinline__ void bulk_drain() { cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{}); }

//! The bulk-copy role: the block's one copy warp (out of place, 16-byte rows, sm_90+). Its first chunks
//! are loaded before the bitmask exists; it waits for the token warps' bitmask (kMaskReady), then copies.
template <typename T>
__device__ __forceinline__ void bulk_copy_role(const FusedArgs<T>& a, uint32_t* mask, int* repeats, int lane) {
  BulkRing ring{reinterpret_cast<unsigned char*>(mask) + bulk_ring_offset(mask_bytes(a.window_rows)),
                nullptr,
                nullptr,
                a.bulk_stages,
                a.bulk_slack,
                0,
                0u};
  ring.bars = reinterpret_cast<uint64_t*>(ring.stage(ring.count));
  ring.chunk_of = reinterpret_cast<int64_t*>(ring.bars + ring.count);
  const BulkRange first_range = bulk_block_range(a, blockIdx.x);
  bulk_ring_init(ring, lane);
  const int64_t prefetched = bulk_speculate(a, mask, ring, first_range, lane);
  ChunkSource first_src = first_chunks(a, first_range, lane);
  named_barrier_sync<kMaskReady>(blockDim.x);
  if (a.windows == 1 && prefetched > 0 && prefetched == first_range.end - first_range.begin && a.token_zeros &&
      !a.share_chunks && a.gk_out.seq_stride == a.head_dim && a.gv_out.seq_stride == a.head_dim) {
    bulk_store_speculated(a, mask, ring, first_range, lane);  // a small cache: every chunk in a stage
  } else {
    bulk_copy_window(a, mask, a.bulk_first, ring, first_src, prefetched, lane);
    for (int64_t win = 1; win < a.windows; ++win) {  // (the host shares chunks only with one window)
      const RowWindow rows = row_window(a, win);
      copy_warps_mask(a, mask, rows, lane, 32, repeats);
      const BulkWindow w = bulk_window(a, rows);
      ChunkSource src = ChunkSource::of(bulk_range(w, blockIdx.x, gridDim.x));
      bulk_copy_window(a, mask, w, ring, src, 0, lane);
    }
    release_tickets(a.workspace, lane);
  }
  bulk_drain();
}

#endif

}  // namespace kvrope::detail
