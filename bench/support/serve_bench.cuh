// The serve suites (--suite=serve-decode|serve-prefill): one Google Benchmark per (case, variant) under the
// protocol of the other suites (docs/spec.md §5.3), kv_cache_rope_append checked first against the naive two
// launches (support/serve_case.cuh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <kvrope/kvrope.cuh>
#include <kvrope/reference/naive_append.cuh>

#include "support/append_launchers.cuh"  // tests/support: the launchers, compiled once

#include "cupti_clock.cuh"
#include "options.cuh"
#include "results.cuh"
#include "serve_case.cuh"
#include "serve_cases.hpp"
#include "timed_calls.cuh"

namespace kvrope_bench {

// The benchmark of one (case, variant) of a serve suite; `slot` holds the case alive now.
template <typename T, typename C>
void run_serve_variant(benchmark::State& state, Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot,
                       const ServeCase& sc, ServeVariant variant) {
  const Options& opt = run.options;
  ServeCaseData<T, C>& data = acquire_serve_case<T, C>(slot, sc, opt, run.device.fill_blocks(), clock.stream());
  const cudaStream_t stream = clock.stream();
  const bool naive = variant == ServeVariant::kNaive;
  const bool key_in_place = variant != ServeVariant::kKvrope;  // the naive rotates k in place
  const auto params = data.params(key_in_place);

  kvrope::Status status;
  auto launch = [&](cudaStream_t st) {
    status = naive ? kvrope::reference::naive_append(params, st)
                   : kvrope::testing::AppendLaunchers<T, C, int64_t>::append(params, st);
  };
  // Nothing to restore: q (and k) are rotated again each call, the same cache rows written.
  auto prepare = [](cudaStream_t) {};
  const char* launcher = naive ? "naive_append" : "kv_cache_rope_append";

  ServeCaseResult& cr = run.serve_results[sc.id];
  cr.sc = sc;
  cr.bytes = serve_bytes(sc, false);
  cr.bytes_kip = serve_bytes(sc, true);
  cr.floor_us = run.calibration.floor_us(cr.bytes);
  cr.floor_kip_us = run.calibration.floor_us(cr.bytes_kip);

  // Check once before timing; a failed check is reported (here, in the label and the summary) and the
  // variant still timed, so that one run gives both.
  bool checked = false;
  std::string label = naive ? "reference" : "unchecked";
  if (opt.check && !naive) {
    const ServeCheck c = data.check(launch, status, key_in_place, stream);
    if (!status.ok()) {
      state.SkipWithError(c.failure.c_str());
      return;
    }
    checked = true;
    ++cr.checks;
    const std::string who = std::string(suite_name(opt.suite)) + "/" + serve_variant_name(variant) + " case " +
                            std::to_string(sc.id) + ": ";
    if (!c.failure.empty()) {
      std::printf("CHECK FAILED %s%s\n", who.c_str(), c.failure.c_str());
      if (cr.check_failure.empty()) cr.check_failure = who + c.failure;
      label = "CHECK FAILED";
    } else {
      label = "checked";
    }
    if (!c.note.empty() && cr.check_note.empty()) cr.check_note = who + c.note;
  }

  VariantResult r;
  r.checked = checked;
  std::vector<double> activities;
  if (!time_calls(state, clock, opt.warmup, prepare, launch, status, launcher, r, activities)) return;
  if (const int flag = data.read_error_flag(stream); flag != 0) {
    state.SkipWithError(("the call raised error_flag = " + std::to_string(flag)).c_str());
    return;
  }
  finish_timing(state, r, activities);

  const double bytes = cr.bytes_of(variant), floor = cr.floor_of(variant);
  const double empty = run.calibration.empty_kernel_us;
  state.counters["median_us"] = r.median_us;
  state.counters["event_median_us"] = r.event_median_us;
  state.counters["event_us"] = r.event_median_us;
  state.counters["event_traced_us"] = r.event_traced_median_us;
  state.counters["min_us"] = r.min_us;
  state.counters["p90_us"] = r.p90_us;
  state.counters["bytes"] = bytes;
  state.counters["TBps"] = bytes / r.median_us * 1e-6;
  state.counters["floor_us"] = floor;
  state.counters["x_floor"] = r.median_us / floor;
  if (sc.decode) state.counters["x_floor_empty"] = r.median_us / (floor + empty);
  state.counters["activities"] = r.activities;
  // The naive reference's speedups on the row of whichever ran last.
  if (const VariantResult* n = find_variant(cr, ServeVariant::kNaive); n != nullptr && !naive)
    state.counters["speedup_vs_naive"] = n->median_us / r.median_us;
  if (naive) {
    if (const VariantResult* k = find_variant(cr, ServeVariant::kKvrope))
      state.counters["kvrope_speedup"] = r.median_us / k->median_us;
    if (const VariantResult* k = find_variant(cr, ServeVariant::kKvropeKeyInPlace))
      state.counters["kvrope_kip_speedup"] = r.median_us / k->median_us;
  }
  state.SetLabel(label);
  cr.variants[variant] = std::move(r);
}

// The cases --cases selects (all by default), in their order, from the suite's table.
inline std::vector<ServeCase> select_serve_cases(const Options& opt) {
  const std::vector<ServeCase> table = serve_case_table(opt.suite == Suite::kServeDecode, opt.heads, opt.head_dim);
  if (opt.cases.empty()) return table;
  std::vector<ServeCase> cases;
  for (int id : opt.cases) {
    const auto it = std::find_if(table.begin(), table.end(), [&](const ServeCase& c) { return c.id == id; });
    if (it == table.end())
      bad_option("--cases=" + std::to_string(id), ("the suite has cases 1 to " + std::to_string(table.size())).c_str());
    cases.push_back(*it);
  }
  return cases;
}

// One benchmark per (case, variant), named suite/variant/case:NN.
template <typename T>
void register_serve_benchmarks(Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot) {
  for (const ServeCase& sc : run.serve_cases) {
    for (ServeVariant v : serve_variant_order(run.options)) {
      if (!serve_selected(run.options, v)) continue;
      char name[64];
      std::snprintf(name, sizeof(name), "%s/%s/case:%02d", suite_name(run.options.suite), serve_variant_name(v), sc.id);
      benchmark::RegisterBenchmark(name,
                                   [&run, &clock, &slot, sc, v](benchmark::State& st) {
                                     if (sc.cache == ServeCache::kBf16)
                                       run_serve_variant<T, T>(st, run, clock, slot, sc, v);
                                     else
                                       run_serve_variant<T, __nv_fp8_e4m3>(st, run, clock, slot, sc, v);
                                   })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->Iterations(run.options.iters);
    }
  }
}

}  // namespace kvrope_bench
