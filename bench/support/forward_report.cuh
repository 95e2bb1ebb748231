// The report of a forward suite (--suite=forward|decode|styles): a per-case table, the geometric and
// arithmetic means, the suite's own lines (docs/benchmarks.md, "Flags"), and the --kvrope_json file.
#pragma once

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "forward_case.cuh"
#include "json.cuh"
#include "options.cuh"
#include "results.cuh"
#include "stats.hpp"
#include "backward_report.cuh"

namespace kvrope_bench {

// The largest and the smallest of per-case ratios, with their cases.
struct Extremes {
  double max = std::nan(""), min = std::nan("");
  int max_case = 0, min_case = 0;
  void add(double x, int id) {
    if (!std::isfinite(x)) return;
    if (!(x <= max)) {  // also the first (max is NaN)
      max = x;
      max_case = id;
    }
    if (!(x >= min)) {
      min = x;
      min_case = id;
    }
  }
};

struct ForwardSummary {
  int cases = 0;
  std::map<FwdVariant, Means> time, event, x_floor, x_floor_empty;
  Means floor, floor_r64;  // the floor of R = D, and of R = D / 2 (half_r64)
  Means naive_x_fwd, interleaved_x_half, r64_x_half;
  int compared = 0;                                // cases with both fwd and fwd_naive
  std::vector<std::pair<int, double>> not_faster;  // (case, fwd / fwd_naive) where fwd is not faster
  Extremes decode_fwd, interleaved, r64;           // fwd / (floor + empty); interleaved / half; half_r64 / half
};

inline ForwardSummary summarize_forward(const Run& run) {
  ForwardSummary s;
  const double empty = run.calibration.empty_kernel_us;
  for (const auto& [id, cr] : run.forward_results) {
    ++s.cases;
    bool full_floor = false;
    for (const auto& [v, fr] : cr.variants) {
      s.time[v].add(fr.r.median_us);
      s.event[v].add(fr.r.event_median_us);
      s.x_floor[v].add(fr.r.median_us / fr.floor_us);
      s.x_floor_empty[v].add(fr.r.median_us / (fr.floor_us + empty));
      if (v == FwdVariant::kHalfR64) s.floor_r64.add(fr.floor_us);
      if (v != FwdVariant::kHalfR64 && !full_floor) {  // every variant with R = D has the same floor
        s.floor.add(fr.floor_us);
        full_floor = true;
      }
    }
    const FwdResult* f = find_variant(cr, FwdVariant::kFwd);
    const FwdResult* n = find_variant(cr, FwdVariant::kFwdNaive);
    const FwdResult* h = find_variant(cr, FwdVariant::kHalf);
    const FwdResult* i = find_variant(cr, FwdVariant::kInterleaved);
    const FwdResult* r = find_variant(cr, FwdVariant::kHalfR64);
    if (f && n) {
      ++s.compared;
      s.naive_x_fwd.add(n->r.median_us / f->r.median_us);
      if (!(f->r.median_us < n->r.median_us)) s.not_faster.emplace_back(id, f->r.median_us / n->r.median_us);
    }
    if (f) s.decode_fwd.add(f->r.median_us / (f->floor_us + empty), id);
    if (h && i) {
      s.interleaved_x_half.add(i->r.median_us / h->r.median_us);
      s.interleaved.add(i->r.median_us / h->r.median_us, id);
    }
    if (h && r) {
      s.r64_x_half.add(r->r.median_us / h->r.median_us);
      s.r64.add(r->r.median_us / h->r.median_us, id);
    }
  }
  return s;
}

inline void print_forward_summary(const Run& run, const ForwardSummary& s) {
  const Options& o = run.options;
  const bool styles = o.suite == Suite::kStyles, decode = o.suite == Suite::kDecode;
  const double nan = std::nan(""), empty = run.calibration.empty_kernel_us;
  std::printf(
      "\nkvrope_bench summary (--suite=%s): %s, dtype %s, %s, positions %s; in place into the caches, k_out on, "
      "no q; times are CUPTI medians in us\n",
      suite_name(o.suite), run.device.name.c_str(), dtype_text(run).c_str(), dims_text(run.cases).c_str(),
      positions_text(run).c_str());
  auto us_of = [&](const ForwardCaseResult& cr, FwdVariant v, bool event = false) {
    const FwdResult* r = find_variant(cr, v);
    return r == nullptr ? nan : event ? r->r.event_median_us : r->r.median_us;
  };
  auto floor_of = [&](const ForwardCaseResult& cr, FwdVariant v) {
    const FwdResult* r = find_variant(cr, v);
    return r == nullptr ? nan : r->floor_us;
  };
  if (styles) {
    std::printf("%4s %3s %5s %5s | %9s %9s %9s | %8s %8s | %7s %7s %7s | %7s %7s | %9s %9s %9s\n", "case", "B", "S",
                "S_max", "half", "interl", "half_r64", "floor", "r64_fl", "h/floor", "i/floor", "r/r64fl", "i/half",
                "r/half", "half_ev", "interl_ev", "r64_ev");
  } else {
    std::printf("%4s %3s %5s %5s | %9s %9s | %8s | %7s %7s %7s%s | %9s %9s\n", "case", "B", "S", "S_max", "fwd",
                "fwd_naive", "floor", "f/floor", "n/floor", "n/fwd", decode ? " f/(fl+em)" : "", "fwd_ev", "naive_ev");
  }
  for (const auto& [id, cr] : run.forward_results) {
    std::printf("%4d %3lld %5lld %5lld | ", id, static_cast<long long>(cr.lc.batch),
                static_cast<long long>(cr.lc.seq_len), static_cast<long long>(cr.lc.cache_len));
    if (styles) {
      const double h = us_of(cr, FwdVariant::kHalf), i = us_of(cr, FwdVariant::kInterleaved);
      const double r = us_of(cr, FwdVariant::kHalfR64);
      const double fl = floor_of(cr, FwdVariant::kHalf), rfl = floor_of(cr, FwdVariant::kHalfR64);
      const double ifl = floor_of(cr, FwdVariant::kInterleaved);
      std::printf("%9s %9s %9s | %8s %8s | %7s %7s %7s | %7s %7s | %9s %9s %9s\n", fmt("%.2f", h).c_str(),
                  fmt("%.2f", i).c_str(), fmt("%.2f", r).c_str(), fmt("%.2f", std::isfinite(fl) ? fl : ifl).c_str(),
                  fmt("%.2f", rfl).c_str(), fmt("%.3f", h / fl).c_str(), fmt("%.3f", i / ifl).c_str(),
                  fmt("%.3f", r / rfl).c_str(), fmt("%.3f", i / h).c_str(), fmt("%.3f", r / h).c_str(),
                  fmt("%.2f", us_of(cr, FwdVariant::kHalf, true)).c_str(),
                  fmt("%.2f", us_of(cr, FwdVariant::kInterleaved, true)).c_str(),
                  fmt("%.2f", us_of(cr, FwdVariant::kHalfR64, true)).c_str());
    } else {
      const double f = us_of(cr, FwdVariant::kFwd), n = us_of(cr, FwdVariant::kFwdNaive);
      const double ffl = floor_of(cr, FwdVariant::kFwd), nfl = floor_of(cr, FwdVariant::kFwdNaive);
      const double fl = std::isfinite(ffl) ? ffl : nfl;
      std::printf("%9s %9s | %8s | %7s %7s %7s%s | %9s %9s\n", fmt("%.2f", f).c_str(), fmt("%.2f", n).c_str(),
                  fmt("%.2f", fl).c_str(), fmt("%.3f", f / fl).c_str(), fmt("%.3f", n / fl).c_str(),
                  fmt("%.1f", n / f).c_str(), decode ? (" " + fmt("%9.3f", f / (fl + empty))).c_str() : "",
                  fmt("%.2f", us_of(cr, FwdVariant::kFwd, true)).c_str(),
                  fmt("%.2f", us_of(cr, FwdVariant::kFwdNaive, true)).c_str());
    }
  }
  if (s.cases == 0) {
    std::printf("no case ran\n");
    return;
  }
  // A mean over fewer cases than ran (a variant skipped or failed somewhere) says so.
  auto line = [&](const std::string& label, const Means& m, bool geometric, const char* f) {
    if (m.n == 0) return;
    std::printf("%s = %s", label.c_str(), fmt(f, geometric ? m.geometric() : m.arithmetic()).c_str());
    if (m.n != s.cases) std::printf("   (over %d of %d cases)", m.n, s.cases);
    std::printf("\n");
  };
  const std::vector<FwdVariant> order = fwd_variant_order(o);
  auto means = [&](bool geo) {
    const char* kind = geo ? "geomean" : "mean";
    for (FwdVariant v : order)
      if (s.time.count(v)) line(std::string(fwd_variant_name(v)) + " " + kind + " us", s.time.at(v), geo, "%.2f");
    line(std::string(styles ? "half" : "fwd") + " floor " + kind + " us", s.floor, geo, "%.2f");
    if (styles) line(std::string("half_r64 floor ") + kind + " us", s.floor_r64, geo, "%.2f");
    for (FwdVariant v : order)
      if (s.event.count(v))
        line(std::string(fwd_variant_name(v)) + " event " + kind + " us", s.event.at(v), geo, "%.2f");
  };
  std::printf("\ngeometric means over the %d case(s) that ran (CUPTI medians, us):\n", s.cases);
  means(true);
  for (FwdVariant v : order)
    if (s.x_floor.count(v)) line(std::string(fwd_variant_name(v)) + "/floor geomean", s.x_floor.at(v), true, "%.3f");
  if (styles) {
    line("interleaved/half geomean", s.interleaved_x_half, true, "%.3f");
    line("half_r64/half geomean", s.r64_x_half, true, "%.3f");
    for (const auto& [label, e] : {std::pair{"interleaved/half", &s.interleaved}, std::pair{"half_r64/half", &s.r64}})
      if (std::isfinite(e->max))
        std::printf("%s per case: min %.3f (case %d), max %.3f (case %d)\n", label, e->min, e->min_case, e->max,
                    e->max_case);
  } else {
    line("fwd_naive/fwd geomean speedup", s.naive_x_fwd, true, "%.1f");
    if (s.compared > 0 && s.not_faster.empty()) {
      std::printf("fwd faster than fwd_naive on every case");
      if (s.compared != s.cases) std::printf("   (over %d of %d cases)", s.compared, s.cases);
      std::printf("\n");
    } else if (s.compared > 0) {
      std::printf("fwd not faster than fwd_naive on %zu case(s):", s.not_faster.size());
      for (size_t k = 0; k < s.not_faster.size(); ++k)
        std::printf("%s case %d (fwd/fwd_naive %.3f)", k ? "," : "", s.not_faster[k].first, s.not_faster[k].second);
      std::printf("\n");
    }
  }
  if (decode) {
    std::printf("\ntime / (floor + one empty kernel, %.2f us), per case:\n", empty);
    for (const auto& [id, cr] : run.forward_results) {
      std::printf("case %d (B %lld):", id, static_cast<long long>(cr.lc.batch));
      for (FwdVariant v : order)
        if (const FwdResult* r = find_variant(cr, v))
          std::printf(" %s %.2f us = %.3f x (floor + empty);", fwd_variant_name(v), r->r.median_us,
                      r->r.median_us / (r->floor_us + empty));
      std::printf(" floor %.2f us\n", cr.variants.begin()->second.floor_us);
    }
    for (FwdVariant v : order)
      if (s.x_floor_empty.count(v))
        line(std::string(fwd_variant_name(v)) + "/(floor+empty) geomean", s.x_floor_empty.at(v), true, "%.3f");
    if (std::isfinite(s.decode_fwd.max))
      std::printf("decode worst time/(floor+empty) = %.3f (case %d, B %lld)\n", s.decode_fwd.max, s.decode_fwd.max_case,
                  static_cast<long long>(run.forward_results.at(s.decode_fwd.max_case).lc.batch));
  }
  std::printf("\narithmetic means over the %d case(s) that ran (CUPTI medians, us):\n", s.cases);
  means(false);
}

// The --kvrope_json file of a forward suite: device, config (with "suite"), calibration, cases[] with every
// per-call time, geomean, arithmetic_mean, and the suite's own figures.
inline void write_forward_json(const Run& run, const ForwardSummary& s, const std::string& path) {
  const Options& o = run.options;
  const bool styles = o.suite == Suite::kStyles, decode = o.suite == Suite::kDecode;
  const double empty = run.calibration.empty_kernel_us;
  const std::vector<FwdVariant> order = fwd_variant_order(o);
  std::string variants;
  for (FwdVariant v : order)  // in the order they ran within a case
    if (fwd_selected(o, v)) variants += std::string(variants.empty() ? "" : ", ") + "\"" + fwd_variant_name(v) + "\"";
  std::string j = "{\n" + device_json(run.device);
  j += config_json_start(run, variants) + ", \"in_place\": true, \"key_out\": true, \"query_heads\": 0, \"tables\": " +
       json_string("per-token cos and sin [B, S, R], batch stride S*R") +
       ", \"cases_csv\": " + json_string(o.cases_csv) + "},\n";
  j += calibration_json(run.calibration);
  j += "  \"cases\": [";
  bool first_case = true;
  for (const auto& [id, cr] : run.forward_results) {
    j += first_case ? "\n" : ",\n";
    first_case = false;
    j += case_json_start(id, cr.lc) + ",\n     \"variants\": {";
    bool first_variant = true;
    for (const auto& [v, fr] : cr.variants) {
      j += first_variant ? "\n" : ",\n";
      first_variant = false;
      j += std::string("       \"") + fwd_variant_name(v) + "\": {\"style\": " + json_string(fr.style) +
           ", \"rotary_dim\": " + std::to_string(fr.rotary_dim) + ", " +
           variant_stats_json(fr.r, fr.bytes, fr.floor_us);
      if (decode) j += ", \"x_floor_plus_empty\": " + json_number(fr.r.median_us / (fr.floor_us + empty));
      const FwdResult* n = find_variant(cr, FwdVariant::kFwdNaive);
      if (v == FwdVariant::kFwd && n) j += ", \"speedup_vs_naive\": " + json_number(n->r.median_us / fr.r.median_us);
      const FwdResult* h = find_variant(cr, FwdVariant::kHalf);
      if (v != FwdVariant::kHalf && h) j += ", \"x_half\": " + json_number(fr.r.median_us / h->r.median_us);
      j += variant_times_json(fr.r);
    }
    j += "}}";
  }
  j += "\n  ],\n";
  auto means = [&](bool geo) {
    auto num = [&](const Means& m) { return json_number(geo ? m.geometric() : m.arithmetic()); };
    std::string m = "{\"cases\": " + std::to_string(s.cases);
    for (FwdVariant v : order) {
      const std::string name = fwd_variant_name(v);
      if (s.time.count(v)) m += ", \"" + name + "_us\": " + num(s.time.at(v));
      if (s.event.count(v)) m += ", \"" + name + "_event_us\": " + num(s.event.at(v));
    }
    m += ", \"floor_us\": " + num(s.floor);
    if (styles) m += ", \"half_r64_floor_us\": " + num(s.floor_r64);
    if (geo) {
      for (FwdVariant v : order)
        if (s.x_floor.count(v))
          m += ", \"" + std::string(fwd_variant_name(v)) + "_over_floor\": " + num(s.x_floor.at(v));
      for (FwdVariant v : order)
        if (decode && s.x_floor_empty.count(v))
          m += ", \"" + std::string(fwd_variant_name(v)) + "_over_floor_plus_empty\": " + num(s.x_floor_empty.at(v));
      if (styles)
        m += ", \"interleaved_over_half\": " + num(s.interleaved_x_half) +
             ", \"half_r64_over_half\": " + num(s.r64_x_half);
      else
        m += ", \"fwd_naive_over_fwd\": " + num(s.naive_x_fwd);
    }
    return m + "}";
  };
  j += "  \"geomean\": " + means(true) + ",\n";
  j += "  \"arithmetic_mean\": " + means(false);
  auto extremes = [](const Extremes& e) {
    return "{\"max\": " + json_number(e.max) + ", \"max_case\": " + std::to_string(e.max_case) +
           ", \"min\": " + json_number(e.min) + ", \"min_case\": " + std::to_string(e.min_case) + "}";
  };
  if (styles) {
    j += ",\n  \"interleaved_over_half_per_case\": " + extremes(s.interleaved) +
         ",\n  \"half_r64_over_half_per_case\": " + extremes(s.r64);
  } else {
    std::string cases;
    for (const auto& nf : s.not_faster) cases += (cases.empty() ? "" : ", ") + std::to_string(nf.first);
    j += ",\n  \"fwd_not_faster_than_naive\": {\"compared\": " + std::to_string(s.compared) + ", \"cases\": [" + cases +
         "]}";
  }
  if (decode) j += ",\n  \"decode_worst_fwd_over_floor_plus_empty\": " + extremes(s.decode_fwd);
  j += "\n}\n";
  write_text_file(path, j);
}

}  // namespace kvrope_bench
