// The dev tools' check of a CUDA runtime call: on failure, print where and why, and exit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define KVROPE_TOOL_CUDA(call) ::kvrope_tools::exit_on_error((call), #call, __FILE__, __LINE__)

namespace kvrope_tools {
inline void exit_on_error(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s -> %s\n", file, line, what, cudaGetErrorString(err));
  std::exit(1);
}
}  // namespace kvrope_tools
