// kvrope_torch's launchers for __nv_bfloat16 (launch.h); one file a dtype, so that they compile in parallel.
#include "launch_cuda.cuh"

KVROPE_TORCH_LAUNCHERS(__nv_bfloat16);
