// The out-of-place cache copy through shared memory with the bulk-copy engine (cp.async.bulk, sm_90
// and later): one warp per block keeps a ring of chunks of cache rows in flight, with no register
// holding data, so the other warps of the block keep all their registers for the token work.
#pragma once

#include <cuda/ptx>

#include <cstdint>

#include "../core/divmod.cuh"
#include "backward_args.cuh"
#include "trace.cuh"

namespace kvrope::detail {

// Experiment knob (docs/perf-notes.md): -DKVROPE_BULK_STAGE_BYTES=N. The number of stages and how
// many stores may still be reading their stage are run-time launch parameters (LaunchTuning).
#ifndef KVROPE_BULK_STAGE_BYTES
#define KVROPE_BULK_STAGE_BYTES 32768
#endif
inline constexpr int kBulkStageBytes = KVROPE_BULK_STAGE_BYTES;  // bytes of one chunk at most
inline constexpr int kMaxBulkStages = 6;                         // stages of the ring at most
inline constexpr int kMaxBulkSlack = 8;                          // stores still reading their stage at most
inline constexpr int kBulkAlign = 128;

//! Offset of the stage ring in the kernel's dynamic shared memory, after the bitmask.
__host__ __device__ inline constexpr int64_t bulk_ring_offset(int64_t mask_bytes) {
  return (mask_bytes + kBulkAlign - 1) / kBulkAlign * kBulkAlign;
}
//! Bytes of a ring of `stages` stages, their barriers and the index of the chunk each holds.
__host__ __device__ inline constexpr int64_t bulk_ring_bytes(int stages) {
  return int64_t{stages} * (kBulkStageBytes + 16);
}


//! The cache rows [w0, w0 + wlen) one shared-memory bitmask covers.
struct RowWindow {
  int64_t w0, wlen;
};

template <typename T>
__host__ __device__ __forceinline__ RowWindow row_window(const BackwardArgs<T>& a, int64_t win) {
  const int64_t w0 = win * a.window_rows;
  return {w0, a.cache_len - w0 < a.window_rows ? a.cache_len - w0 : a.window_rows};
}

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

//! The chunks of a window a copy warp copies, in order: its block's range, then, when the blocks
//! share the rest (BackwardArgs::share_chunks), chunks `shared_first + t` for tickets t drawn from a
//! counter all blocks draw from, until a ticket is past the last chunk. A block that streams faster
//! draws more (docs/perf-notes.md, v6: the SMs' shares of the bandwidth differ by up to 30 %, and a
//! fixed share per block left the copy as slow as its slowest block). Lane 0 keeps two tickets
//! asked for in advance, in two registers used in turn, so a take reads the ticket asked for two
//! takes before and never waits for the one just asked for.
struct ChunkSource {
  int64_t next, end;              // the block's range still to take
  int64_t shared_first = 0;       // the first chunk handed out by ticket
  uint32_t shared_count = 0;      // chunks handed out by ticket (0: none)
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
__host__ __device__ __forceinline__ BulkWindow bulk_window(const BackwardArgs<T>& a, const RowWindow& rows) {
  const int64_t stage_rows = kBulkStageBytes / (a.head_dim * int64_t{sizeof(T)});
  const int64_t chunk_rows = a.bulk_chunk_rows > 0 && a.bulk_chunk_rows < stage_rows ? a.bulk_chunk_rows : stage_rows;
  BulkWindow w{rows.w0, rows.wlen, chunk_rows, 0, 0, a.heads, a.batch, {}, {}};
  w.per_slab = (rows.wlen + w.rows_per_chunk - 1) / w.rows_per_chunk;
  w.total = 2 * a.batch * a.heads * w.per_slab;
  w.div_slab = FastDivmod(static_cast<uint32_t>(w.per_slab));
  w.div_heads = FastDivmod(static_cast<uint32_t>(a.heads));
  return w;
}

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

//! The ring of stages of the copy warp: `next` is the stage the next chunk goes through, and bit s
//! of `phases` the parity stage s's barrier completes next (each use of a stage completes one phase).
//! `slack`: how many chunk stores may still be reading their stage when the oldest stage is refilled
//! (1 <= slack < count). Stepped by increments only: no division on the single warp's path.
struct BulkRing {
  unsigned char* stages;
  uint64_t* bars;
  int64_t* chunk_of;  // the chunk each stage holds
  int count, slack;
  int next;
  uint32_t phases;

  __host__ __device__ __forceinline__ int after(int s) const { return s + 1 == count ? 0 : s + 1; }
  __host__ __device__ __forceinline__ unsigned char* stage(int s) const { return stages + int64_t{s} * kBulkStageBytes; }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KVROPE_HAS_BULK_COPY 1

// Rows of chunk c marked in the mask, counted over the warp (each lane tests rows lane, lane + 32, ...).
// (Here, with the bulk copy that alone uses it: __reduce_add_sync is sm_80 and later.)
__device__ __forceinline__ uint32_t marked_rows(const uint32_t* mask, const BulkWindow& w, const BulkCursor& c,
                                                int lane) {
  uint32_t marked = 0;
  for (int64_t r = lane; r < c.n; r += 32) marked += row_marked(mask, c.r0 - w.w0 + r);
  return __reduce_add_sync(0xffffffffu, marked);
}

// A bulk load into this block's shared memory: the .shared::cta destination where the PTX ISA has it
// (8.6, CUDA 12.8), else the .shared::cluster form with this block's own address.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if __cccl_ptx_isa >= 860
  cuda::ptx::cp_async_bulk(cuda::ptx::space_shared, cuda::ptx::space_global, dst, src, bytes, bar);
#else
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, bytes, bar);
#endif
}

// A bulk store of this block's shared memory to global memory (completion: bulk groups).
__device__ __forceinline__ void bulk_store(void* dst, const void* src, int64_t bytes) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, dst, src, static_cast<uint32_t>(bytes));
}

//! The copy warp's chunks of the first window (blocks drawing tickets ask for their first two).
template <typename T>
__device__ __forceinline__ ChunkSource first_chunks(const BackwardArgs<T>& a, const BulkRange& range, int lane) {
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

//! After the copy warp's last ticket: the block counts itself done, and the last block of the grid
//! zeroes the workspace's counters for the next call. The fences make every block's tickets happen
//! before its count (release) and the counts before the reset (acquire).
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

// Starts loading chunk c into a stage. Rows marked in the mask are not loaded (the token work reads
// them; their output is zeros, written at store time or by the token warps). Without the mask
// (speculative loads issued before it is built) every row is loaded.
template <typename T>
__device__ __forceinline__ void bulk_load_chunk(const BackwardArgs<T>& a, const uint32_t* mask, const BulkWindow& w,
                                                const BulkCursor& c, unsigned char* stage, uint64_t* bar,
                                                bool use_mask, int lane) {
  const HeadRows<const T>& src = c.value ? a.gv : a.gk;
  const uint32_t row_bytes = static_cast<uint32_t>(a.head_dim * int64_t{sizeof(T)});
  const uint32_t skipped = use_mask ? marked_rows(mask, w, c, lane) : 0;
  const uint32_t rows = static_cast<uint32_t>(c.n) - skipped;
  if (skipped == 0 && src.seq_stride == a.head_dim) {  // consecutive rows: one copy
    if (lane == 0) {
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           bar, rows * row_bytes);
      bulk_load(stage, src.row(c.b, c.j, c.r0), rows * row_bytes, bar);
    }
    return;
  }
  if (lane == 0)
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                         rows * row_bytes);
  __syncwarp();
  if (src.seq_stride == a.head_dim) {  // consecutive rows: one copy per run of unmarked rows
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
__device__ __forceinline__ BulkRange bulk_block_range(const BackwardArgs<T>& a, int64_t block) {
  return bulk_range_of(a.bulk_first.total, a.bulk_per_block, block);
}

//! Loads the first a.bulk_speculate chunks of the block's range into stages 0, 1, ... before the
//! bitmask exists (so every row, marked or not). With consecutive rows each chunk is one bulk copy,
//! issued by its own lane: all of them leave within a few instructions of the kernel's start.
//! Returns how many chunks were issued.
template <typename T>
__device__ __forceinline__ int64_t bulk_speculate(const BackwardArgs<T>& a, const uint32_t* mask,
                                                  const BulkRing& ring, const BulkRange& range, int lane) {
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
    bulk_load_chunk(a, mask, w, c, ring.stage(static_cast<int>(i)), ring.bars + i, false, lane);
  return count;
}

//! A small cache, whose block's chunks were all speculated into stages 0, 1, ...: once the bitmask
//! is built, lane i stores chunk i (its rows not in cache_position, one bulk store per run of them;
//! the token warps write the zeros: a.token_zeros), so the chunks' work runs side by side, not one
//! after the other on the warp's single instruction stream. Consecutive rows only.
template <typename T>
__device__ __forceinline__ void bulk_store_speculated(const BackwardArgs<T>& a, const uint32_t* mask,
                                                      const BulkRing& ring, const BulkRange& range, int lane) {
  if (lane < range.end - range.begin) {
    const BulkWindow& w = a.bulk_first;
    const BulkCursor c = BulkCursor::at(w, range.begin + lane);
    const HeadRows<T>& dst = c.value ? a.gv_out : a.gk_out;
    const int64_t row_bytes = a.head_dim * int64_t{sizeof(T)};
    unsigned char* stage = ring.stage(lane);
    const int64_t base = c.r0 - w.w0;  // the chunk's first row in the window
    while (!cuda::ptx::mbarrier_try_wait_parity(ring.bars + lane, 0u)) {
    }
    KVROPE_TRACE_AT(kTraceFirstData, 0);
    for (int64_t r = 0; r < c.n;) {
      const int64_t end = next_marked(mask, base + r, base + c.n) - base;  // rows [r, end) not marked
      if (end > r)
        bulk_store(dst.row(c.b, c.j, c.r0 + r), stage + r * row_bytes, (end - r) * row_bytes);
      r = end < c.n ? next_marked(mask, base + end, base + c.n, true) - base : c.n;  // past the marked ones
    }
    cuda::ptx::cp_async_bulk_commit_group();
  }
}

// Writes zeros to `bytes` bytes at `out` (16-byte aligned, a multiple of 16) from the warp's registers.
__device__ __forceinline__ void zero_run(void* out, int64_t bytes, int lane) {
  uint4* p = static_cast<uint4*>(out);
  const int64_t units = bytes / 16;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll 4
  for (int64_t u = lane; u < units; u += 32) __stcs(p + u, zero);
}

// Writes the loaded chunk to gk_out / gv_out, and zeros to its rows marked in the mask (unless the
// token warps write them: a.token_zeros; then marked rows are skipped). The zeros go
// from registers straight to global memory: the stage is never written by the warp, so no proxy fence
// orders its writes before the bulk engine's reads (v3.1 zero-filled the stage and fenced, which held
// the warp for a memory round trip per such chunk: docs/perf-notes.md, v4). The rows loaded go with
// bulk stores: one for the whole chunk when no row is marked and the rows are consecutive.
template <typename T>
__device__ __forceinline__ void bulk_store_chunk(const BackwardArgs<T>& a, const uint32_t* mask, const BulkWindow& w,
                                                 const BulkCursor& c, unsigned char* stage, int lane) {
  const HeadRows<T>& dst = c.value ? a.gv_out : a.gk_out;
  const int64_t row_bytes = a.head_dim * int64_t{sizeof(T)};
  const uint32_t marked = marked_rows(mask, w, c, lane);
  const bool consecutive = dst.seq_stride == a.head_dim;
  if (marked == 0 && consecutive) {
    if (lane == 0) bulk_store(dst.row(c.b, c.j, c.r0), stage, c.n * row_bytes);
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

//! The copy warp's share of one window: the chunks of `src`. The first `prefetched` of them were
//! already issued into stages 0, 1, ... (speculatively, before the mask was built).
//! At step i the warp waits for chunk i, stores it, and refills the stage of chunk i - slack + 1
//! (whose store has read it by then, usually) with the next chunk: count - slack loads and slack
//! stores in flight.
template <typename T>
__device__ void bulk_copy_window(const BackwardArgs<T>& a, const uint32_t* mask, const BulkWindow& w,
                                 BulkRing& ring, ChunkSource& src, int64_t prefetched, int lane) {
  int load_stage = ring.next, store_stage = ring.next;
  int64_t issued = 0;  // chunks taken (and loaded, or prefetched)
  bool more = true;
  auto issue = [&] {
    int64_t c = 0;
    more = src.take(&c, lane);
    if (!more) return;
    if (issued >= prefetched)
      bulk_load_chunk(a, mask, w, BulkCursor::at(w, c), ring.stage(load_stage), ring.bars + load_stage, true, lane);
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
    if (i == 0) KVROPE_TRACE_AT(kTraceFirstData, 0);
    ring.phases ^= 1u << store_stage;
    bulk_store_chunk(a, mask, w, BulkCursor::at(w, ring.chunk_of[store_stage]), ring.stage(store_stage), lane);
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

#else
#define KVROPE_HAS_BULK_COPY 0
#endif

}  // namespace kvrope::detail
