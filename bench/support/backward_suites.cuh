// The backward's suites (--suite=leaderboard and the suites of bench/suite_*.csv): one Google Benchmark per
// (case, variant) under the protocol of docs/spec.md §5.3 (runner.cuh), each variant checked first against
// the float64 CPU reference (backward_case.cuh).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <kvrope/kvrope.cuh>

#include "verify/naive/naive_backward.cuh"
#include "verify/launch_policy.cuh"
#include "verify/launchers.cuh"  // the launchers, compiled once (kvrope_launchers)

#include "backward_case.cuh"
#include "cases.hpp"
#include "check.cuh"
#include "cupti_clock.cuh"
#include "options.cuh"
#include "results.cuh"
#include "runner.cuh"

namespace kvrope_bench {

// The benchmark of one (case, variant).
template <typename T>
void run_backward_variant(benchmark::State& state, Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot,
                          const Policy& policy, const LeaderboardCase& lc, Variant variant) {
  const Options& opt = run.options;
  CaseData<T>& data = acquire_case<CaseData<T>>(slot, lc, opt, run.device.fill_blocks(), clock.stream());
  const cudaStream_t stream = clock.stream();
  const bool in_place = variant == Variant::kInPlace;
  if (in_place) {
    data.need_in_place();
  } else {
    data.need_out_of_place();
  }
  const auto oop = data.out_of_place();
  const auto ip = data.in_place();
  size_t ws_bytes = 0;
  void* ws = variant == Variant::kNaive ? data.naive_workspace(&ws_bytes) : nullptr;

  kvrope::Status status;
  // Without tuning flags the public launcher, as a caller calls it; with them the experimental one
  // (both compiled once, in the kvrope_launchers library: verify/launchers.cuh).
  const bool tuned = opt.tuned();
  using Launchers = kvrope::testing::Launchers<T, int64_t>;
  auto launch = [&](cudaStream_t st) {
    switch (variant) {
      case Variant::kFused: status = tuned ? Launchers::backward(oop, policy, st) : Launchers::backward(oop, st); break;
      case Variant::kInPlace: status = tuned ? Launchers::backward(ip, policy, st) : Launchers::backward(ip, st); break;
      case Variant::kNaive: status = kvrope::reference::naive_backward(oop, ws, ws_bytes, st); break;
    }
  };
  auto prepare = [&](cudaStream_t st) {
    if (in_place) data.restore_in_place(st);
  };
  const char* launcher = variant == Variant::kNaive ? "naive_backward" : "kv_cache_rope_backward";
  KVROPE_BENCH_CUDA(cudaMemset(data.error_flag.template as<int>(), 0, sizeof(int)));

  // Check once, on poisoned outputs, before timing.
  bool checked = false;
  if (opt.check) {
    prepare(stream);
    data.poison_outputs(stream, !in_place);
    auto check = [&] { return in_place ? data.check(data.gk_work, data.gv_work) : data.check(data.gk_in, data.gv_in); };
    if (!check_once(state, stream, launch, status, launcher, check)) return;
    checked = true;
  }

  VariantResult r;
  r.checked = checked;
  auto after = [&]() -> std::string {
    if (const int flag = data.read_error_flag(); flag != 0)
      return "the kernel raised error_flag = " + std::to_string(flag);
    return data.workspace_zero() ? std::string() : std::string("the kernel left its workspace nonzero");
  };
  if (!run_timed(state, clock, opt.warmup, prepare, launch, status, launcher, after, r)) return;

  CaseResult& cr = run.results[lc.id];
  cr.lc = lc;
  cr.bytes = traffic_of(lc, sizeof(T));
  cr.floor_us = run.calibration.floor_us(cr.bytes.out_of_place);
  cr.inplace_floor_us = run.calibration.floor_us(cr.bytes.in_place);
  const double bytes = in_place ? cr.bytes.in_place : cr.bytes.out_of_place;
  const double floor = in_place ? cr.inplace_floor_us : cr.floor_us;
  set_time_counters(state, r, bytes, floor);
  // Each speedup over the naive reference on the row of whichever of the two ran last.
  if (variant != Variant::kNaive) {
    const auto naive = cr.variants.find(Variant::kNaive);
    if (naive != cr.variants.end()) state.counters["speedup_vs_naive"] = naive->second.median_us / r.median_us;
  } else {
    for (const auto& [other, counter] :
         {std::pair{Variant::kFused, "fused_speedup"}, std::pair{Variant::kInPlace, "inplace_speedup"}}) {
      const auto it = cr.variants.find(other);
      if (it != cr.variants.end()) state.counters[counter] = r.median_us / it->second.median_us;
    }
  }
  state.SetLabel(checked ? "checked" : "unchecked");
  cr.variants[variant] = std::move(r);
}

// One benchmark per (case, variant) of the backward's suites, each case in its own dtype, in table order.
inline void register_backward_benchmarks(Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot,
                                         const Policy& policy) {
  for (const LeaderboardCase& lc : run.cases) {
    const std::string& dtype = dtype_of(lc, run.options);
    for (Variant v : variant_order(run.options)) {
      if (!selected(run.options, v)) continue;
      register_variant("backward", variant_name(v), lc.id, run.options.iters,
                       [&run, &clock, &slot, &policy, lc, v, dtype](benchmark::State& st) {
                         if (dtype == "bf16") run_backward_variant<__nv_bfloat16>(st, run, clock, slot, policy, lc, v);
                         if (dtype == "fp16") run_backward_variant<__half>(st, run, clock, slot, policy, lc, v);
                         if (dtype == "fp32") run_backward_variant<float>(st, run, clock, slot, policy, lc, v);
                       });
    }
  }
}

}  // namespace kvrope_bench
