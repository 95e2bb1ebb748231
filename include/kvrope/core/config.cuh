// `#pragma unroll` for loops in __host__ __device__ functions, without host-compiler warnings: a header that
// uses KVROPE_UNROLL includes this file after its other includes and #undefs the macro at its end, so that
// no macro of kvrope's reaches the code that includes it. (No include guard, on purpose.)
#ifndef KVROPE_UNROLL
#if defined(__CUDA_ARCH__)
#define KVROPE_UNROLL _Pragma("unroll")
#else
#define KVROPE_UNROLL
#endif
#endif
