// The fused backward kernel's arguments: both variants folded into one shape.
#pragma once

#include <cstdint>

#include "../core/divmod.cuh"
#include "../core/tensor.cuh"

namespace kvrope::detail {

//! The chunks of one bitmask window [w0, w0 + wlen): for every (cache, b, head), ceil(wlen / rows)
//! chunks of up to rows_per_chunk consecutive rows, numbered cache-major, then b, head, rows. A chunk
//! fills a stage (32 KiB) unless the launch asks for fewer rows (BackwardArgs::bulk_chunk_rows: small
//! caches, so that every block gets several chunks).
struct BulkWindow {
  int64_t w0, wlen, rows_per_chunk, per_slab, total, heads, batch;
  FastDivmod div_slab, div_heads;  // by per_slab and heads: a chunk's cursor without a division
};

//! Everything the kernel reads, with the two variants folded into one shape: the cache-input
//! gradients gk_out / gv_out are new buffers (out-of-place) or gk / gv themselves (in-place).
template <typename T>
struct BackwardArgs {
  int64_t batch, heads, seq_len, cache_len, head_dim;
  HeadRows<const T> gk, gv;
  HeadRows<T> gk_out, gv_out;
  HeadRows<const T> key;
  TokenRows<const T> cos, sin;
  HeadRows<T> grad_key, grad_value;
  TokenRows<T> grad_cos, grad_sin;
  const void* positions;
  bool positions_are_int64;
  bool in_place;
  int* error_flag;
  int64_t window_rows;  // cache rows one shared-memory bitmask covers: a multiple of 32
  int64_t windows;      // bitmask windows the cache has (at least 1)
  int token_parts_log2; // each token is split over 2^token_parts_log2 warps (TokenLayout)
  int token_warps;      // out-of-place: warps [0, token_warps) of each block do token work, the rest copy
  bool bulk;            // out-of-place: the copy is one warp per block driving the bulk-copy engine
  int bulk_speculate;   // with bulk: chunks each block loads before its bitmask is built (at most bulk_stages)
  bool token_zeros;     // out-of-place: token warps zero rows p of gk_out / gv_out; the copy skips them
  bool mask_late;       // with bulk: token warps add their share of the bitmask after their first item
  int token_prefetch;   // in-place, sm_90 code, 16-byte rows: LaunchTuning::in_place_token_prefetch (0 to 3)
  bool spread_items;    // in-place, LaunchTuning::in_place_spread_items: the first round's item w is on block w % grid
  int bulk_stages;      // with bulk: stages of the shared-memory ring
  int bulk_slack;       // with bulk: chunk stores that may still read their stage when one is refilled
  int bulk_chunk_rows;  // with bulk: cache rows a chunk has at most (0: as many as a stage holds)
  BulkWindow bulk_first;  // with bulk: the chunks of the first bitmask window (bulk_window), set by the host
  int64_t bulk_per_block; // with bulk: chunks of the first window each block copies (bulk_range)
  // Out-of-place: the caller's workspace (BackwardParams::workspace) when the blocks share the
  // copy's chunks through it (share_chunks), else null. Words: {chunk ticket, blocks done}.
  unsigned int* workspace;
  bool share_chunks;    // with bulk and a workspace: chunks past grid x bulk_per_block are taken by ticket
  FastDivmod div_seq;   // token index -> (b, t)
  FastDivmod div_heads;
  // The decode kernel (S == 1, decode_kernel.cuh): the first warps of blocks [0, decode_token_blocks)
  // do the tokens; out of place, decode_slab_vecs divides by the 16-byte vectors of one (b, head)'s cache.
  int64_t decode_token_blocks;
  int decode_token_warps;  // warps [0, decode_token_warps) of those blocks: a token's warps
  FastDivmod decode_slab_vecs;

  //! Whether the table gradients are asked for (then key_states is read).
  __host__ __device__ __forceinline__ bool wants_tables() const { return grad_cos.data != nullptr || grad_sin.data != nullptr; }
};

}  // namespace kvrope::detail
