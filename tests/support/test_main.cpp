// The main() of every kvrope test binary. Built twice: kvrope_test_main for host tests, and
// kvrope_gpu_test_main (KVROPE_GPU_TEST defined) for GPU tests, which exits with 77 — ctest's
// SKIP_RETURN_CODE, reported as "Skipped", never as passed — when no CUDA device can be used.
#include <cstdio>

#ifdef KVROPE_GPU_TEST
#include <cuda_runtime_api.h>
#endif

namespace kvrope_test {
int run_catch(int argc, char* argv[]);  // catch_runner.cpp
}  // namespace kvrope_test

namespace {
#ifdef KVROPE_GPU_TEST
constexpr int kSkipReturnCode = 77;

// True when at least one CUDA device is visible and usable; prints why not otherwise.
bool have_cuda_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    std::printf("SKIPPED: no CUDA device (cudaGetDeviceCount: %s)\n", cudaGetErrorString(err));
    return false;
  }
  if (count == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return false;
  }
  return true;
}
#endif
}  // namespace

int main(int argc, char* argv[]) {
#ifdef KVROPE_GPU_TEST
  if (!have_cuda_device()) {
    std::fflush(stdout);
    return kSkipReturnCode;
  }
#endif
  return kvrope_test::run_catch(argc, argv);
}
