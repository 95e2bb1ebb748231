// kvrope_torch's append launchers for __nv_bfloat16 (launch.h), one file a dtype.
#include "launch_cuda.cuh"

KVROPE_TORCH_APPEND_LAUNCHERS(__nv_bfloat16);
