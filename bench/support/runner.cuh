// The one runner of every op's suites (docs/spec.md §5.3): the case alive now, the timed calls of a (case,
// variant) (warm-up calls, one CUPTI-timed call per iteration, as many CUDA-event-timed calls with tracing
// off, then the statistics), the counters every suite reports and the registration of the benchmark. An op's
// suites (backward_suites.cuh, forward_suites.cuh, append_suites.cuh) supply only the call, its data and its
// checks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <kvrope/core/status.cuh>

#include "check.cuh"
#include "cupti_clock.cuh"
#include "cupti_records.cuh"
#include "options.cuh"
#include "results.cuh"
#include "stats.hpp"

namespace kvrope_bench {

// One case's tensors, shared by its variants; each op's case data derives from it. Only one case is alive
// at a time (a case can take most of the GPU's memory).
struct CaseDataBase {
  virtual ~CaseDataBase() = default;
  int case_id = 0;
};

// The case's data in `slot`, allocated anew (the previous case freed first) when the case changes.
template <typename Data, typename Case>
Data& acquire_case(std::unique_ptr<CaseDataBase>& slot, const Case& c, const Options& opt, int fill_blocks,
                   cudaStream_t stream) {
  auto* current = dynamic_cast<Data*>(slot.get());
  if (current == nullptr || current->case_id != c.id) {
    slot.reset();
    slot = std::make_unique<Data>(c, opt, fill_blocks, stream);
    current = static_cast<Data*>(slot.get());
  }
  return *current;
}

// The rows --cases asks for (all by default), in its order, with --heads and --head_dim applied: the
// backward's and the forward's suites, which read a case table.
inline std::vector<LeaderboardCase> select_cases(const std::vector<LeaderboardCase>& table, const Options& opt) {
  std::vector<LeaderboardCase> cases;
  if (opt.cases.empty()) cases = table;
  for (int id : opt.cases) {
    const auto it = std::find_if(table.begin(), table.end(), [&](const LeaderboardCase& lc) { return lc.id == id; });
    if (it == table.end()) bad_option("--cases=" + std::to_string(id), "no such case in the case table");
    cases.push_back(*it);
  }
  for (LeaderboardCase& lc : cases) {
    if (opt.heads > 0) lc.heads = opt.heads;
    if (opt.head_dim > 0) lc.head_dim = opt.head_dim;
  }
  return cases;
}

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

// The check before timing: one call on `stream`, its status, then check() (a non-empty message skips the
// benchmark with it). False when the benchmark was skipped.
template <typename Launch, typename Check>
bool check_once(benchmark::State& state, cudaStream_t stream, Launch&& launch, const kvrope::Status& status,
                const char* launcher, Check&& check) {
  launch(stream);
  KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
  if (!status.ok()) {
    state.SkipWithError(status_message(launcher, status).c_str());
    return false;
  }
  if (const std::string failure = check(); !failure.empty()) {
    state.SkipWithError(failure.c_str());
    return false;
  }
  return true;
}

// The timed part of every (case, variant): time_calls, then after() (a check of what the calls left; a
// non-empty message skips the benchmark with it), then the statistics. False when the benchmark was skipped.
template <typename Prepare, typename Launch, typename After>
bool run_timed(benchmark::State& state, GpuClock& clock, int64_t warmup, Prepare&& prepare, Launch&& launch,
               const kvrope::Status& status, const char* launcher, After&& after, VariantResult& r) {
  std::vector<double> activities;
  if (!time_calls(state, clock, warmup, prepare, launch, status, launcher, r, activities)) return false;
  if (const std::string failure = after(); !failure.empty()) {
    state.SkipWithError(failure.c_str());
    return false;
  }
  finish_timing(state, r, activities);
  return true;
}

// The counters every suite reports a variant with; empty_us >= 0 adds x_floor_empty, the time over the
// floor plus one empty kernel (the decode suites).
inline void set_time_counters(benchmark::State& state, const VariantResult& r, double bytes, double floor_us,
                              double empty_us = -1) {
  state.counters["median_us"] = r.median_us;
  state.counters["event_median_us"] = r.event_median_us;
  state.counters["event_us"] = r.event_median_us;
  state.counters["event_traced_us"] = r.event_traced_median_us;
  state.counters["min_us"] = r.min_us;
  state.counters["p90_us"] = r.p90_us;
  state.counters["bytes"] = bytes;
  state.counters["TBps"] = bytes / r.median_us * 1e-6;
  state.counters["floor_us"] = floor_us;
  state.counters["x_floor"] = r.median_us / floor_us;
  if (empty_us >= 0) state.counters["x_floor_empty"] = r.median_us / (floor_us + empty_us);
  state.counters["activities"] = r.activities;
}

// One Google Benchmark, "suite/variant/case:NN", of `iters` calls timed by the runner (manual time).
template <typename Fn>
void register_variant(const char* suite, const char* variant, int case_id, int64_t iters, Fn&& fn) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s/%s/case:%02d", suite, variant, case_id);
  benchmark::RegisterBenchmark(name, std::forward<Fn>(fn))
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(iters);
}

}  // namespace kvrope_bench
