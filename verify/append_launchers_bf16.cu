// The tests' and the benchmark's append launchers for __nv_bfloat16 (append_launchers.cuh).
#include "verify/append_launchers_impl.cuh"

KVROPE_APPEND_LAUNCHERS(__nv_bfloat16);
