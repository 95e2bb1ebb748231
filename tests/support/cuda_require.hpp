// KVROPE_CUDA_REQUIRE(call): a Catch2 REQUIRE that a CUDA runtime call returned cudaSuccess, naming the call
// and the error's text when it did not.
#pragma once

#include <cuda_runtime.h>

#include "support/catch.hpp"

#define KVROPE_CUDA_REQUIRE(call)                             \
  do {                                                        \
    const cudaError_t kvrope_err_ = (call);                   \
    INFO(#call << " -> " << cudaGetErrorString(kvrope_err_)); \
    REQUIRE(kvrope_err_ == cudaSuccess);                      \
  } while (false)
