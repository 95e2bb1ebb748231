// The bench tools' diagnostic L2 flush by reads. The protocol's flush writes a buffer of twice the L2
// (DESIGN.md section 5), which leaves the L2 full of dirty lines; reading the same buffer instead
// leaves clean ones, so that the difference between the two shows what writing back the flush's
// lines costs a call (docs/perf-notes.md, v14). The buffer must hold defined bytes (the tools fill it
// once at allocation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvrope_tools {

//! Reads every 16 bytes of buf[0, n) over the grid; returns this thread's sum, over the 16-byte words
//! it read, of each word's four 32-bit parts XORed together.
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

}  // namespace kvrope_tools
