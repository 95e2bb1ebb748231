// kvrope_torch's append launchers for __half (launch.h), one file a dtype.
#include "launch_cuda.cuh"

KVROPE_TORCH_APPEND_LAUNCHERS(__half);
