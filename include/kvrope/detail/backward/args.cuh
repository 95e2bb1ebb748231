// The kernels' arguments: what every kernel reads (ProblemArgs), and what each kernel adds.
#pragma once

#include <cstdint>

#include "../../core/rotary.cuh"
#include "../../core/tensor.cuh"
#include "../common/divmod.cuh"

namespace kvrope::detail {

//! The call as every kernel sees it, both variants folded into one shape: the cache-input gradients
//! gk_out / gv_out are new buffers (out of place) or gk / gv themselves (in place).
template <typename T>
struct ProblemArgs {
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
  FastDivmod div_seq;  // token index -> (b, t)
  FastDivmod div_heads;

  //! Whether the table gradients are asked for (then key_states is read).
  __host__ __device__ __forceinline__ bool wants_tables() const {
    return grad_cos.data != nullptr || grad_sin.data != nullptr;
  }
};

//! The chunks of one bitmask window [w0, w0 + wlen): for every (cache, b, head), ceil(wlen / rows)
//! chunks of up to rows_per_chunk consecutive rows, numbered cache-major, then b, head, rows.
struct BulkWindow {
  int64_t w0, wlen, rows_per_chunk, per_slab, total, heads, batch;
  FastDivmod div_slab, div_heads;  // by per_slab and heads: a chunk's cursor without a division
};

//! The fused kernel adds the bitmask windows, the split of warps by role and the copy's plan.
template <typename T>
struct FusedArgs : ProblemArgs<T> {
  int64_t window_rows;      // cache rows one shared-memory bitmask covers: a multiple of 32
  int64_t windows;          // bitmask windows the cache has (at least 1)
  int token_parts_log2;     // each token is split over 2^token_parts_log2 warps (TokenLayout)
  int token_warps;          // out of place: warps [0, token_warps) of each block do token work, the rest copy
  bool token_prefetch;      // in place, sm_90 code, 16-byte rows: rows prefetched into L2 ahead of their item
  bool bulk;                // out of place: the copy is one warp per block driving the bulk-copy engine
  bool token_zeros;         // out of place: token warps zero rows p of gk_out / gv_out; the copy skips them
  int bulk_speculate;       // with bulk: chunks each block loads before its bitmask is built
  int bulk_stages;          // with bulk: stages of the shared-memory ring
  int bulk_slack;           // with bulk: chunk stores that may still read their stage when one is refilled
  int bulk_chunk_rows;      // with bulk: cache rows a chunk has at most (0: as many as a stage holds)
  BulkWindow bulk_first;    // with bulk: the chunks of the first bitmask window
  int64_t bulk_per_block;   // with bulk: chunks of the first window each block copies (bulk_range)
  bool share_chunks;        // with bulk and a workspace: chunks past grid x bulk_per_block are taken by ticket
  unsigned int* workspace;  // with share_chunks: {chunk ticket, blocks done}; else null
  // The general instance (kGeneral: another style, partial rotary, or shared table gradients).
  int64_t rotary_dim;  // R
  RotaryStyle style;
  int rotary_units;  // chunk pairs of the rotated part: R / (2 N)
  bool sum_batches;  // the table gradients have batch stride 0: a token's warps sum over the batch
};

//! The decode kernel (S == 1) adds which warps do the tokens and the copy's divisor.
template <typename T>
struct DecodeArgs : ProblemArgs<T> {
  int64_t token_blocks;  // blocks [0, token_blocks) do the tokens with their first token_warps warps
  int token_warps;
  FastDivmod slab_vecs;  // out of place: the 16-byte vectors of one (b, head)'s cache
};

}  // namespace kvrope::detail
