// kvrope_bench: Google Benchmark suite for the backward op (docs/spec.md §1) on the cases of
// bench/sol_execbench_062_cases.csv, timed with the leaderboard's protocol (docs/spec.md §5.3):
// L2 flushed and the device synchronized before each call, GPU span of the call from CUPTI
// activity records, median over the calls; plus the CUDA-event time, the floor and a summary.
// --suite=forward|decode|styles runs the forward op (docs/spec.md §2) under the same protocol instead
// (support/forward_bench.cuh, support/forward_report.cuh); --suite=serve-decode|serve-prefill the serving
// forward, kv_cache_rope_append (docs/spec.md §6; support/serve_bench.cuh, support/serve_report.cuh).
// docs/benchmarks.md describes the protocol, the flags and the output; the harness is in support/.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <kvrope/kvrope.cuh>

#include "bench/naive/naive_backward.cuh"
#include "verify/launch_policy.cuh"
#include "verify/launchers.cuh"  // the launchers, compiled once (kvrope_launchers)

#include "support/calibration.cuh"
#include "support/case_data.cuh"
#include "support/cases.hpp"
#include "support/check.cuh"
#include "support/cupti_clock.cuh"
#include "support/cupti_records.cuh"
#include "support/device.cuh"
#include "support/forward_bench.cuh"
#include "support/forward_report.cuh"
#include "support/json.cuh"
#include "support/options.cuh"
#include "support/results.cuh"
#include "support/serve_bench.cuh"
#include "support/serve_report.cuh"
#include "support/stats.hpp"
#include "support/summary.cuh"
#include "support/timed_calls.cuh"

namespace kvrope_bench {

Run g_run;
std::unique_ptr<GpuClock> g_clock;
std::unique_ptr<CaseDataBase> g_case;  // the case alive now
Policy g_policy{};                     // the tuned calls' policy (tuning flags given)

// The benchmark of one (case, variant).
template <typename T>
void run_variant(benchmark::State& state, const LeaderboardCase& lc, Variant variant) {
  const Options& opt = g_run.options;
  CaseData<T>& data = acquire_case<T>(g_case, lc, opt, g_run.device.fill_blocks(), g_clock->stream());
  const cudaStream_t stream = g_clock->stream();
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
      case Variant::kFused:
        status = tuned ? Launchers::backward(oop, g_policy, st) : Launchers::backward(oop, st);
        break;
      case Variant::kInPlace:
        status = tuned ? Launchers::backward(ip, g_policy, st) : Launchers::backward(ip, st);
        break;
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
    launch(stream);
    KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
    if (!status.ok()) {
      state.SkipWithError(status_message(launcher, status).c_str());
      return;
    }
    const std::string failure = in_place ? data.check(data.gk_work, data.gv_work) : data.check(data.gk_in, data.gv_in);
    if (!failure.empty()) {
      state.SkipWithError(failure.c_str());
      return;
    }
    checked = true;
  }

  VariantResult r;
  r.checked = checked;
  std::vector<double> activities;
  if (!time_calls(state, *g_clock, opt.warmup, prepare, launch, status, launcher, r, activities)) return;
  if (const int flag = data.read_error_flag(); flag != 0) {
    state.SkipWithError(("the kernel raised error_flag = " + std::to_string(flag)).c_str());
    return;
  }
  if (!data.workspace_zero()) {
    state.SkipWithError("the kernel left its workspace nonzero");
    return;
  }
  finish_timing(state, r, activities);

  CaseResult& cr = g_run.results[lc.id];
  cr.lc = lc;
  cr.bytes = traffic_of(lc, sizeof(T));
  cr.floor_us = g_run.calibration.floor_us(cr.bytes.out_of_place);
  cr.inplace_floor_us = g_run.calibration.floor_us(cr.bytes.in_place);
  const double bytes = in_place ? cr.bytes.in_place : cr.bytes.out_of_place;
  const double floor = in_place ? cr.inplace_floor_us : cr.floor_us;

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
  state.counters["activities"] = r.activities;
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

template <typename T>
void register_case_benchmarks(const LeaderboardCase& lc) {
  for (Variant v : variant_order(g_run.options)) {
    if (!selected(g_run.options, v)) continue;
    char name[64];
    std::snprintf(name, sizeof(name), "backward/%s/case:%02d", variant_name(v), lc.id);
    benchmark::RegisterBenchmark(name, [lc, v](benchmark::State& st) { run_variant<T>(st, lc, v); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(g_run.options.iters);
  }
}

// The rows --cases asks for (all by default), in its order, with --heads and --head_dim applied.
std::vector<LeaderboardCase> select_cases(const std::vector<LeaderboardCase>& table, const Options& opt) {
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

void print_header(const Run& run) {
  const DeviceInfo& d = run.device;
  const Calibration& c = run.calibration;
  const Options& o = run.options;
  std::printf("kvrope_bench: %s (sm_%d%d), %d SMs, L2 %.1f MiB, %.1f GiB", d.name.c_str(), d.major, d.minor, d.sm_count,
              static_cast<double>(d.l2_bytes) / (1 << 20), static_cast<double>(d.global_bytes) / (1 << 30));
  if (d.sm_clock_khz > 0) std::printf(", SM clock %d MHz", d.sm_clock_khz / 1000);
  if (d.mem_clock_khz > 0) std::printf(", memory clock %d MHz", d.mem_clock_khz / 1000);
  std::printf("; driver %d, runtime %d\n", d.driver_version, d.runtime_version);
  std::printf("copy bandwidth: %.3f TB/s (1 GiB cudaMemcpyAsync D2D, read + written / CUPTI median of %d: %.1f us)\n",
              c.bandwidth_bytes_per_us * 1e-6, c.copy_calls, c.copy_median_us);
  std::printf("empty kernel: %.3f us (CUPTI median of %d); its CUDA-event time (tracing off): %.2f us\n",
              c.empty_kernel_us, c.empty_calls, c.empty_kernel_event_us);
  if (serve_suite(o.suite)) {
    const ServeCase& c = run.serve_cases.front();
    std::printf(
        "config: suite %s (the serving forward), bf16 q, k, v as views of one qkv [T, (Hq + 2 H) D], H %lld, D %lld, "
        "pages of %lld (NHD and HND, page ids shuffled), positions and slots int64, table cache fp32 [max_position, "
        "D], fp8 e4m3 caches with per-tensor scales k %g, v %g; q rotated in place; %lld timed calls + %lld warm-up "
        "per case, check %s, L2 flush %.1f MiB %s\n",
        suite_name(o.suite), static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
        static_cast<long long>(c.page_size), static_cast<double>(kServeKeyScale), static_cast<double>(kServeValueScale),
        static_cast<long long>(o.iters), static_cast<long long>(o.warmup), o.check ? "on" : "off",
        static_cast<double>(run.flush_bytes) / (1 << 20),
        o.flush_reads ? "read (--flush=read: a diagnostic, not the protocol)" : "written");
    // The q-fp8 cases, when selected: what they write besides (serve_cases.hpp).
    if (std::any_of(run.serve_cases.begin(), run.serve_cases.end(), [](const ServeCase& sc) { return sc.query_fp8; }))
      std::printf(
          "q-fp8 cases (cache fp8_e4m3+q8): kvrope and kvrope_kip write RoPE(q) to query_out_fp8 [T, Hq, D] in fp8 "
          "e4m3, per-tensor scale %g (a device float), q left as it was; the naive reference runs as on the "
          "fp8_e4m3 case (q rotated in place in bf16: it has no fp8 q)\n",
          static_cast<double>(kServeQueryScale));
    std::printf("\n");
    std::fflush(stdout);
    return;
  }
  if (forward_suite(o.suite)) {
    std::printf(
        "config: suite %s (the forward op), dtype %s, %s, positions %s (int64), in place into the caches, k_out on, no "
        "q, "
        "per-token tables [B, S, R], %lld timed calls + %lld warm-up per case, check %s, L2 flush %.1f MiB %s\n\n",
        suite_name(o.suite), dtype_text(run).c_str(), dims_text(run.cases).c_str(), positions_text(run).c_str(),
        static_cast<long long>(o.iters), static_cast<long long>(o.warmup), o.check ? "on" : "off",
        static_cast<double>(run.flush_bytes) / (1 << 20),
        o.flush_reads ? "read (--flush=read: a diagnostic, not the protocol)" : "written");
    std::fflush(stdout);
    return;
  }
  std::printf(
      "config: suite %s (the backward op), dtype %s, %s, positions %s (int64), %lld timed calls + %lld warm-up per "
      "case, check %s, L2 flush %.1f MiB %s, fused workspace %s\n\n",
      suite_name(o.suite), dtype_text(run).c_str(), dims_text(run.cases).c_str(), positions_text(run).c_str(),
      static_cast<long long>(o.iters), static_cast<long long>(o.warmup), o.check ? "on" : "off",
      static_cast<double>(run.flush_bytes) / (1 << 20),
      o.flush_reads ? "read (--flush=read: a diagnostic, not the protocol)" : "written", o.workspace ? "on" : "off");
  if (o.tuned())  // a record of the launch parameters the fused variants ran with, as in the JSON
    std::printf("launch tuning (flags): %s\n\n", policy_json(g_policy).c_str());
  std::fflush(stdout);
}

}  // namespace kvrope_bench

int main(int argc, char** argv) {
  using namespace kvrope_bench;
  Run& run = g_run;
  run.options = parse_options(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const bool serve = serve_suite(run.options.suite);
  if (serve) {  // generated cases, no table
    run.serve_cases = select_serve_cases(run.options);
  } else {
    run.table = read_cases(run.options.cases_csv);
    run.cases = select_cases(run.table, run.options);
  }

  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("kvrope_bench: no CUDA device available (%s); nothing to benchmark.\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 0;
  }
  if (run.options.iters < 50) {
    std::fprintf(stderr, "kvrope_bench: warning: --iters=%lld is below the protocol's 50 calls per case\n",
                 static_cast<long long>(run.options.iters));
  }

  if (run.options.cupti) cupti::init();
  KVROPE_BENCH_CUDA(cudaFree(nullptr));  // create the context
  run.device = query_device();
  g_policy = tuned_policy(run.options, run.device.major);
  cudaStream_t stream = nullptr;
  KVROPE_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  g_clock = std::make_unique<GpuClock>(stream, run.device, run.options.flush_reads, run.options.primer);
  run.flush_bytes = g_clock->flush_bytes();
  run.calibration = calibrate(*g_clock);
  print_header(run);

  benchmark::AddCustomContext("kvrope_device", run.device.name);
  benchmark::AddCustomContext("kvrope_dtype", dtype_text(run));
  benchmark::AddCustomContext("kvrope_heads", std::to_string(serve ? run.serve_cases.front().heads
                                                                   : common_value(run.cases, &LeaderboardCase::heads)));
  benchmark::AddCustomContext(
      "kvrope_head_dim",
      std::to_string(serve ? run.serve_cases.front().head_dim : common_value(run.cases, &LeaderboardCase::head_dim)));
  benchmark::AddCustomContext("kvrope_positions",
                              serve ? std::string("position in the sequence") : positions_text(run));
  benchmark::AddCustomContext("kvrope_copy_bandwidth_TBps", fmt("%.4f", run.calibration.bandwidth_bytes_per_us * 1e-6));
  benchmark::AddCustomContext("kvrope_empty_kernel_us", fmt("%.4f", run.calibration.empty_kernel_us));

  const bool forward = forward_suite(run.options.suite);
  benchmark::AddCustomContext("kvrope_suite", suite_name(run.options.suite));
  if (serve) {  // bf16 q, k, v; bf16 and fp8 caches
    register_serve_benchmarks<__nv_bfloat16>(run, *g_clock, g_case);
  } else if (forward) {  // one dtype a forward suite
    if (run.options.dtype == "bf16") register_forward_benchmarks<__nv_bfloat16>(run, *g_clock, g_case);
    if (run.options.dtype == "fp16") register_forward_benchmarks<__half>(run, *g_clock, g_case);
    if (run.options.dtype == "fp32") register_forward_benchmarks<float>(run, *g_clock, g_case);
  } else {  // the backward's cases each in their own dtype, in table order
    for (const LeaderboardCase& lc : run.cases) {
      const std::string& dtype = dtype_of(lc, run.options);
      if (dtype == "bf16") register_case_benchmarks<__nv_bfloat16>(lc);
      if (dtype == "fp16") register_case_benchmarks<__half>(lc);
      if (dtype == "fp32") register_case_benchmarks<float>(lc);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  g_case.reset();
  // The serve suites' host time of one call (support/serve_bench.cuh, measure_serve_host): after the
  // benchmarks, on the warm device.
  if (serve) measure_serve_host<__nv_bfloat16>(run, *g_clock, g_case);

  if (serve) {
    const ServeSummary summary = summarize_serve(run);
    print_serve_summary(run, summary);
    write_serve_json(run, summary, run.options.json_path);
  } else if (forward) {
    const ForwardSummary summary = summarize_forward(run);
    print_forward_summary(run, summary);
    write_forward_json(run, summary, run.options.json_path);
  } else {
    const Summary summary = summarize(run);
    print_summary(run, summary);
    write_json(run, summary, run.options.json_path);
  }

  benchmark::Shutdown();
  g_clock.reset();
  KVROPE_BENCH_CUDA(cudaStreamDestroy(stream));
  KVROPE_BENCH_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  return 0;
}
