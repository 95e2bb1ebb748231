// The error flag every op reports bad positions and slots through: its bits, and the helpers that reset and read it.
#pragma once

#include <cuda_runtime_api.h>

#include "core/status.cuh"

namespace kvrope {

//! Bit set in an error flag when a cache_position is outside [-S_max, S_max).
constexpr int kErrorPositionOutOfRange = 1;
//! Bit set in a forward's error flag when a position id is outside [0, max_position).
constexpr int kErrorPositionIdOutOfRange = 2;
//! Bit set in an append's error flag when a slot is at or above num_pages * page_size.
constexpr int kErrorSlotOutOfRange = 4;

//! Zeroes an error flag on `stream` (asynchronous; capturable).
inline Status reset_error_flag(int* flag, cudaStream_t stream = nullptr) {
  return detail::cuda_status(cudaMemsetAsync(flag, 0, sizeof(int), stream), "cudaMemsetAsync");
}

//! Reads an error flag written by earlier launches on `stream`; synchronizes the stream, so call it
//! outside graph capture. Returns kPositionOutOfRange (field "cache_position") if a cache position was
//! out of range, else kPositionIdOutOfRange (field "position_ids") if a position id was, else
//! kSlotOutOfRange (field "slot_mapping") if a slot was, else success.
inline Status read_error_flag(const int* flag, cudaStream_t stream = nullptr) {
  int value = 0;
  if (Status s = detail::cuda_status(cudaMemcpyAsync(&value, flag, sizeof(int), cudaMemcpyDeviceToHost, stream),
                                     "cudaMemcpyAsync");
      !s)
    return s;
  if (Status s = detail::cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); !s) return s;
  if (value & kErrorPositionOutOfRange) return detail::fail(StatusCode::kPositionOutOfRange, "cache_position");
  if (value & kErrorPositionIdOutOfRange) return detail::fail(StatusCode::kPositionIdOutOfRange, "position_ids");
  if (value & kErrorSlotOutOfRange) return detail::fail(StatusCode::kSlotOutOfRange, "slot_mapping");
  return {};
}

}  // namespace kvrope
