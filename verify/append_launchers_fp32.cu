// The tests' and the benchmark's append launchers for float (append_launchers.cuh).
#include "verify/append_launchers_impl.cuh"

KVROPE_APPEND_LAUNCHERS(float);
