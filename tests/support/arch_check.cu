// Compile-only: one representative instance of each kernel path, for the architectures the tests and
// benchmarks do not run on: sm_75 (kvrope_arch_check: no bulk copy, no cp.async) and, in the ci preset,
// KVROPE_CHECK_ARCHITECTURES (sm_100a: the hardware NVFP4 conversion). An intrinsic outside its guard
// would otherwise go unnoticed (it did once: a930253).
#include <kvrope/kvrope.cuh>

namespace kd = kvrope::detail;
using bf16 = __nv_bfloat16;
using fp8 = __nv_fp8_e4m3;

// The backward: the vectorized path of a compiled head dim (out of place and in place), the generic
// scalar path; the decode kernel (S == 1), a compiled head dim and the generic one.
template __global__ void kd::backward_kernel<bf16, 128, 8, false>(const kd::FusedArgs<bf16>);
template __global__ void kd::backward_kernel<bf16, 128, 8, true>(const kd::FusedArgs<bf16>);
template __global__ void kd::backward_kernel<float, 0, 1, false>(const kd::FusedArgs<float>);
template __global__ void kd::backward_kernel<float, 0, 1, true>(const kd::FusedArgs<float>);
template __global__ void kd::decode_kernel<bf16, 128>(const kd::DecodeArgs<bf16>);
template __global__ void kd::decode_kernel<float, 0>(const kd::DecodeArgs<float>);
// The static-cache forward: vector chunks with each table source, the scalar path.
template __global__ void kd::forward_kernel<bf16, 8, kd::TableSource::kPerToken>(const kd::ForwardArgs<bf16>);
template __global__ void kd::forward_kernel<bf16, 8, kd::TableSource::kCacheT>(const kd::ForwardArgs<bf16>);
template __global__ void kd::forward_kernel<bf16, 8, kd::TableSource::kCacheF32>(const kd::ForwardArgs<bf16>);
template __global__ void kd::forward_kernel<float, 1, kd::TableSource::kPerToken>(const kd::ForwardArgs<float>);
// The append: the tile kernel with rings (q in T, q in fp8) and without, the few-token kernel (ordinary
// positions and mRoPE), each cache format (T, fp8, NVFP4).
template __global__ void kd::append_tile_kernel<bf16, bf16, 8, true, false>(const kd::AppendArgs<bf16, bf16>,
                                                                            const kd::AppendGeometry);
template __global__ void kd::append_tile_kernel<bf16, fp8, 8, true, true>(const kd::AppendArgs<bf16, fp8>,
                                                                          const kd::AppendGeometry);
template __global__ void kd::append_tile_kernel<float, float, 1, false, true>(const kd::AppendArgs<float, float>,
                                                                              const kd::AppendGeometry);
template __global__ void kd::append_token_kernel<bf16, fp8, 8, true, false>(const kd::AppendArgs<bf16, fp8>,
                                                                            const kd::AppendGeometry);
template __global__ void kd::append_token_kernel<bf16, bf16, 8, true, true>(const kd::AppendArgs<bf16, bf16>,
                                                                            const kd::AppendGeometry);
template __global__ void kd::append_tile_kernel<bf16, kvrope::nvfp4_e2m1x2, 8, true, true>(
    const kd::AppendArgs<bf16, kvrope::nvfp4_e2m1x2>, const kd::AppendGeometry);
template __global__ void kd::append_token_kernel<bf16, kvrope::nvfp4_e2m1x2, 8, true, false>(
    const kd::AppendArgs<bf16, kvrope::nvfp4_e2m1x2>, const kd::AppendGeometry);
// The MLA append: L = 512, R = 64 into an fp8 cache, and the scalar path.
template __global__ void kd::mla_append_kernel<bf16, fp8, 8, 512, 64>(const kd::MlaArgs<bf16, fp8>,
                                                                      const kd::MlaGeometry);
template __global__ void kd::mla_append_kernel<float, float, 1, 0, 0>(const kd::MlaArgs<float, float>,
                                                                      const kd::MlaGeometry);
