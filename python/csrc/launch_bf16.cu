// kvrope_torch's CUDA entry points for bf16 (ops_cuda.cuh); one file a dtype, so that they compile in parallel.
#include "ops_cuda.cuh"

template void kvrope_torch::forward_cuda<kvrope_torch::DType::kBf16>(const kvrope_torch::ForwardTensors&);
template void kvrope_torch::backward_cuda<kvrope_torch::DType::kBf16>(const kvrope_torch::BackwardTensors&);
