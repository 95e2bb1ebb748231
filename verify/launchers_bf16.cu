// The tests' and the benchmark's launchers for __nv_bfloat16 (launchers.cuh).
#include "verify/launchers_impl.cuh"

template struct kvrope::testing::Launchers<__nv_bfloat16, int32_t>;
template struct kvrope::testing::Launchers<__nv_bfloat16, int64_t>;
