// The floor studies' shared frame (dev/forward_floor_study.cu, dev/backward_floor_study.cu,
// dev/append_floor_study.cu; study_times_us also dev/chain_study.cu): their command line, then kvrope_bench's
// CUPTI clock and calibration around one call of the study a case table. Run from the repository's root (the default
// tables are paths under bench/).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "calibration.cuh"
#include "check.cuh"
#include "cupti_clock.cuh"
#include "cupti_records.cuh"
#include "device.cuh"
#include "stats.hpp"

namespace kvrope_bench {

// The times of `iters` calls of launch(stream) (CUPTI's span, or CUDA events with --clock=events), each after the
// L2 flush (two calls before them dropped).
template <typename Launch>
std::vector<double> study_times_us(GpuClock& clock, int64_t iters, Launch&& launch) {
  std::vector<double> t;
  for (int64_t i = 0; i < iters + 2; ++i) {
    const Sample s = clock.time([&](cudaStream_t st) {
      launch(st);
      KVROPE_BENCH_CUDA(cudaGetLastError());
    });
    if (i >= 2) t.push_back(s.cupti_us);
  }
  return t;
}

// `name [--iters=N] [--cases_csv=PATH]... [--clock=cupti|events] [--flush=write|read]`: table_study(clock,
// calibration, iters, path) for each table (default: `tables`). --clock and --flush as kvrope_bench has them
// (events: CUDA events only, for runs under ncu or nsys; read: a flush by reads, which leaves L2 clean; the
// defaults are the protocol's). Returns the process's exit status.
template <typename TableStudy>
int floor_study_main(int argc, char** argv, const char* name, std::vector<std::string> tables,
                     TableStudy&& table_study) {
  int64_t iters = 50;
  bool cupti = true, flush_reads = false;
  std::vector<std::string> given;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--iters=", 0) == 0) {
      iters = std::atoll(arg.c_str() + 8);
    } else if (arg.rfind("--cases_csv=", 0) == 0) {
      given.push_back(arg.substr(12));
    } else if (arg == "--clock=cupti" || arg == "--clock=events") {
      cupti = arg == "--clock=cupti";
    } else if (arg == "--flush=write" || arg == "--flush=read") {
      flush_reads = arg == "--flush=read";
    } else {
      std::fprintf(stderr, "usage: %s [--iters=N] [--cases_csv=PATH]... [--clock=cupti|events] [--flush=write|read]\n",
                   name);
      return 2;
    }
  }
  if (!given.empty()) tables = std::move(given);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device available; nothing to time.\n", name);
    return 0;
  }
  if (cupti) cupti::init();
  KVROPE_BENCH_CUDA(cudaFree(nullptr));
  const DeviceInfo device = query_device();
  cudaStream_t stream = nullptr;
  KVROPE_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    GpuClock clock(stream, device, flush_reads, true);
    const Calibration cal = calibrate(clock);
    std::printf(
        "%s: %s, %d SMs; empty kernel %.3f us; copy bandwidth %.2f TB/s; %s median of %lld calls, L2 "
        "flushed by %s before each\n",
        name, device.name.c_str(), device.sm_count, cal.empty_kernel_us, cal.bandwidth_bytes_per_us * 1e-6,
        cupti ? "CUPTI" : "CUDA-event", static_cast<long long>(iters), flush_reads ? "reads" : "writes");
    for (const std::string& path : tables) table_study(clock, cal, iters, path);
  }
  KVROPE_BENCH_CUDA(cudaStreamDestroy(stream));
  if (cupti) KVROPE_BENCH_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  return 0;
}

}  // namespace kvrope_bench
