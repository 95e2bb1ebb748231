// The tests' and the benchmark's launchers for float (launchers.cuh).
#include "verify/launchers_impl.cuh"

template struct kvrope::testing::Launchers<float, int32_t>;
template struct kvrope::testing::Launchers<float, int64_t>;
