// kvrope_torch's launchers for __half (launch.h); one file a dtype, so that they compile in parallel.
#include "launch_cuda.cuh"

KVROPE_TORCH_LAUNCHERS(__half);
