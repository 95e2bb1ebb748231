// The timed part of a benchmark, shared by the suites (docs/spec.md §5.3): warm-up calls, one CUPTI-timed
// call per iteration, as many CUDA-event-timed calls with tracing off, then the statistics.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <kvrope/core/status.cuh>

#include "check.cuh"
#include "cupti_clock.cuh"
#include "cupti_records.cuh"
#include "results.cuh"
#include "stats.hpp"

namespace kvrope_bench {

inline std::string status_message(const char* what, const kvrope::Status& st) {
  std::string msg = std::string(what) + " returned " + kvrope::to_string(st.code);
  if (st.field != nullptr) msg += std::string(" (") + st.field + ")";
  if (st.cuda_error != cudaSuccess) msg += std::string(": ") + cudaGetErrorString(st.cuda_error);
  return msg;
}

// `warmup` untimed calls, then one call timed by `clock` per iteration of `state` (CUPTI span and traced
// CUDA-event time into r), then as many calls again timed by CUDA events with tracing off. Each call is
// prepare(stream) (before the L2 flush, untimed) and launch(stream), which sets `status`. False when a call
// failed (the benchmark is then skipped with the reason) or none was timed.
template <typename Prepare, typename Launch>
bool time_calls(benchmark::State& state, GpuClock& clock, int64_t warmup, Prepare&& prepare, Launch&& launch,
                const kvrope::Status& status, const char* launcher, VariantResult& r, std::vector<double>& activities) {
  const cudaStream_t stream = clock.stream();
  // Warm-up (module loading, first-touch effects), not timed.
  for (int64_t i = 0; i < warmup; ++i) {
    prepare(stream);
    launch(stream);
    if (!status.ok()) {
      state.SkipWithError(status_message(launcher, status).c_str());
      return false;
    }
  }
  KVROPE_BENCH_CUDA(cudaDeviceSynchronize());

  bool failed = false;
  for (auto _ : state) {
    const Sample s = clock.time(prepare, launch);
    if (!status.ok()) {
      state.SkipWithError(status_message(launcher, status).c_str());
      failed = true;
      break;
    }
    if (s.activities == 0) {
      state.SkipWithError("CUPTI recorded no GPU activity for the call");
      failed = true;
      break;
    }
    r.cupti_us.push_back(s.cupti_us);
    r.event_traced_us.push_back(s.event_us);
    activities.push_back(s.activities);
    state.SetIterationTime(1e-6 * s.cupti_us);
  }
  if (failed || r.cupti_us.empty()) return false;

  // The CUDA-event times a caller sees: as many calls again, same protocol, tracing off.
  cupti::set_tracing(false);
  for (size_t i = 0; i < r.cupti_us.size() && status.ok(); ++i) {
    r.event_us.push_back(clock.time_events(prepare, launch));
  }
  cupti::set_tracing(true);
  if (!status.ok()) {
    state.SkipWithError(status_message(launcher, status).c_str());
    return false;
  }
  return true;
}

// The statistics of the timed calls, and the correction that makes Google Benchmark report their median.
inline void finish_timing(benchmark::State& state, VariantResult& r, const std::vector<double>& activities) {
  r.median_us = median_of(r.cupti_us);
  r.event_median_us = median_of(r.event_us);
  r.event_traced_median_us = median_of(r.event_traced_us);
  r.min_us = *std::min_element(r.cupti_us.begin(), r.cupti_us.end());
  r.max_us = *std::max_element(r.cupti_us.begin(), r.cupti_us.end());
  r.mean_us = std::accumulate(r.cupti_us.begin(), r.cupti_us.end(), 0.0) / static_cast<double>(r.cupti_us.size());
  r.p90_us = percentile_of(r.cupti_us, 0.9);
  r.activities = median_of(activities);

  // Google Benchmark reports the mean of the per-iteration manual times. Each call was given its
  // own time above; this one correction makes the sum N * median, so the reported time is the median.
  const double n = static_cast<double>(r.cupti_us.size());
  state.SetIterationTime(1e-6 * (n * r.median_us - n * r.mean_us));
}

}  // namespace kvrope_bench
