// The serve suites (--suite=serve-decode|serve-prefill): one Google Benchmark per (case, variant) under the
// protocol of the other suites (docs/spec.md §5.3), kv_cache_rope_append checked first against the naive two
// launches (support/append_case.cuh); the MLA cases time mla_append, checked against the float64 reference
// (support/mla_case.cuh).
#pragma once

#include <algorithm>
#include <chrono>
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

#include "verify/naive/naive_append.cuh"
#include "verify/append_launchers.cuh"  // the launchers, compiled once (kvrope_launchers)

#include "calibration.cuh"  // empty_kernel
#include "cupti_clock.cuh"
#include "options.cuh"
#include "results.cuh"
#include "append_case.cuh"
#include "append_cases.hpp"
#include "mla_case.cuh"
#include "stats.hpp"
#include "runner.cuh"

namespace kvrope_bench {

// The PDL pair's producer, as the QKV projection before the append: copies the pristine q, k, v into qkv
// (bandwidth-bound, 16-byte accesses), after letting the next kernel in the stream start (a programmatic
// dependent launch of it waits for these writes before reading them).
__global__ void produce_qkv(const uint4* src, uint4* dst, int64_t n) {
  kvrope::detail::allow_dependent_grids();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
}

// "serve-decode/kvrope case 7: ": how a check's messages name the case and variant.
inline std::string check_who(const Options& opt, AppendVariant variant, const AppendCase& sc) {
  return std::string(suite_name(opt.suite)) + "/" + append_variant_name(variant) + " case " + std::to_string(sc.id) +
         ": ";
}

// A check's outcome counted in `cr` (a failure printed and kept, the first one for the summary): the variant's
// label, "checked" or "CHECK FAILED".
inline std::string record_check(AppendCaseResult& cr, const AppendCheck& c, const std::string& who) {
  ++cr.checks;
  if (c.failure.empty()) return "checked";
  std::printf("CHECK FAILED %s%s\n", who.c_str(), c.failure.c_str());
  if (cr.check_failure.empty()) cr.check_failure = who + c.failure;
  return "CHECK FAILED";
}

// What a timed call left in the case's error flag, as run_timed reports it (empty: none).
template <typename Data>
std::string error_flag_raised(Data& data, cudaStream_t stream) {
  const int flag = data.read_error_flag(stream);
  return flag != 0 ? "the call raised error_flag = " + std::to_string(flag) : std::string();
}

// The benchmark of one (case, variant) of a serve suite; `slot` holds the case alive now.
template <typename T, typename C>
void run_append_variant(benchmark::State& state, Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot,
                        const AppendCase& sc, AppendVariant variant) {
  const Options& opt = run.options;
  AppendCaseData<T, C>& data =
      acquire_case<AppendCaseData<T, C>>(slot, sc, opt, run.device.fill_blocks(), clock.stream());
  const cudaStream_t stream = clock.stream();
  const bool naive = variant == AppendVariant::kNaive;
  const bool pair = AppendCaseResult::pair(variant);
  const bool key_in_place = variant != AppendVariant::kKvrope && !pair;  // the naive rotates k in place
  // The q-fp8 cases: kvrope's variants write q in fp8 (query_out_fp8). The naive two launches cannot
  // (naive_append.cuh has no fp8 q): on these cases they run as on the fp8-cache case they copy, q rotated in
  // place in T, so their time is that work's (Hq D bytes a token more than the floor counts). The NVFP4 and
  // mRoPE cases have no naive variant (register_append_benchmarks leaves it out: it has neither).
  const bool q_fp8 = sc.query_fp8 && !naive;
  auto params = data.params(key_in_place, q_fp8);
  params.enable_pdl = variant == AppendVariant::kPairPdl;
  const int64_t qkv_vectors = static_cast<int64_t>(data.qkv.bytes() / sizeof(uint4));
  const int producer_blocks = static_cast<int>(std::min<int64_t>(4 * run.device.sm_count, (qkv_vectors + 255) / 256));

  kvrope::Status status;
  auto launch = [&](cudaStream_t st) {
    if (pair)
      produce_qkv<<<producer_blocks, 256, 0, st>>>(data.pristine.template as<uint4>(), data.qkv.template as<uint4>(),
                                                   qkv_vectors);
    if constexpr (kvrope::kIsNvfp4<C>)  // never naive (no NVFP4 in naive_append.cuh)
      status = kvrope::testing::AppendLaunchers<T, C, int64_t>::append(params, st);
    else
      status = naive ? kvrope::reference::naive_append(params, st)
                     : kvrope::testing::AppendLaunchers<T, C, int64_t>::append(params, st);
  };
  // Nothing to restore: q (and k) are rotated again each call, the same cache rows written.
  auto prepare = [](cudaStream_t) {};
  const char* launcher = naive ? "naive_append" : "kv_cache_rope_append";

  AppendCaseResult& cr = run.append_results[sc.id];
  cr.sc = sc;
  cr.bytes = append_bytes(sc, false);
  cr.bytes_kip = append_bytes(sc, true);
  cr.floor_us = run.calibration.floor_us(cr.bytes);
  cr.floor_kip_us = run.calibration.floor_us(cr.bytes_kip);
  cr.bytes_pair = cr.bytes + 2.0 * static_cast<double>(data.qkv.bytes());
  cr.floor_pair_us = run.calibration.floor_us(cr.bytes_pair);

  // Check once before timing; a failed check is reported (here, in the label and the summary) and the
  // variant still timed, so that one run gives both.
  bool checked = false;
  std::string label = naive ? "reference" : "unchecked";
  if (opt.check && !naive) {
    const AppendCheck c = data.check(launch, status, key_in_place, q_fp8, stream);
    if (!status.ok()) {
      state.SkipWithError(c.failure.c_str());
      return;
    }
    checked = true;
    const std::string who = check_who(opt, variant, sc);
    label = record_check(cr, c, who);
    if (!c.note.empty() && cr.check_note.empty()) cr.check_note = who + c.note;
  }

  VariantResult r;
  r.checked = checked;
  auto after = [&]() { return error_flag_raised(data, stream); };
  if (!run_timed(state, clock, opt.warmup, prepare, launch, status, launcher, after, r)) return;

  const double bytes = cr.bytes_of(variant), floor = cr.floor_of(variant);
  const double empty = run.calibration.empty_kernel_us;
  set_time_counters(state, r, bytes, floor, sc.decode ? empty : -1);
  // The naive reference's speedups on the row of whichever ran last.
  if (const VariantResult* n = find_variant(cr, AppendVariant::kNaive); n != nullptr && !naive)
    state.counters["speedup_vs_naive"] = n->median_us / r.median_us;
  if (naive) {
    if (const VariantResult* k = find_variant(cr, AppendVariant::kKvrope))
      state.counters["kvrope_speedup"] = r.median_us / k->median_us;
    if (const VariantResult* k = find_variant(cr, AppendVariant::kKvropeKeyInPlace))
      state.counters["kvrope_kip_speedup"] = r.median_us / k->median_us;
  }
  state.SetLabel(label);
  cr.variants[variant] = std::move(r);
}

// The benchmark of an MLA case (AppendCase::mla): mla_append, kvrope's one variant there (nothing to rotate in
// place besides q_pe, no naive launches, no PDL pair), timed as run_append_variant times the others and checked
// first against the float64 reference (MlaCaseData::check).
template <typename T, typename C>
void run_mla_variant(benchmark::State& state, Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot,
                     const AppendCase& sc, AppendVariant variant) {
  const Options& opt = run.options;
  MlaCaseData<T, C>& data = acquire_case<MlaCaseData<T, C>>(slot, sc, opt, run.device.fill_blocks(), clock.stream());
  const cudaStream_t stream = clock.stream();
  const auto params = data.params();
  kvrope::Status status;
  auto launch = [&](cudaStream_t st) { status = kvrope::mla_append(params, st); };
  auto prepare = [](cudaStream_t) {};  // q_pe rotated again each call (bf16), the same rows written

  AppendCaseResult& cr = run.append_results[sc.id];
  cr.sc = sc;
  cr.bytes = cr.bytes_kip = cr.bytes_pair = append_bytes(sc, false);
  cr.floor_us = cr.floor_kip_us = cr.floor_pair_us = run.calibration.floor_us(cr.bytes);

  bool checked = false;
  std::string label = "unchecked";
  if (opt.check) {
    const AppendCheck c = data.check(launch, status, stream);
    if (!status.ok()) {
      state.SkipWithError(c.failure.c_str());
      return;
    }
    checked = true;
    const std::string who = check_who(opt, variant, sc);
    label = record_check(cr, c, who);
  }

  VariantResult r;
  r.checked = checked;
  auto after = [&]() { return error_flag_raised(data, stream); };
  if (!run_timed(state, clock, opt.warmup, prepare, launch, status, "mla_append", after, r)) return;
  set_time_counters(state, r, cr.bytes, cr.floor_us, sc.decode ? run.calibration.empty_kernel_us : -1);
  state.SetLabel(label);
  cr.variants[variant] = std::move(r);
}

// The cases --cases selects (all by default), in their order, from the suite's table.
inline std::vector<AppendCase> select_append_cases(const Options& opt) {
  const std::vector<AppendCase> table = append_case_table(opt.suite == Suite::kServeDecode, opt.heads, opt.head_dim);
  if (opt.cases.empty()) return table;
  std::vector<AppendCase> cases;
  for (int id : opt.cases) {
    const auto it = std::find_if(table.begin(), table.end(), [&](const AppendCase& c) { return c.id == id; });
    if (it == table.end())
      bad_option("--cases=" + std::to_string(id), ("the suite has cases 1 to " + std::to_string(table.size())).c_str());
    cases.push_back(*it);
  }
  return cases;
}

// Whether a variant runs on a case: the naive two launches have no NVFP4 cache and no mRoPE positions
// (naive_append.cuh), so not on those groups' cases (the header and the summary say so); the MLA cases have
// one variant, kvrope (mla_append: no k to rotate in place, no naive launches, no PDL pair).
inline bool append_variant_applies(const AppendCase& sc, AppendVariant v) {
  if (sc.mla) return v == AppendVariant::kKvrope;
  return v != AppendVariant::kNaive || sc.group() == AppendGroup::kBase;
}

// One benchmark per (case, variant), named suite/variant/case:NN.
template <typename T>
void register_append_benchmarks(Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot) {
  for (const AppendCase& sc : run.append_cases) {
    for (AppendVariant v : append_variant_order(run.options)) {
      if (!append_selected(run.options, v) || !append_variant_applies(sc, v)) continue;
      register_variant(suite_name(run.options.suite), append_variant_name(v), sc.id, run.options.iters,
                       [&run, &clock, &slot, sc, v](benchmark::State& st) {
                         if (sc.mla && sc.cache == AppendCache::kBf16)
                           run_mla_variant<T, T>(st, run, clock, slot, sc, v);
                         else if (sc.mla)
                           run_mla_variant<T, __nv_fp8_e4m3>(st, run, clock, slot, sc, v);
                         else if (sc.cache == AppendCache::kBf16)
                           run_append_variant<T, T>(st, run, clock, slot, sc, v);
                         else if (sc.cache == AppendCache::kFp8E4m3)
                           run_append_variant<T, __nv_fp8_e4m3>(st, run, clock, slot, sc, v);
                         else
                           run_append_variant<T, kvrope::nvfp4_e2m1x2>(st, run, clock, slot, sc, v);
                       });
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The host time of one C++ call (--host_calls=N; the summary's "serve-host" line and the JSON's
// "host_time"). What a serving engine pays on the CPU a step, apart from the GPU time the suites report:
// the CPU time (std::chrono::steady_clock) for kv_cache_rope_append to return (validate, plan, launch; it does
// not wait for the kernel), on a warm device, not in a graph, beside the same measure of launching an empty
// kernel <<<1, 32, 0, stream>>>: their ratio is kvrope's host cost in launches. The suite's first case (decode:
// T=1, Hq 32, bf16 NHD; prefill: 8x512, Hq 32, bf16 NHD), k read only (the kvrope variant), through the
// kvrope_launchers forwarder the suites time (AppendLaunchers::append: `return kv_cache_rope_append(p,
// stream);`, compiled once; one out-of-line call more). CUPTI tracing is off meanwhile (it slows every launch).
// The two alternate in rounds of kAppendHostSyncEvery calls, the stream synchronized between rounds, outside
// the timed region, so that the launch queue never fills (a full queue would make a launch wait for the GPU)
// and both see the same conditions.
// ---------------------------------------------------------------------------------------------------

constexpr int64_t kAppendHostSyncEvery = 100;
constexpr int64_t kAppendHostWarmup = 200;  // untimed calls of each first

// `calls` calls of call() in rounds of kAppendHostSyncEvery, each timed alone (us) into `us`; the stream
// synchronized (untimed) before each round.
template <typename Call>
void time_host_round(Call&& call, int64_t calls, cudaStream_t stream, std::vector<double>& us) {
  KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
  for (int64_t i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
}

template <typename T>
void measure_append_host(Run& run, GpuClock& clock, std::unique_ptr<CaseDataBase>& slot) {
  const Options& opt = run.options;
  AppendHostTime& h = run.append_host;
  if (opt.host_calls <= 0) return;
  const std::vector<AppendCase> table = append_case_table(opt.suite == Suite::kServeDecode, opt.heads, opt.head_dim);
  h.sc = table.front();  // case 1: bf16 caches, NHD, Hq 32, the suite's first shape
  h.calls = opt.host_calls;
  h.sync_every = kAppendHostSyncEvery;
  const cudaStream_t stream = clock.stream();
  AppendCaseData<T, T>& data = acquire_case<AppendCaseData<T, T>>(slot, h.sc, opt, run.device.fill_blocks(), stream);
  const auto params = data.params(false);

  bool failed = false;
  kvrope::Status status;
  auto call = [&] {
    status = kvrope::testing::AppendLaunchers<T, T, int64_t>::append(params, stream);
    failed = failed || !status.ok();
  };
  auto empty = [&] { empty_kernel<<<1, 32, 0, stream>>>(); };

  cupti::set_tracing(false);
  std::vector<double> call_us, empty_us, ignored;
  for (int64_t done = 0; done < kAppendHostWarmup; done += kAppendHostSyncEvery) {
    time_host_round(call, kAppendHostSyncEvery, stream, ignored);
    time_host_round(empty, kAppendHostSyncEvery, stream, ignored);
  }
  for (int64_t done = 0; done < h.calls && !failed; done += kAppendHostSyncEvery) {
    const int64_t n = std::min(kAppendHostSyncEvery, h.calls - done);
    time_host_round(call, n, stream, call_us);
    time_host_round(empty, n, stream, empty_us);
  }
  KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
  KVROPE_BENCH_CUDA(cudaGetLastError());  // the empty launches' (checked here, outside the timed region)
  cupti::set_tracing(true);
  const int flag = data.read_error_flag(stream);
  slot.reset();
  if (failed) {
    h.error = status_message("kv_cache_rope_append", status);
    return;
  }
  if (flag != 0) {
    h.error = "kv_cache_rope_append raised error_flag = " + std::to_string(flag);
    return;
  }
  h.measured = true;
  h.call_median_us = median_of(call_us);
  h.call_p10_us = percentile_of(call_us, 0.1);
  h.call_p90_us = percentile_of(call_us, 0.9);
  h.empty_median_us = median_of(empty_us);
  h.empty_p10_us = percentile_of(empty_us, 0.1);
  h.empty_p90_us = percentile_of(empty_us, 0.9);
}

}  // namespace kvrope_bench
