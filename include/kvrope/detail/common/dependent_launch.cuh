// Programmatic dependent launch (sm_90+), for every op that offers it: the launch that lets a kernel start
// while the kernel before it in the stream finishes, and the device side's wait for that kernel's writes.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace kvrope::detail {

//! Waits until the grids this one depends on programmatically have completed and their writes are
//! visible (griddepcontrol.wait); returns at once in a kernel launched without the attribute. Call it
//! before the first read of anything the kernel before may write.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

//! Lets the next kernel in the stream, if launched with the attribute, start now
//! (griddepcontrol.launch_dependents): it still waits for this grid's completion before its reads.
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

//! Launches kernel<<<grid, block, shared_bytes, stream>>>(args...), with programmatic stream serialization
//! allowed when `dependent` (the kernel may start before the previous one in the stream ends; it must call
//! wait_for_prior_grids before reading what that one writes). Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), int grid, int block, int shared_bytes, cudaStream_t stream,
                          bool dependent, Args&&... args) {
  if (!dependent) {
    kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(block));
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kvrope::detail
