// The forward suites (--suite=forward|decode|styles): one Google Benchmark per (case, variant), each under
// the protocol of the backward's suite (docs/spec.md §5.3), checked first against the float64 CPU reference.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <kvrope/kvrope.cuh>

#include "verify/naive/naive_forward.cuh"

#include "cases.hpp"
#include "check.cuh"
#include "cupti_clock.cuh"
#include "forward_case.cuh"
#include "options.cuh"
#include "results.cuh"
#include "runner.cuh"

namespace kvrope_bench {

// The benchmark of one (case, variant) of a forward suite; `slot` holds the case alive now.
template <typename T>
void run_forward_variant(benchmark::State& state, Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot,
                         const LeaderboardCase& lc, FwdVariant variant) {
  const Options& opt = run.options;
  const FwdShape shape = fwd_shape(variant, lc.head_dim);
  if (shape.rotary_dim <= 0 || shape.rotary_dim % 2 != 0) {
    state.SkipWithError("R = D / 2 must be even (--head_dim a multiple of 4)");
    return;
  }
  ForwardCaseData<T>& data = acquire_case<ForwardCaseData<T>>(slot, lc, opt, run.device.fill_blocks(), clock.stream());
  const cudaStream_t stream = clock.stream();
  const auto params = data.params(shape);
  const bool naive = variant == FwdVariant::kFwdNaive;
  size_t ws_bytes = 0;
  void* ws = naive ? data.naive_workspace(params, &ws_bytes) : nullptr;

  kvrope::Status status;
  // The public launcher as a caller calls it, or the naive reference (a memset and four launches).
  auto launch = [&](cudaStream_t st) {
    status = naive ? kvrope::reference::naive_forward(params, ws, ws_bytes, st)
                   : kvrope::testing::Launchers<T, int64_t>::forward(params, st);
  };
  // Nothing to restore: a call writes the same rows with the same values each time.
  auto prepare = [](cudaStream_t) {};
  const char* launcher = naive ? "naive_forward" : "kv_cache_rope_forward";
  KVROPE_BENCH_CUDA(cudaMemset(data.error_flag.template as<int>(), 0, sizeof(int)));

  // Check once before timing: caches reset to their random contents, k_out poisoned, whole caches compared.
  bool checked = false;
  if (opt.check) {
    data.prepare_check(stream);
    if (!check_once(state, stream, launch, status, launcher, [&] { return data.check(params); })) return;
    checked = true;
  }

  VariantResult r;
  r.checked = checked;
  auto after = [&]() -> std::string {
    const int flag = data.read_error_flag();
    return flag != 0 ? "the kernel raised error_flag = " + std::to_string(flag) : std::string();
  };
  if (!run_timed(state, clock, opt.warmup, prepare, launch, status, launcher, after, r)) return;

  ForwardCaseResult& cr = run.forward_results[lc.id];
  cr.lc = lc;
  FwdResult fr;
  fr.style = style_name(shape.style);
  fr.rotary_dim = shape.rotary_dim;
  fr.bytes = forward_bytes(lc, shape.rotary_dim, sizeof(T));
  fr.floor_us = run.calibration.floor_us(fr.bytes);

  set_time_counters(state, r, fr.bytes, fr.floor_us,
                    opt.suite == Suite::kDecode ? run.calibration.empty_kernel_us : -1);
  // Speedups over the naive reference, and the styles over rotate-half, on the row of whichever ran last.
  const FwdResult* other = nullptr;
  if (variant == FwdVariant::kFwd && (other = find_variant(cr, FwdVariant::kFwdNaive)))
    state.counters["speedup_vs_naive"] = other->r.median_us / r.median_us;
  if (variant == FwdVariant::kFwdNaive && (other = find_variant(cr, FwdVariant::kFwd)))
    state.counters["fwd_speedup"] = r.median_us / other->r.median_us;
  if (variant != FwdVariant::kHalf && (other = find_variant(cr, FwdVariant::kHalf)))
    state.counters["x_half"] = r.median_us / other->r.median_us;
  if (variant == FwdVariant::kHalf) {
    for (const auto& [v, counter] :
         {std::pair{FwdVariant::kInterleaved, "interleaved_x_half"}, std::pair{FwdVariant::kHalfR64, "r64_x_half"}})
      if ((other = find_variant(cr, v))) state.counters[counter] = other->r.median_us / r.median_us;
  }
  state.SetLabel(checked ? "checked" : "unchecked");
  fr.r = std::move(r);
  cr.variants[variant] = std::move(fr);
}

// One benchmark per (case, variant) of the suite, named suite/variant/case:NN.
template <typename T>
void register_forward_benchmarks(Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot) {
  for (const LeaderboardCase& lc : run.cases) {
    for (FwdVariant v : fwd_variant_order(run.options)) {
      if (!fwd_selected(run.options, v)) continue;
      register_variant(
          suite_name(run.options.suite), fwd_variant_name(v), lc.id, run.options.iters,
          [&run, &clock, &slot, lc, v](benchmark::State& st) { run_forward_variant<T>(st, run, clock, slot, lc, v); });
    }
  }
}

}  // namespace kvrope_bench
