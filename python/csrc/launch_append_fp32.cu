// kvrope_torch's append launchers for float (launch.h), one file a dtype.
#include "launch_cuda.cuh"

KVROPE_TORCH_APPEND_LAUNCHERS(float);
