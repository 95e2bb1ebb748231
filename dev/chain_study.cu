// chain_study: the latency floor of a position -> rows -> stores chain (docs/performance-log.md, v11).
// One warp loads 16 bytes a lane from each of `loads` buffers in turn, each address taken from the
// previous load's value (all zero: the same line of every buffer), then stores `stores` x 512 bytes.
// Its CUPTI time after the L2 flush is the least any kernel takes whose stores wait on that many
// dependent round trips: loads = 2 and 16 stores is the in-place backward of one token. Timed by
// kvrope_bench's clock (bench/support).
//   chain_study [--iters=N] [--flush=write|read] [--primer=0|1]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "calibration.cuh"
#include "check.cuh"
#include "cupti_clock.cuh"
#include "cupti_records.cuh"
#include "device.cuh"
#include "floor_study.cuh"
#include "stats.hpp"

namespace {

using namespace kvrope_bench;

struct ChainBuffers {
  const uint4* buf[3];  // kernel parameters: no load of their own
};
// The same with 768 bytes of parameters (about the fused kernel's), the pointers last.
struct BigChainBuffers {
  unsigned char pad[744];
  const uint4* buf[3];
};

template <typename Buffers>
__global__ void chain_kernel(const Buffers bufs, int loads, uint4* out, int stores, int use_shared) {
  extern __shared__ uint4 chain_shared[];
  const int lane = threadIdx.x & 31;
  uint32_t offset = 0;
  uint4 v = make_uint4(0, 0, 0, 0);
  for (int i = 0; i < loads; ++i) {
    v = bufs.buf[i][offset + lane];
    offset = v.x;  // zero: the dependence alone
  }
  if (use_shared) {  // through shared memory once, so that the kernel uses what it asked for
    chain_shared[lane] = v;
    __syncwarp();
    v = chain_shared[lane ^ 1];
  }
  for (int i = 0; i < stores; ++i) out[i * 32 + lane] = v;
}

void run_chain_study(GpuClock& clock, int64_t iters, double empty_kernel_us) {
  constexpr int kMaxLoads = static_cast<int>(std::size(ChainBuffers{}.buf));
  constexpr size_t kBufBytes = size_t{4} << 20;  // separate allocations, as a call's tensors are
  std::vector<DeviceBuffer> bufs;
  ChainBuffers ptrs{};
  BigChainBuffers big{};
  for (int i = 0; i < kMaxLoads; ++i) {
    bufs.emplace_back(kBufBytes);
    KVROPE_BENCH_CUDA(cudaMemset(bufs.back().as<void>(), 0, kBufBytes));
    ptrs.buf[i] = big.buf[i] = bufs.back().as<const uint4>();
  }
  DeviceBuffer out(kBufBytes);
  constexpr int kBigShared = 200 * 1024;
  KVROPE_BENCH_CUDA(
      cudaFuncSetAttribute(chain_kernel<ChainBuffers>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBigShared));
  std::printf(
      "chain study: one warp, k dependent 16-byte loads a lane (separate 4 MiB buffers), then n x 512 B of\n"
      "stores; CUPTI median of %lld calls, L2 flushed before each (the empty kernel: %.3f us)\n",
      static_cast<long long>(iters), empty_kernel_us);
  auto time_it = [&](const char* what, int loads, int stores, auto&& launch) {
    const std::vector<double> t = study_times_us(clock, iters, launch);
    std::printf("chain: loads %d, stores %2d x 512 B%s: median %.3f us, p10 %.3f, p90 %.3f\n", loads, stores, what,
                median_of(t), percentile_of(t, 0.1), percentile_of(t, 0.9));
  };
  for (const int stores : {0, 1, 16})
    for (int loads = 0; loads <= kMaxLoads; ++loads) {
      if (stores == 0 && loads > 0) continue;
      time_it("", loads, stores,
              [&](cudaStream_t st) { chain_kernel<<<1, 32, 0, st>>>(ptrs, loads, out.as<uint4>(), stores, 0); });
    }
  // What else a kernel brings: shared memory (the carveout it needs), a large parameter block.
  for (const int shared : {512, 48 * 1024, kBigShared}) {
    char what[64];
    std::snprintf(what, sizeof(what), ", %d B of shared memory", shared);
    for (const int loads : {0, 2})
      time_it(what, loads, 16,
              [&](cudaStream_t st) { chain_kernel<<<1, 32, shared, st>>>(ptrs, loads, out.as<uint4>(), 16, 1); });
  }
  for (const int loads : {0, 2})
    time_it(", 768 B of parameters", loads, 16,
            [&](cudaStream_t st) { chain_kernel<<<1, 32, 0, st>>>(big, loads, out.as<uint4>(), 16, 0); });
  std::fflush(stdout);
}

[[noreturn]] void usage(const char* arg) {
  std::fprintf(stderr,
               "chain_study: bad option %s\nusage: chain_study [--iters=N] [--flush=write|read] [--primer=0|1]\n", arg);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t iters = 100;
  bool flush_reads = false, primer = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--iters=", 0) == 0) {
      iters = std::atoll(arg.c_str() + 8);
      if (iters < 1) usage(argv[i]);
    } else if (arg == "--flush=write" || arg == "--flush=read") {
      flush_reads = arg == "--flush=read";
    } else if (arg == "--primer=0" || arg == "--primer=1") {
      primer = arg == "--primer=1";
    } else {
      usage(argv[i]);
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("chain_study: no CUDA device available; nothing to time.\n");
    return 0;
  }
  cupti::init();
  KVROPE_BENCH_CUDA(cudaFree(nullptr));  // create the context
  const DeviceInfo device = query_device();
  cudaStream_t stream = nullptr;
  KVROPE_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    GpuClock clock(stream, device, flush_reads, primer);
    const Calibration calibration = calibrate(clock);
    std::printf("chain_study: %s (sm_%d%d), %d SMs; L2 flush %.1f MiB %s%s\n", device.name.c_str(), device.major,
                device.minor, device.sm_count, static_cast<double>(clock.flush_bytes()) / (1 << 20),
                flush_reads ? "read (a diagnostic, not the protocol)" : "written", primer ? "" : ", no primer");
    run_chain_study(clock, iters, calibration.empty_kernel_us);
  }
  KVROPE_BENCH_CUDA(cudaStreamDestroy(stream));
  KVROPE_BENCH_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  return 0;
}
