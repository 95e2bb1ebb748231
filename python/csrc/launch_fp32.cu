// kvrope_torch's launchers for float (launch.h); one file a dtype, so that they compile in parallel.
#include "launch_cuda.cuh"

KVROPE_TORCH_LAUNCHERS(float);
