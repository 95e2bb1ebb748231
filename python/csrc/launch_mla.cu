// kvrope_torch's MLA append launchers (launch.h), every element type in this one file: its kernels are small
// (three a (T, C), nine a T), and one file a dtype would compile the headers three times. sm_90, host -O1, on
// one core: 37 s for this file, 18 s for a file of one dtype, 8 s for the headers alone.
#include <kvrope/mla_append.cuh>

#include "launch.h"

namespace kvrope_torch {

template <typename T, typename C, typename Pos>
kvrope::Status launch_mla_append(const kvrope::MlaAppendParams<T, C, Pos>& p, cudaStream_t stream) {
  return kvrope::mla_append(p, stream);
}

}  // namespace kvrope_torch

KVROPE_TORCH_MLA_LAUNCHERS(__nv_bfloat16);
KVROPE_TORCH_MLA_LAUNCHERS(__half);
KVROPE_TORCH_MLA_LAUNCHERS(float);
