// Compile-only (kvrope_arch_check, built for sm_75): the kernels' device code for a GPU
// without the bulk copy or cp.async. The tests and benchmarks build for sm_90 and sm_100a only, so
// an sm_80+ intrinsic outside its guard would otherwise go unnoticed (it did once: a930253).
#include <kvrope/kvrope.cuh>

// The vectorized path of a compiled head dim, and the generic scalar path.
template __global__ void kvrope::detail::backward_kernel<__nv_bfloat16, 128, 8, false>(
    const kvrope::detail::FusedArgs<__nv_bfloat16>);
template __global__ void kvrope::detail::backward_kernel<__nv_bfloat16, 128, 8, true>(
    const kvrope::detail::FusedArgs<__nv_bfloat16>);
template __global__ void kvrope::detail::backward_kernel<float, 0, 1, false>(const kvrope::detail::FusedArgs<float>);
template __global__ void kvrope::detail::backward_kernel<float, 0, 1, true>(const kvrope::detail::FusedArgs<float>);
// The decode kernel (S == 1): a compiled head dim and the generic one.
template __global__ void kvrope::detail::decode_kernel<__nv_bfloat16, 128>(
    const kvrope::detail::DecodeArgs<__nv_bfloat16>);
template __global__ void kvrope::detail::decode_kernel<float, 0>(const kvrope::detail::DecodeArgs<float>);
// The MLA append: L = 512, R = 64 into an fp8 cache, and the scalar path.
template __global__ void kvrope::detail::mla_append_kernel<__nv_bfloat16, __nv_fp8_e4m3, 8, 512, 64>(
    const kvrope::detail::MlaArgs<__nv_bfloat16, __nv_fp8_e4m3>, const kvrope::detail::MlaGeometry);
template __global__ void kvrope::detail::mla_append_kernel<float, float, 1, 0, 0>(
    const kvrope::detail::MlaArgs<float, float>, const kvrope::detail::MlaGeometry);
