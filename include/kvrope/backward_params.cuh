// Parameters of the backward op (docs/spec.md §1): plain structs of pointers and int64 strides, and the
// plan a call launches.
#pragma once

#include <cstdint>

#include "core/rotary.cuh"
#include "core/tensor.cuh"
#include "error_flag.cuh"

namespace kvrope {

//! Fields shared by the out-of-place and in-place variants.
//!
//! @tparam T   element type of every float tensor: __nv_bfloat16, __half or float
//! @tparam Pos type of cache_position: int64_t or int32_t
template <typename T, typename Pos = int64_t>
struct BackwardCommon {
  int64_t batch = 0;                             //!< B
  int64_t heads = 0;                             //!< H, number of KV heads
  int64_t seq_len = 0;                           //!< S, new tokens
  int64_t cache_len = 0;                         //!< S_max, rows of the cache
  int64_t head_dim = 0;                          //!< D, positive and even
  int64_t rotary_dim = 0;                        //!< R, even, 0 < R <= D (0: R = D); elements R..D-1 passed through
  RotaryStyle style = RotaryStyle::kRotateHalf;  //!< which elements the forward rotated together

  HeadRows<const T> key_states;         //!< k [B, H, S, D]; read only when grad_cos or grad_sin is requested
  TokenRows<const T> cos;               //!< [B, S, R]; batch_stride 0 shares one table across the batch
  TokenRows<const T> sin;               //!< [B, S, R]; batch_stride 0 shares one table across the batch
  const Pos* cache_position = nullptr;  //!< [S] device array; values in [-S_max, S_max), negatives wrap

  HeadRows<T> grad_key_states;    //!< out [B, H, S, D]
  HeadRows<T> grad_value_states;  //!< out [B, H, S, D]
  TokenRows<T> grad_cos;          //!< out [B, S, R]; null: not computed; batch_stride 0: summed over the batch
  TokenRows<T> grad_sin;          //!< out [B, S, R]; null: not computed; batch_stride 0: summed over the batch

  //! Optional device int (error_flag.cuh). When a position is out of range the kernel ORs
  //! kErrorPositionOutOfRange into it (and leaves that token's outputs zero). Zero it before the call
  //! (reset_error_flag) and read it after (read_error_flag).
  int* error_flag = nullptr;
};

//! Out-of-place backward: the reference semantics, the cache-input gradients are new buffers.
template <typename T, typename Pos = int64_t>
struct BackwardParams : BackwardCommon<T, Pos> {
  HeadRows<const T> grad_key_cache;    //!< gK [B, H, S_max, D]
  HeadRows<const T> grad_value_cache;  //!< gV [B, H, S_max, D]
  HeadRows<T> grad_key_cache_input;    //!< out [B, H, S_max, D]: gK with rows cache_position zeroed
  HeadRows<T> grad_value_cache_input;  //!< out [B, H, S_max, D]: gV with rows cache_position zeroed

  //! Optional device buffer of kBackwardWorkspaceBytes (4-byte aligned), zero before the first call
  //! (reset_workspace) and left zero by each call. With it, the blocks share a large cache's copy at
  //! run time (5-7 % faster on the benchmark's large caches, H200). Concurrent calls need one each.
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

//! Which kernel a call launches.
enum class BackwardKernel : int {
  kNone = 0,  //!< nothing to read or write (for example B = 0): nothing is launched
  kFused,     //!< the fused kernel: token work beside the cache copy, a bitmask of the rows written
  kDecode,    //!< the kernel for one token a batch (S = 1), no bitmask
};

//! Which instance of the kernel a call takes.
enum class BackwardPath : int {
  kNothingToDo = 0,    //!< nothing is launched
  kCompiledHeadDim,    //!< head_dim has a compile-time instance, 16-byte accesses
  kGenericVectorized,  //!< head_dim read at run time, 16-byte accesses
  kGenericScalar,      //!< a pointer or stride not 16-byte aligned (or D/2 not a multiple of the vector)
};

//! What a call launches, as plan_backward reports it without launching.
struct BackwardPlan {
  BackwardKernel kernel = BackwardKernel::kNone;
  BackwardPath path = BackwardPath::kNothingToDo;
  int head_dim_instance = 0;  //!< the compiled head dim, 0 for the generic instances
  int vec_width = 0;          //!< elements per access
  int grid = 0;               //!< blocks (one wave at most)
  int block = 0;              //!< threads per block
  int shared_bytes = 0;       //!< dynamic shared memory per block
  bool bulk_copy = false;     //!< out of place: the caches are copied by the bulk-copy engine (sm_90+)
};

}  // namespace kvrope
