// Status codes returned by every kvrope host entry point (no exceptions cross the API).
#pragma once

#include <cuda_runtime_api.h>

namespace kvrope {

//! What went wrong, if anything. Launchers return the first problem they find and launch nothing.
enum class StatusCode : int {
  kSuccess = 0,
  kNullPointer,      //!< a required pointer is null
  kInvalidSize,      //!< a size is negative, or sizes disagree (for example S > 0 with S_max = 0 is fine, B < 0 is not)
  kInvalidHeadDim,   //!< head_dim is not a positive even number
  kInvalidStride,    //!< a stride is negative
  kOverlappingRows,  //!< an output's strides map two of its rows onto overlapping memory
  kAliasedBuffers,   //!< an output overlaps an input or another output
  kTooLarge,         //!< more than 2^32 - 1 rows in one tensor (row indices are 32-bit inside the kernel)
  kCudaError,        //!< a CUDA runtime call failed; Status::cuda_error holds its code
  kPositionOutOfRange,    //!< reported by read_error_flag: a cache_position was outside [-S_max, S_max)
  kMisaligned,            //!< a pointer is not aligned as the API requires (BackwardParams::workspace: 4 bytes)
  kPositionIdOutOfRange,  //!< reported by read_error_flag: a forward's position id was outside [0, max_position)
  kInvalidRotaryDim,      //!< rotary_dim is negative, odd or above head_dim
  kInvalidStyle,          //!< style is not a RotaryStyle value
  kConflictingFields,     //!< two fields that exclude each other are both set (`field` and `other`)
  kSlotOutOfRange,        //!< reported by read_error_flag: an append's slot was at or above num_pages * page_size
  //! the append's cache format cannot take the call as given: NVFP4 needs D and R multiples of 32, D at most
  //! 64 16-byte chunks and every row and stride 16-byte aligned (`field`: head_dim, rotary_dim or the tensor)
  kUnsupportedByCacheFormat,
};

//! The result of a host entry point: a code, the first offending field (a static string such as
//! "grad_key_states.seq_stride", or nullptr), the CUDA error for kCudaError, and for kAliasedBuffers
//! and kConflictingFields the other field.
struct Status {
  StatusCode code = StatusCode::kSuccess;
  const char* field = nullptr;
  cudaError_t cuda_error = cudaSuccess;
  const char* other = nullptr;

  constexpr bool ok() const { return code == StatusCode::kSuccess; }
  constexpr explicit operator bool() const { return ok(); }
};

//! A short English name for a status code.
inline const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kSuccess: return "success";
    case StatusCode::kNullPointer: return "null pointer";
    case StatusCode::kInvalidSize: return "invalid size";
    case StatusCode::kInvalidHeadDim: return "head_dim must be positive and even";
    case StatusCode::kInvalidStride: return "negative stride";
    case StatusCode::kOverlappingRows: return "output rows overlap";
    case StatusCode::kAliasedBuffers: return "output overlaps another buffer";
    case StatusCode::kTooLarge: return "tensor has more than 2^32-1 rows";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kPositionOutOfRange: return "cache_position out of range";
    case StatusCode::kMisaligned: return "pointer not aligned as required";
    case StatusCode::kPositionIdOutOfRange: return "position id out of range";
    case StatusCode::kInvalidRotaryDim: return "rotary_dim must be even and in [0, head_dim]";
    case StatusCode::kInvalidStyle: return "unknown rotary style";
    case StatusCode::kConflictingFields: return "fields that exclude each other are both set";
    case StatusCode::kSlotOutOfRange: return "slot out of range";
    case StatusCode::kUnsupportedByCacheFormat:
      return "not supported by the cache format (NVFP4: head_dim and rotary_dim multiples of 32, aligned rows)";
  }
  return "unknown status";
}

namespace detail {
constexpr Status fail(StatusCode code, const char* field, const char* other = nullptr) {
  return Status{code, field, cudaSuccess, other};
}
inline Status cuda_status(cudaError_t err, const char* what) {
  return err == cudaSuccess ? Status{} : Status{StatusCode::kCudaError, what, err};
}
}  // namespace detail

}  // namespace kvrope
