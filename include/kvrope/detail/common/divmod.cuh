// Division by a run-time constant with a multiply and a shift (index math inside the kernels).
#pragma once

#include <cstdint>

namespace kvrope::detail {

//! Divides unsigned integers by a fixed divisor d >= 1. Dividends below 2^32 take the
//! multiply-high path; larger ones (possible only for huge tensors) fall back to a plain division.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t magic = 1;
  uint32_t shift = 0;

  FastDivmod() = default;
  __host__ __device__ explicit FastDivmod(uint32_t d) : divisor(d == 0 ? 1 : d) {
    while ((uint64_t{1} << shift) < divisor) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor)) / divisor + 1);
  }

  __host__ __device__ uint64_t div(uint64_t n) const {
    if (n >> 32) return n / divisor;
    const uint64_t hi = (n * magic) >> 32;
    return (hi + n) >> shift;
  }
  //! n / d for n < 2^32, which the caller guarantees: the multiply-high path alone, no branch.
  __host__ __device__ uint32_t div32(uint32_t n) const {
    return static_cast<uint32_t>(((uint64_t{n} * magic >> 32) + n) >> shift);
  }
  //! Returns n / d and stores n % d in `rem`.
  __host__ __device__ uint64_t divmod(uint64_t n, uint64_t& rem) const {
    const uint64_t q = div(n);
    rem = n - q * divisor;
    return q;
  }
};

}  // namespace kvrope::detail
