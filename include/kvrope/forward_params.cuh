// Parameters of the forward op (docs/spec.md §2): plain structs of pointers and int64 strides, and the
// plan a call launches.
#pragma once

#include <cstdint>

#include "core/rotary.cuh"
#include "core/tensor.cuh"
#include "error_flag.cuh"

namespace kvrope {

//! The forward: k, v [B, H, S, D] written into rows cache_position of the caches [B, H, S_max, D],
//! the keys rotated (RoPE); optionally RoPE(k) into key_out and q [B, Hq, S, D] rotated in the same
//! launch. The rotary tables come from one of two sources: per-token tables cos / sin [B, S, R] (as
//! Hugging Face passes them), or a table cache [max_position, R] of one angle a pair (cos in columns
//! [0, R/2), sin in [R/2, R); fp32 or T) indexed by position_ids.
//!
//! @tparam T   element type of every float tensor: __nv_bfloat16, __half or float
//! @tparam Pos type of cache_position and position_ids: int64_t or int32_t
template <typename T, typename Pos = int64_t>
struct ForwardParams {
  int64_t batch = 0;       //!< B
  int64_t heads = 0;       //!< H, number of KV heads
  int64_t seq_len = 0;     //!< S, new tokens
  int64_t cache_len = 0;   //!< S_max, rows of the cache
  int64_t head_dim = 0;    //!< D, positive and even
  int64_t rotary_dim = 0;  //!< R, even, 0 < R <= D (0: R = D); elements R..D-1 pass through
  RotaryStyle style = RotaryStyle::kRotateHalf;

  HeadRows<const T> key_states;         //!< k [B, H, S, D]
  HeadRows<const T> value_states;       //!< v [B, H, S, D]
  HeadRows<T> key_cache;                //!< [B, H, S_max, D]: rows cache_position get RoPE(k)
  HeadRows<T> value_cache;              //!< [B, H, S_max, D]: rows cache_position get v
  const Pos* cache_position = nullptr;  //!< [S] device array; values in [-S_max, S_max), negatives wrap
  HeadRows<T> key_out;                  //!< optional [B, H, S, D]: RoPE(k); data == nullptr: not written

  int64_t query_heads = 0;  //!< Hq, heads of q (0: no q)
  HeadRows<T> query;        //!< q [B, Hq, S, D]: read, and rotated in place unless query_out is given
  HeadRows<T> query_out;    //!< optional [B, Hq, S, D]: RoPE(q), q left as it was

  TokenRows<const T> cos;            //!< per-token tables [B, S, R] (batch_stride 0: one for the batch), or null
  TokenRows<const T> sin;            //!< ... with cos; null when the table cache is used
  const T* cos_sin_cache = nullptr;  //!< table cache [max_position, R] in T, or null
  const float* cos_sin_cache_f32 = nullptr;  //!< the same in fp32, or null (one source exactly)
  int64_t max_position = 0;                  //!< rows of the table cache
  const Pos* position_ids = nullptr;         //!< with the table cache: [S] or [B, S] device array
  int64_t position_ids_batch_stride = 0;     //!< 0 for [S] position ids shared by the batch, S for [B, S]

  //! Optional device int (error_flag.cuh): a cache_position out of range ORs kErrorPositionOutOfRange
  //! (the token writes no cache row; key_out and query are still written), a position id outside
  //! [0, max_position) ORs kErrorPositionIdOutOfRange (the token writes nothing at all).
  int* error_flag = nullptr;
};

//! What a forward call launches, as plan_forward reports it without launching.
struct ForwardPlan {
  bool launched = false;  //!< false: nothing to read or write
  int vec_width = 0;      //!< elements per access (16 bytes, or 1 for unaligned rows)
  int grid = 0;           //!< blocks (one wave at most)
  int block = 0;          //!< threads per block
  int shared_bytes = 0;   //!< dynamic shared memory per block (the repeat bitmasks)
};

}  // namespace kvrope
