// Parameters of the backward op (DESIGN.md section 1): plain structs of pointers and int64 strides.
#pragma once

#include <cstdint>

#include "core/tensor.cuh"

namespace kvrope {

//! Fields shared by the out-of-place and in-place variants.
//!
//! @tparam T   element type of every float tensor: __nv_bfloat16, __half or float
//! @tparam Pos type of cache_position: int64_t or int32_t
template <typename T, typename Pos = int64_t>
struct BackwardCommon {
  int64_t batch = 0;      //!< B
  int64_t heads = 0;      //!< H, number of KV heads
  int64_t seq_len = 0;    //!< S, new tokens
  int64_t cache_len = 0;  //!< S_max, rows of the cache
  int64_t head_dim = 0;   //!< D, positive and even

  HeadRows<const T> key_states;  //!< k [B, H, S, D]; read only when grad_cos or grad_sin is requested
  TokenRows<const T> cos;        //!< [B, S, D]; batch_stride 0 shares one table across the batch
  TokenRows<const T> sin;        //!< [B, S, D]; batch_stride 0 shares one table across the batch
  const Pos* cache_position = nullptr;  //!< [S] device array; values in [-S_max, S_max), negatives wrap

  HeadRows<T> grad_key_states;    //!< out [B, H, S, D]
  HeadRows<T> grad_value_states;  //!< out [B, H, S, D]
  TokenRows<T> grad_cos;          //!< out [B, S, D]; data == nullptr: not computed
  TokenRows<T> grad_sin;          //!< out [B, S, D]; data == nullptr: not computed

  //! Optional device int. When a position is out of range the kernel ORs kErrorPositionOutOfRange
  //! into it (and leaves that token's outputs zero). The caller zeroes it before the call and reads
  //! it after the stream synchronizes, for example with read_error_flag().
  int* error_flag = nullptr;
};

//! Out-of-place backward: the reference semantics, the cache-input gradients are new buffers.
template <typename T, typename Pos = int64_t>
struct BackwardParams : BackwardCommon<T, Pos> {
  HeadRows<const T> grad_key_cache;    //!< gK [B, H, S_max, D]
  HeadRows<const T> grad_value_cache;  //!< gV [B, H, S_max, D]
  HeadRows<T> grad_key_cache_input;    //!< out [B, H, S_max, D]: gK with rows cache_position zeroed
  HeadRows<T> grad_value_cache_input;  //!< out [B, H, S_max, D]: gV with rows cache_position zeroed

  //! Optional device buffer of kBackwardWorkspaceBytes (4-byte aligned), all zero when the call
  //! starts; the kernel leaves it zero when it ends, so zero it once (cudaMemset, or
  //! reset_workspace) and pass it to every call. With it, the blocks share the copy of a large
  //! cache at run time (each takes its next chunk from a counter in the workspace), so the SMs that
  //! stream faster copy more: 5-7 % faster on the large caches of the benchmark on an H200
  //! (docs/perf-notes.md, v6).
  //! Without it, each block copies a fixed share. Calls that may run at the same time (on other
  //! streams, or in parallel branches of a graph) each need a workspace of their own.
  void* workspace = nullptr;
};

//! Bytes of BackwardParams::workspace.
constexpr int64_t kBackwardWorkspaceBytes = 8;

//! In-place backward: gK and gV become the cache-input gradients (their rows cache_position are
//! zeroed after being read); only the bytes of the new tokens move.
template <typename T, typename Pos = int64_t>
struct BackwardInPlaceParams : BackwardCommon<T, Pos> {
  HeadRows<T> grad_key_cache;    //!< gK [B, H, S_max, D], read, then rows cache_position zeroed
  HeadRows<T> grad_value_cache;  //!< gV [B, H, S_max, D], read, then rows cache_position zeroed
};

//! Bit set in BackwardCommon::error_flag when a cache_position is outside [-S_max, S_max).
constexpr int kErrorPositionOutOfRange = 1;

}  // namespace kvrope
