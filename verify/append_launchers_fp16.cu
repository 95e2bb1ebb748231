// The tests' and the benchmark's append launchers for __half (append_launchers.cuh).
#include "verify/append_launchers_impl.cuh"

KVROPE_APPEND_LAUNCHERS(__half);
