// The tests' and the benchmark's launchers for __half (launchers.cuh).
#include "verify/launchers_impl.cuh"

template struct kvrope::testing::Launchers<__half, int32_t>;
template struct kvrope::testing::Launchers<__half, int64_t>;
