// Asynchronous copies into shared memory, for every op: cp.async (sm_80+) and the bulk-copy engine
// (cp.async.bulk, sm_90+). Each falls back to a plain copy through a register where the hardware lacks it.
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace kvrope::detail {

//! Copies `bytes` (16, 8 or 4) from global `src` to shared `dst` without a register (cp.async; 16 bytes
//! bypass L1). Completion: commit_async_copies and wait_async_copies.
__device__ __forceinline__ void copy_async(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if (bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else if (bytes == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
#else
  if (bytes == 16)
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  else if (bytes == 8)
    *static_cast<uint2*>(dst) = *static_cast<const uint2*>(src);
  else
    *static_cast<uint32_t*>(dst) = *static_cast<const uint32_t*>(src);
#endif
}

//! Closes the thread's current group of asynchronous copies (possibly empty).
__device__ __forceinline__ void commit_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

//! Waits until at most `kPending` of the thread's latest committed groups are still copying (0: all of
//! them, committed or not, are done).
template <int kPending = 0>
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kPending == 0)
    asm volatile("cp.async.wait_all;" ::: "memory");
  else
    asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

//! A bulk load into this block's shared memory, completing on the mbarrier `bar` (sm_90+): the
//! .shared::cta destination where the PTX ISA has it (8.6, CUDA 12.8), else the .shared::cluster form
//! with this block's own address.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if __cccl_ptx_isa >= 860
  cuda::ptx::cp_async_bulk(cuda::ptx::space_shared, cuda::ptx::space_global, dst, src, bytes, bar);
#else
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, bytes, bar);
#endif
}

//! A bulk store of this block's shared memory to global memory (sm_90+; completion: bulk groups).
__device__ __forceinline__ void bulk_store(void* dst, const void* src, int64_t bytes) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, dst, src, static_cast<uint32_t>(bytes));
}

}  // namespace kvrope::detail
