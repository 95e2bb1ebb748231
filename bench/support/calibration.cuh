// The floor (docs/spec.md §5.1, §5.3): copy bandwidth of a large cudaMemcpyAsync and an empty
// kernel's time, under the same clock; floor = max(least bytes / bandwidth, empty kernel).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "cases.hpp"
#include "check.cuh"
#include "cupti_clock.cuh"
#include "cupti_records.cuh"
#include "device.cuh"
#include "stats.hpp"

namespace kvrope_bench {

__global__ void empty_kernel() {}

struct Calibration {
  size_t copy_bytes = 0;  // size of the copy (read + write = twice this)
  double copy_median_us = 0;
  double bandwidth_bytes_per_us = 0;  // (read + written) / time
  double empty_kernel_us = 0;
  double empty_kernel_event_us = 0;  // CUDA-event time of the empty kernel: the launch overhead alone
  int copy_calls = 0, empty_calls = 0;

  double floor_us(double bytes) const { return std::max(bytes / bandwidth_bytes_per_us, empty_kernel_us); }
};

inline Calibration calibrate(GpuClock& clock) {
  Calibration c;
  c.copy_bytes = size_t{1} << 30;
  c.copy_calls = 20;
  c.empty_calls = 50;
  {
    DeviceBuffer src(c.copy_bytes), dst(c.copy_bytes);
    KVROPE_BENCH_CUDA(cudaMemset(src.as<void>(), 1, c.copy_bytes));
    std::vector<double> t;
    for (int i = 0; i < c.copy_calls + 2; ++i) {
      const Sample s = clock.time([&](cudaStream_t st) {
        KVROPE_BENCH_CUDA(cudaMemcpyAsync(dst.as<void>(), src.as<void>(), c.copy_bytes, cudaMemcpyDeviceToDevice, st));
      });
      if (s.activities == 0) {
        std::fprintf(stderr, "kvrope_bench: no CUPTI record for the calibration copy\n");
        std::abort();
      }
      if (i >= 2) t.push_back(s.cupti_us);  // the first two warm up
    }
    c.copy_median_us = median_of(t);
    c.bandwidth_bytes_per_us = 2.0 * static_cast<double>(c.copy_bytes) / c.copy_median_us;
  }
  auto empty = [](cudaStream_t st) {
    empty_kernel<<<1, 32, 0, st>>>();
    KVROPE_BENCH_CUDA(cudaGetLastError());
  };
  std::vector<double> t, ev;
  for (int i = 0; i < c.empty_calls + 2; ++i) {
    const Sample s = clock.time(empty);
    if (s.activities == 0) {
      std::fprintf(stderr, "kvrope_bench: no CUPTI record for the empty kernel\n");
      std::abort();
    }
    if (i >= 2) t.push_back(s.cupti_us);
  }
  c.empty_kernel_us = median_of(t);
  cupti::set_tracing(false);
  for (int i = 0; i < c.empty_calls + 2; ++i) {
    const double us = clock.time_events([](cudaStream_t) {}, empty);
    if (i >= 2) ev.push_back(us);
  }
  cupti::set_tracing(true);
  c.empty_kernel_event_us = median_of(ev);
  return c;
}

// Least bytes each variant must move (docs/spec.md §5.1).
struct Traffic {
  double out_of_place = 0;  // 4*B*H*S_max*D + 3*B*H*S*D + 4*B*S*D elements
  double in_place = 0;      // 7*B*H*S*D + 4*B*S*D elements: read and zero rows p of gK, gV, no cache copy
};

inline Traffic traffic_of(const LeaderboardCase& lc, size_t elem_bytes) {
  const double b = static_cast<double>(lc.batch), s = static_cast<double>(lc.seq_len);
  const double smax = static_cast<double>(lc.cache_len);
  const double h = static_cast<double>(lc.heads), d = static_cast<double>(lc.head_dim);
  const double e = static_cast<double>(elem_bytes);
  Traffic t;
  t.out_of_place = e * (4 * b * h * smax * d + 3 * b * h * s * d + 4 * b * s * d);
  t.in_place = e * (7 * b * h * s * d + 4 * b * s * d);
  return t;
}

}  // namespace kvrope_bench
