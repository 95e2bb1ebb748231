// What a run measured, filled by the benchmarks and read by the summary and the JSON report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "calibration.cuh"
#include "cases.hpp"
#include "device.cuh"
#include "options.cuh"
#include "append_cases.hpp"

namespace kvrope_bench {

struct VariantResult {
  double median_us = 0, min_us = 0, mean_us = 0, p90_us = 0, max_us = 0;
  double event_median_us = 0;         // CUDA events, tracing off (a separate run of as many calls)
  double event_traced_median_us = 0;  // CUDA events around the CUPTI-timed calls themselves
  double activities = 0;              // GPU activities per call (median)
  bool checked = false;
  std::vector<double> cupti_us, event_us, event_traced_us;
};

struct CaseResult {
  LeaderboardCase lc{};
  Traffic bytes;
  double floor_us = 0, inplace_floor_us = 0;
  std::map<Variant, VariantResult> variants;
};

inline const VariantResult* find_variant(const CaseResult& cr, Variant v) {
  const auto it = cr.variants.find(v);
  return it == cr.variants.end() ? nullptr : &it->second;
}

// One variant of a forward suite: its times, the rotary convention it ran with, its bytes and floor.
struct FwdResult {
  VariantResult r;
  const char* style = "";  // "rotate_half" or "interleaved"
  int64_t rotary_dim = 0;  // R
  double bytes = 0, floor_us = 0;
};

struct ForwardCaseResult {
  LeaderboardCase lc{};
  std::map<FwdVariant, FwdResult> variants;
};

inline const FwdResult* find_variant(const ForwardCaseResult& cr, FwdVariant v) {
  const auto it = cr.variants.find(v);
  return it == cr.variants.end() ? nullptr : &it->second;
}

// One case of a serve suite: its bytes and floors (k read only; k written back: kvrope_kip and the naive
// reference), the check's outcome, and each variant's times.
struct AppendCaseResult {
  AppendCase sc{};
  double bytes = 0, bytes_kip = 0, floor_us = 0, floor_kip_us = 0;
  double bytes_pair = 0, floor_pair_us = 0;  // the PDL pair's: qkv read and written by its producer besides
  int checks = 0;                            // kvrope variants checked against the naive reference
  std::string check_failure, check_note;     // the first failure; what was allowed but not bit-exact
  std::map<AppendVariant, VariantResult> variants;

  // The floor a variant is judged by: the naive reference rotates k in place, as kvrope_kip does.
  double floor_of(AppendVariant v) const {
    return v == AppendVariant::kKvrope ? floor_us : pair(v) ? floor_pair_us : floor_kip_us;
  }
  double bytes_of(AppendVariant v) const {
    return v == AppendVariant::kKvrope ? bytes : pair(v) ? bytes_pair : bytes_kip;
  }
  static bool pair(AppendVariant v) { return v == AppendVariant::kPair || v == AppendVariant::kPairPdl; }
};

inline const VariantResult* find_variant(const AppendCaseResult& cr, AppendVariant v) {
  const auto it = cr.variants.find(v);
  return it == cr.variants.end() ? nullptr : &it->second;
}

// The host time of one C++ call (the serve suites' "serve-host" line, --host_calls): the CPU time
// (std::chrono::steady_clock) kv_cache_rope_append takes to return (validate, plan, launch; no wait), on one
// case of the suite, beside that of launching an empty kernel <<<1, 32, 0, stream>>> the same way.
struct AppendHostTime {
  bool measured = false;
  AppendCase sc{};
  int64_t calls = 0, sync_every = 0;  // calls of each, the stream synchronized (untimed) every sync_every
  double call_median_us = 0, call_p10_us = 0, call_p90_us = 0;
  double empty_median_us = 0, empty_p10_us = 0, empty_p90_us = 0;
  std::string error;  // why it was not measured (a call failed)
  double ratio() const { return call_median_us / empty_median_us; }
};

struct Run {
  Options options;
  DeviceInfo device;
  Calibration calibration;
  size_t flush_bytes = 0;
  std::vector<LeaderboardCase> table;                // every row of the case table
  std::vector<LeaderboardCase> cases;                // the rows --cases selected, --heads and --head_dim applied
  std::map<int, CaseResult> results;                 // --suite=leaderboard
  std::map<int, ForwardCaseResult> forward_results;  // the forward suites
  std::vector<AppendCase> append_cases;              // the serve suites: the cases --cases selected
  std::map<int, AppendCaseResult> append_results;
  AppendHostTime append_host;  // the serve suites, unless --host_calls=0
};

// The cases' common value of a field, or 0 when they differ.
inline int64_t common_value(const std::vector<LeaderboardCase>& cases, CaseField field) {
  int64_t v = cases.empty() ? 0 : cases.front().*field;
  for (const LeaderboardCase& lc : cases)
    if (lc.*field != v) v = 0;
  return v;
}

// "H 8, D 128", or "H x, D y" with "per case" where the selected cases differ.
inline std::string dims_text(const std::vector<LeaderboardCase>& cases) {
  auto one = [&](CaseField field) {
    const int64_t v = common_value(cases, field);
    return v > 0 ? std::to_string(v) : std::string("per case");
  };
  return "H " + one(&LeaderboardCase::heads) + ", D " + one(&LeaderboardCase::head_dim);
}

// The cases' common dtype or positions, or "per case".
inline std::string common_text(const std::vector<LeaderboardCase>& cases, const Options& o,
                               const std::string& (*of)(const LeaderboardCase&, const Options&)) {
  if (cases.empty()) return of(LeaderboardCase{}, o);
  for (const LeaderboardCase& lc : cases)
    if (of(lc, o) != of(cases.front(), o)) return "per case";
  return of(cases.front(), o);
}
inline std::string dtype_text(const Run& run) { return common_text(run.cases, run.options, &dtype_of); }
inline std::string positions_text(const Run& run) { return common_text(run.cases, run.options, &positions_of); }

}  // namespace kvrope_bench
