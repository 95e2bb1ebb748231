// Seeded standard normal inputs, written on the device.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "check.cuh"

namespace kvrope_bench {

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ inline void store_float(float v, float* p) { *p = v; }
__device__ inline void store_float(float v, __half* p) { *p = __float2half_rn(v); }
__device__ inline void store_float(float v, __nv_bfloat16* p) { *p = __float2bfloat16_rn(v); }

// Counter-based hash and Box-Muller: element i depends only on (seed, i), so any size fills at
// memory speed and the same seed gives the same tensors.
template <typename T>
__global__ void fill_normal_kernel(T* out, int64_t n, uint64_t seed) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
    // 23-bit uniforms offset by half a step: u1 in (0, 1) (log finite, never 0), and 2*u2 never
    // lands on an odd multiple of 1/2, so cos never returns an exact zero.
    const float u1 = (static_cast<float>(h >> 41) + 0.5f) * 0x1p-23f;
    const float u2 = (static_cast<float>((h >> 9) & 0x7FFFFF) + 0.5f) * 0x1p-23f;
    float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    // Inputs are never zero, even after rounding to fp16.
    if (fabsf(z) < 0x1p-10f) z = copysignf(0x1p-10f, z);
    store_float(z, out + i);
  }
}

template <typename T>
void fill_normal(T* out, int64_t n, uint64_t seed, int blocks, cudaStream_t stream) {
  if (n == 0) return;
  fill_normal_kernel<T><<<blocks, 256, 0, stream>>>(out, n, seed);
  KVROPE_BENCH_CUDA(cudaGetLastError());
}

}  // namespace kvrope_bench
