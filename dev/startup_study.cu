// startup_study: what a warp's first microseconds cost on a cold GPU (docs/performance-log.md #10).
// One warp of one block, %globaltimer around each step, after the same
// L2 flush as the bench (a buffer of twice the L2 written) or with caches warm:
//   - code: two passes over the same 4 096 straight-line instructions (8 independent FMA chains, so
//     a warm pass runs at about one instruction a cycle); the first pass fetches the code;
//   - loads: a dependent load from a fresh buffer (DRAM, maybe a TLB walk), then from another line
//     of the same 2 MiB page (DRAM), then the first line again (L2);
//   - parameters: 16 loads of kernel parameters 256 bytes apart, each needed before the next.
// Usage: startup_study [repeats]   (median of the repeats, each after its own flush).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_exit.cuh"

namespace {

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// The global timer (ns) once `word` has arrived in its register: the read is predicated on a test of
// it, so it waits for the load that produces it.
__device__ __forceinline__ unsigned long long globaltimer_after(unsigned long long word) {
  unsigned long long t;
  asm volatile(
      "{\n .reg .pred p;\n setp.eq.u64 p, %1, 0x7ff0123456789abc;\n @p mov.u64 %0, 1;\n"
      " @!p mov.u64 %0, %%globaltimer;\n}"
      : "=l"(t)
      : "l"(word)
      : "memory");
  return t;
}

constexpr int kCodeSteps = 512;  // x 8 FMAs: 4 096 instructions, 64 KiB of code

__global__ void code_kernel(float seed, float* sink, unsigned long long* times) {
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = seed + i;
  unsigned long long t[3];
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    unsigned long long dep = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) dep += __float_as_uint(acc[i]);
    t[pass] = globaltimer_after(dep);
#pragma unroll
    for (int s = 0; s < kCodeSteps; ++s)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(acc[i], 1.0000001f, 0.5f * (s + 1));
  }
  unsigned long long dep = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) dep += __float_as_uint(acc[i]);
  t[2] = globaltimer_after(dep);
  if (threadIdx.x == 0) {
    for (int i = 0; i < 8; ++i) sink[i] = acc[i];
    times[0] = t[1] - t[0];
    times[1] = t[2] - t[1];
  }
}

__global__ void load_kernel(const unsigned long long* fresh, unsigned long long* times) {
  const unsigned long long t0 = now();
  const unsigned long long a = __ldcg(fresh);  // first touch: DRAM (and the page's translation)
  const unsigned long long t1 = globaltimer_after(a);
  const unsigned long long b = __ldcg(fresh + 4096 + (a & 1));  // 32 KiB on: same page, DRAM
  const unsigned long long t2 = globaltimer_after(b);
  const unsigned long long c = __ldcg(fresh + (b & 1));  // the first line again: L2
  const unsigned long long t3 = globaltimer_after(c);
  if (threadIdx.x == 0) {
    times[0] = t1 - t0;
    times[1] = t2 - t1;
    times[2] = t3 - t2;
  }
}

struct BigParams {
  unsigned long long v[512];  // 4 KiB of parameters
};

__global__ void param_kernel(const BigParams p, unsigned long long* times) {
  const unsigned long long t0 = now();
  unsigned long long x = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) x = p.v[(i * 32 + (x & 1)) % 512] + (x >> 1);  // each index waits for x
  const unsigned long long t1 = globaltimer_after(x);
  if (threadIdx.x == 0) times[0] = t1 - t0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 21;
  int l2 = 0;
  cudaDeviceProp prop{};
  KVROPE_TOOL_CUDA(cudaGetDeviceProperties(&prop, 0));
  KVROPE_TOOL_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const size_t flush_bytes = 2 * size_t(l2);
  void* flush = nullptr;
  float* sink = nullptr;
  unsigned long long* times = nullptr;
  KVROPE_TOOL_CUDA(cudaMalloc(&flush, flush_bytes));
  KVROPE_TOOL_CUDA(cudaMalloc(&sink, 64));
  KVROPE_TOOL_CUDA(cudaMalloc(&times, 64));
  BigParams params{};
  for (int i = 0; i < 512; ++i) params.v[i] = 2u * i;
  std::printf("startup_study: %s, one warp, median of %d launches (ns)\n", prop.name, repeats);
  for (const bool flushed : {true, false}) {
    std::vector<double> code1, code2, dram_first, dram_page, l2_hit, param;
    for (int r = 0; r < repeats; ++r) {
      // A fresh buffer per launch: its first touch is cold whatever came before.
      unsigned long long* fresh = nullptr;
      KVROPE_TOOL_CUDA(cudaMalloc(&fresh, 8 << 20));
      KVROPE_TOOL_CUDA(cudaMemset(fresh, 0, 8 << 20));
      unsigned long long h[3];
      auto run = [&](auto launch) {
        if (flushed) KVROPE_TOOL_CUDA(cudaMemset(flush, r & 0xff, flush_bytes));
        KVROPE_TOOL_CUDA(cudaDeviceSynchronize());
        launch();
        KVROPE_TOOL_CUDA(cudaGetLastError());
        KVROPE_TOOL_CUDA(cudaDeviceSynchronize());
        KVROPE_TOOL_CUDA(cudaMemcpy(h, times, sizeof(h), cudaMemcpyDeviceToHost));
      };
      run([&] { code_kernel<<<1, 32>>>(1.0f + r, sink, times); });
      code1.push_back(double(h[0]));
      code2.push_back(double(h[1]));
      run([&] { load_kernel<<<1, 32>>>(fresh, times); });
      dram_first.push_back(double(h[0]));
      dram_page.push_back(double(h[1]));
      l2_hit.push_back(double(h[2]));
      run([&] { param_kernel<<<1, 32>>>(params, times); });
      param.push_back(double(h[0]));
      KVROPE_TOOL_CUDA(cudaFree(fresh));
    }
    std::printf("%s:\n", flushed ? "L2 flushed before each launch" : "no flush (caches warm from the last launch)");
    std::printf("  code, 4096 instructions: first pass %8.0f  second pass %8.0f\n", median(code1), median(code2));
    std::printf("  load: fresh line %8.0f  same page %8.0f  L2 hit %8.0f\n", median(dram_first), median(dram_page),
                median(l2_hit));
    std::printf("  16 dependent parameter loads 256 B apart: %8.0f\n", median(param));
  }
  KVROPE_TOOL_CUDA(cudaFree(flush));
  KVROPE_TOOL_CUDA(cudaFree(sink));
  KVROPE_TOOL_CUDA(cudaFree(times));
  return 0;
}
