// kvrope_bench: the Google Benchmark suites of every op, timed with the leaderboard's protocol (docs/spec.md
// §5.3): L2 flushed and the device synchronized before each call, GPU span of the call from CUPTI activity
// records, median over the calls; plus the CUDA-event time, the floor and a summary. One runner
// (support/runner.cuh) times every op's variants; each op's suites are one file: the backward's
// (--suite=leaderboard and the suite tables: support/backward_suites.cuh), the forward's
// (--suite=forward|decode|styles: support/forward_suites.cuh) and the serving forward's,
// kv_cache_rope_append and the MLA append (--suite=serve-decode|serve-prefill: support/append_suites.cuh); their
// reports in support/*_report.cuh. docs/benchmarks.md describes the protocol, the flags and the output.
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

#include "verify/launch_policy.cuh"

#include "support/append_report.cuh"
#include "support/append_suites.cuh"
#include "support/backward_report.cuh"
#include "support/backward_suites.cuh"
#include "support/calibration.cuh"
#include "support/check.cuh"
#include "support/cupti_clock.cuh"
#include "support/cupti_records.cuh"
#include "support/device.cuh"
#include "support/forward_report.cuh"
#include "support/forward_suites.cuh"
#include "support/json.cuh"
#include "support/options.cuh"
#include "support/results.cuh"
#include "support/runner.cuh"

namespace kvrope_bench {

Run g_run;
std::unique_ptr<GpuClock> g_clock;
std::unique_ptr<CaseDataBase> g_case;  // the case alive now
Policy g_policy{};                     // the tuned calls' policy (tuning flags given)

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
  if (append_suite(o.suite)) {
    // H and D of the GQA cases (the MLA cases' are their own, printed below).
    const auto gqa =
        std::find_if(run.append_cases.begin(), run.append_cases.end(), [](const AppendCase& sc) { return !sc.mla; });
    const AppendCase& c = gqa != run.append_cases.end() ? *gqa : run.append_cases.front();
    std::printf(
        "config: suite %s (the serving forward), bf16 q, k, v as views of one qkv [T, (Hq + 2 H) D], H %lld, D %lld, "
        "pages of %lld (NHD and HND, page ids shuffled), positions and slots int64, table cache fp32 [max_position, "
        "D], fp8 e4m3 caches with per-tensor scales k %g, v %g; q rotated in place; %lld timed calls + %lld warm-up "
        "per case, check %s, L2 flush %.1f MiB %s\n",
        suite_name(o.suite), static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
        static_cast<long long>(c.page_size), static_cast<double>(kAppendKeyScale),
        static_cast<double>(kAppendValueScale), static_cast<long long>(o.iters), static_cast<long long>(o.warmup),
        o.check ? "on" : "off", static_cast<double>(run.flush_bytes) / (1 << 20),
        o.flush_reads ? "read (--flush=read: a diagnostic, not the protocol)" : "written");
    // The q-fp8 cases, when selected: what they write besides (append_cases.hpp).
    if (std::any_of(run.append_cases.begin(), run.append_cases.end(),
                    [](const AppendCase& sc) { return sc.query_fp8 && !sc.mla; }))
      std::printf(
          "q-fp8 cases (cache fp8_e4m3+q8): kvrope and kvrope_kip write RoPE(q) to query_out_fp8 [T, Hq, D] in fp8 "
          "e4m3, per-tensor scale %g (a device float), q left as it was; the naive reference runs as on the "
          "fp8_e4m3 case (q rotated in place in bf16: it has no fp8 q)\n",
          static_cast<double>(kAppendQueryScale));
    // The NVFP4 and mRoPE cases, when selected (append_cases.hpp): no naive variant on them.
    auto any = [&](AppendGroup g) {
      return std::any_of(run.append_cases.begin(), run.append_cases.end(),
                         [g](const AppendCase& sc) { return sc.group() == g; });
    };
    if (any(AppendGroup::kNvfp4))
      std::printf(
          "nvfp4 cases (cache nvfp4): NVFP4 caches, e2m1 codes [.., D / 2] and e4m3 block scales [.., D / 16] in the "
          "caches' layout, global scales k %g, v %g; the naive reference does not run on them (it has no NVFP4 "
          "cache): checked against the float64 reference instead\n",
          static_cast<double>(kAppendKeyScale), static_cast<double>(kAppendValueScale));
    if (any(AppendGroup::kMrope))
      std::printf(
          "mRoPE cases (cache bf16+mrope): the bf16-cache cases with positions [3, T] and contiguous sections "
          "{16, 24, 24} (at D = 128); the naive reference does not run on them (it has no mRoPE): checked against "
          "the float64 reference instead\n");
    if (any(AppendGroup::kMla))
      std::printf(
          "mla cases (cache mla_bf16, mla_fp8+q8; layout L+R): mla_append, L %lld, R %lld, interleaved, one cache "
          "[pages, P, L + R] (vLLM's concat_and_cache_mla layout), kv_c and k_pe views of one [T, L + R]; mla_bf16: "
          "q [T, Hq, %lld + R], q_pe rotated in place; mla_fp8+q8: q [T, Hq, %lld + R] to query_out_fp8 whole "
          "(q_nope copied), scale %g, the cache in fp8 e4m3, scale %g; kvrope only: checked against the float64 "
          "reference\n",
          static_cast<long long>(kMlaLatentDim), static_cast<long long>(kMlaRotaryDim),
          static_cast<long long>(kMlaNopeDim), static_cast<long long>(kMlaNopeDimFp8),
          static_cast<double>(kAppendQueryScale), static_cast<double>(kMlaKvScale));
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
  const bool serve = append_suite(run.options.suite);
  if (serve) {  // generated cases, no table
    run.append_cases = select_append_cases(run.options);
  } else {
    run.table = read_cases(run.options.cases_csv);
    run.cases = select_cases(run.table, run.options);
  }
  if (run.options.list_cases) {  // no device needed
    if (serve) {
      print_append_case_list(run.options, run.append_cases);
    } else {
      std::printf("%s: %zu case(s) of %s\n%4s %4s %4s %6s %6s %7s %6s %8s\n", suite_name(run.options.suite),
                  run.cases.size(), run.options.cases_csv.c_str(), "case", "H", "D", "B", "S", "S_max", "dtype", "pos");
      for (const LeaderboardCase& lc : run.cases)
        std::printf("%4d %4lld %4lld %6lld %6lld %7lld %6s %8s\n", lc.id, static_cast<long long>(lc.heads),
                    static_cast<long long>(lc.head_dim), static_cast<long long>(lc.batch),
                    static_cast<long long>(lc.seq_len), static_cast<long long>(lc.cache_len),
                    dtype_of(lc, run.options).c_str(), positions_of(lc, run.options).c_str());
    }
    return 0;
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
  // (serve suites: the first case's; an MLA case's are its one latent row and R)
  benchmark::AddCustomContext("kvrope_heads", std::to_string(serve ? run.append_cases.front().heads
                                                                   : common_value(run.cases, &LeaderboardCase::heads)));
  benchmark::AddCustomContext(
      "kvrope_head_dim",
      std::to_string(serve ? run.append_cases.front().head_dim : common_value(run.cases, &LeaderboardCase::head_dim)));
  benchmark::AddCustomContext("kvrope_positions",
                              serve ? std::string("position in the sequence") : positions_text(run));
  benchmark::AddCustomContext("kvrope_copy_bandwidth_TBps", fmt("%.4f", run.calibration.bandwidth_bytes_per_us * 1e-6));
  benchmark::AddCustomContext("kvrope_empty_kernel_us", fmt("%.4f", run.calibration.empty_kernel_us));

  const bool forward = forward_suite(run.options.suite);
  benchmark::AddCustomContext("kvrope_suite", suite_name(run.options.suite));
  if (serve) {  // bf16 q, k, v; bf16 and fp8 caches
    register_append_benchmarks<__nv_bfloat16>(run, *g_clock, g_case);
  } else if (forward) {  // one dtype a forward suite
    if (run.options.dtype == "bf16") register_forward_benchmarks<__nv_bfloat16>(run, *g_clock, g_case);
    if (run.options.dtype == "fp16") register_forward_benchmarks<__half>(run, *g_clock, g_case);
    if (run.options.dtype == "fp32") register_forward_benchmarks<float>(run, *g_clock, g_case);
  } else {  // the backward's cases each in their own dtype, in table order
    register_backward_benchmarks(run, *g_clock, g_case, g_policy);
  }
  benchmark::RunSpecifiedBenchmarks();
  g_case.reset();
  // The serve suites' host time of one call (support/append_suites.cuh, measure_append_host): after the
  // benchmarks, on the warm device.
  if (serve) measure_append_host<__nv_bfloat16>(run, *g_clock, g_case);

  if (serve) {
    const AppendSummary summary = summarize_append(run);
    print_append_summary(run, summary);
    write_append_json(run, summary, run.options.json_path);
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
