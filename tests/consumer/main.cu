// Consumer check: the package's headers and API work from a separate project (no GPU needed).
#include <cuda_bf16.h>

#include <cstdio>

#include <kvrope/kvrope.cuh>

int main() {
  kvrope::BackwardParams<__nv_bfloat16> params;  // every pointer null
  params.batch = 1;
  params.heads = 1;
  params.seq_len = 1;
  params.cache_len = 1;
  params.head_dim = 128;
  const kvrope::Status status = kvrope::validate(params);
  std::printf("validate: %s (field %s)\n", kvrope::to_string(status.code),
              status.field != nullptr ? status.field : "none");
  return status.code == kvrope::StatusCode::kNullPointer ? 0 : 1;
}
