// Checked CUDA and CUPTI calls: a failure is a broken setup, so the program aborts with its place.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>
#include <cupti.h>

#define KVROPE_BENCH_CUDA(call) ::kvrope_bench::check_cuda((call), #call, __FILE__, __LINE__)
#define KVROPE_BENCH_CUPTI(call) ::kvrope_bench::check_cupti((call), #call, __FILE__, __LINE__)

namespace kvrope_bench {

inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, what, cudaGetErrorName(err), cudaGetErrorString(err));
  std::abort();
}

inline void check_cupti(CUptiResult res, const char* what, const char* file, int line) {
  if (res == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  if (cuptiGetResultString(res, &msg) != CUPTI_SUCCESS || msg == nullptr) msg = "unknown CUPTI error";
  std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, what, msg);
  std::abort();
}

}  // namespace kvrope_bench
