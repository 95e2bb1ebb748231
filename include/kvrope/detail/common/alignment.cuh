// Whether a strided view's rows are all 16-byte aligned (the vector paths of the backward and the forward).
#pragma once

#include <cstdint>

#include "../../core/tensor.cuh"

namespace kvrope::detail {

template <typename T>
bool aligned16(const HeadRows<T>& v) {
  return reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && (v.batch_stride * sizeof(T)) % 16 == 0 &&
         (v.head_stride * sizeof(T)) % 16 == 0 && (v.seq_stride * sizeof(T)) % 16 == 0;
}
template <typename T>
bool aligned16(const TokenRows<T>& v) {
  return reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && (v.batch_stride * sizeof(T)) % 16 == 0 &&
         (v.seq_stride * sizeof(T)) % 16 == 0;
}

}  // namespace kvrope::detail
