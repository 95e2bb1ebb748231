// Small portability macros shared by the headers.
#pragma once

// `#pragma unroll` for loops in __host__ __device__ functions, without host-compiler warnings.
#if defined(__CUDA_ARCH__)
#define KVROPE_UNROLL _Pragma("unroll")
#else
#define KVROPE_UNROLL
#endif
