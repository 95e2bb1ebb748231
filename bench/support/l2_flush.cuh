// The L2 flush before each timed call (docs/spec.md §5.3): a buffer of twice the L2 written, which
// leaves the L2 full of dirty lines; or, as a diagnostic, read (clean lines: the difference is what
// writing back the flush's lines costs a call, docs/performance-log.md #18). The buffer must hold
// defined bytes for the reads (0x5a throughout: each word's XOR, and so every sum, is 0).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvrope_bench {

//! Reads every 16 bytes of buf[0, n) over the grid; returns this thread's sum of each word's four
//! 32-bit parts XORed together.
__device__ __forceinline__ uint32_t read_sweep(const uint4* buf, int64_t n) {
  uint32_t acc = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 x = buf[i];
    acc += x.x ^ x.y ^ x.z ^ x.w;
  }
  return acc;
}

//! The flush by reads as a kernel of its own. The sum is stored only if it equals `never`, a value
//! it does not take for the buffer's bytes, so that the compiler keeps the loads.
__global__ void l2_read_flush(const uint4* buf, int64_t n, uint32_t never, uint32_t* sink) {
  if (read_sweep(buf, n) == never) *sink = never;
}

//! The bench's flush: writes every 16 bytes with a value that changes per call (salt, 1 and up), or
//! with `read` reads them. One kernel either way: the clock knows the flush's record by this name.
__global__ void harness_l2_flush_kernel(uint4* buf, int64_t n, uint32_t salt, bool read) {
  if (read) {
    if (read_sweep(buf, n) == salt) buf[0].x = salt;
    return;
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t lo = static_cast<uint32_t>(i);
    buf[i] = make_uint4(salt, lo, ~salt, lo ^ salt);
  }
}

}  // namespace kvrope_bench
