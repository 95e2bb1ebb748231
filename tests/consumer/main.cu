// Consumer check: the package's headers and API work from a separate project (no GPU needed), the
// float64 references of <kvrope/reference/> included (they must stand on the installed headers alone).
#include <cuda_bf16.h>

#include <cstdio>

#include <kvrope/kvrope.cuh>
#include <kvrope/reference/cpu_append.hpp>
#include <kvrope/reference/cpu_backward.hpp>
#include <kvrope/reference/cpu_forward.hpp>

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
  // The references on calls with nothing to compute (B = S = 0), and 1.0 in fp8 e4m3 (0 0111 000).
  kvrope::ForwardParams<__nv_bfloat16> forward;
  forward.head_dim = 128;
  kvrope::BackwardParams<__nv_bfloat16> backward;
  backward.head_dim = 128;
  const bool reference_ok = kvrope::reference::cpu_forward(forward).key_cache.empty() &&
                            kvrope::reference::cpu_backward(backward).grad_key_states.empty() &&
                            kvrope::reference::fp8_encode(1.0f, kvrope::reference::Fp8Format::kE4M3) == 0x38;
  std::printf("reference: %s\n", reference_ok ? "ok" : "wrong");
  return status.code == kvrope::StatusCode::kNullPointer && reference_ok ? 0 : 1;
}
