// The report of a serve suite (--suite=serve-decode|serve-prefill): a per-case table, the geometric and
// arithmetic means in the other suites' line format (dev/scripts/ab_suites.sh reads "NAME geomean us = X"),
// the suite's own lines, and the --kvrope_json file. The means cover the cases of AppendGroup::kBase only (bf16
// and fp8 caches, the q-fp8 cases: the set they have always covered); the NVFP4, mRoPE and MLA cases get lines of
// their own after them ("nvfp4: ...", "bf16+mrope: ...", "mrope/ordinary geomean = X", "mla: ..."), and the
// JSON's "groups".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "json.cuh"
#include "options.cuh"
#include "results.cuh"
#include "append_cases.hpp"
#include "stats.hpp"
#include "backward_report.cuh"

namespace kvrope_bench {

// Cases of at least this many bytes (64 * 10^6) are bandwidth-bound; the prefill suite reports their own
// geomean of time / floor.
constexpr double kAppendLargeBytes = 64e6;

struct AppendSummary {
  int cases = 0, checked_cases = 0;
  std::map<AppendVariant, Means> time, event, x_floor, x_floor_empty, x_floor_large;
  Means floor, floor_kip, naive_x_kvrope, naive_x_kip;
  int large_cases = 0;
  std::vector<std::string> failures;
  // kvrope / floor by (Hq, cache, layout): which configuration lags.
  std::map<std::string, Means> kvrope_x_floor_by_config;
  // The PDL pair at T <= 32 (decode): its span without and with enable_pdl, what the option saves.
  Means pair, pair_pdl;
  double pdl_saving_sum = 0, pdl_saving_least = 0;
  int pdl_cases = 0;
};

inline const char* append_group_name(AppendGroup g) {
  return g == AppendGroup::kBase    ? "base"
         : g == AppendGroup::kNvfp4 ? "nvfp4"
         : g == AppendGroup::kMrope ? "bf16+mrope"
                                    : "mla";
}

inline std::string append_config_name(const AppendCase& c) {
  return "Hq " + std::to_string(c.query_heads) + " " + c.cache_label() + " " + append_layout_name(c.layout);
}

// Whether any case that ran writes q in fp8 (the q-fp8 cases, cache "fp8_e4m3+q8"; the MLA ones have their note).
inline bool append_any_query_fp8(const Run& run) {
  for (const auto& [id, cr] : run.append_results)
    if (!cr.variants.empty() && cr.sc.query_fp8 && !cr.sc.mla) return true;
  return false;
}

// The host-time line (measure_append_host, --host_calls): "serve-host: kvrope call median us = X  empty launch
// median us = Y  ratio = Z", then what was measured.
inline void print_append_host(const Run& run) {
  const AppendHostTime& h = run.append_host;
  if (run.options.host_calls <= 0) return;
  if (!h.measured) {
    std::printf("serve-host: not measured: %s\n", h.error.c_str());
    return;
  }
  std::printf(
      "serve-host: kvrope call median us = %.3f  empty launch median us = %.3f  ratio = %.2f   (CPU time to "
      "return, steady_clock; case %d: %s Hq %lld %s %s, k read only; %lld calls of each, stream synchronized every "
      "%lld, untimed; warm, no graph, CUPTI tracing off; p10-p90 us: call %.3f-%.3f, empty %.3f-%.3f)\n",
      h.call_median_us, h.empty_median_us, h.ratio(), h.sc.id, h.sc.shape().c_str(),
      static_cast<long long>(h.sc.query_heads), h.sc.cache_label(), append_layout_name(h.sc.layout),
      static_cast<long long>(h.calls), static_cast<long long>(h.sync_every), h.call_p10_us, h.call_p90_us,
      h.empty_p10_us, h.empty_p90_us);
}

// The JSON's "host_time" member, with its trailing ",\n".
inline std::string append_host_json(const Run& run) {
  const AppendHostTime& h = run.append_host;
  if (run.options.host_calls <= 0) return "";
  std::string j =
      "  \"host_time\": {\"what\": \"CPU time (std::chrono::steady_clock) for one call to return, median; "
      "warm device, no graph, CUPTI tracing off\", \"measured\": " +
      json_bool(h.measured);
  if (!h.measured) return j + ", \"error\": " + json_string(h.error) + "},\n";
  return j + ", \"case\": " + std::to_string(h.sc.id) + ", \"shape\": " + json_string(h.sc.shape()) +
         ", \"tokens\": " + std::to_string(h.sc.tokens()) + ", \"query_heads\": " + std::to_string(h.sc.query_heads) +
         ", \"cache\": " + json_string(h.sc.cache_label()) +
         ", \"layout\": " + json_string(append_layout_name(h.sc.layout)) +
         ", \"variant\": \"kvrope\", \"calls\": " + std::to_string(h.calls) +
         ", \"sync_every\": " + std::to_string(h.sync_every) +
         ", \"kvrope_call_median_us\": " + json_number(h.call_median_us) +
         ", \"kvrope_call_p10_us\": " + json_number(h.call_p10_us) +
         ", \"kvrope_call_p90_us\": " + json_number(h.call_p90_us) +
         ", \"empty_launch_median_us\": " + json_number(h.empty_median_us) +
         ", \"empty_launch_p10_us\": " + json_number(h.empty_p10_us) +
         ", \"empty_launch_p90_us\": " + json_number(h.empty_p90_us) + ", \"ratio\": " + json_number(h.ratio()) +
         "},\n";
}

// Whether any case of group g ran.
inline bool append_group_ran(const Run& run, AppendGroup g) {
  for (const auto& [id, cr] : run.append_results)
    if (!cr.variants.empty() && cr.sc.group() == g) return true;
  return false;
}

// The summary of the cases of one group that ran (the base group's: the lines the suites have always printed).
inline AppendSummary summarize_append(const Run& run, AppendGroup group = AppendGroup::kBase) {
  AppendSummary s;
  const double empty = run.calibration.empty_kernel_us;
  for (const auto& [id, cr] : run.append_results) {
    (void)id;
    if (cr.variants.empty() || cr.sc.group() != group) continue;
    ++s.cases;
    s.floor.add(cr.floor_us);
    s.floor_kip.add(cr.floor_kip_us);
    const bool large = cr.bytes >= kAppendLargeBytes;
    if (large) ++s.large_cases;
    if (cr.checks > 0) ++s.checked_cases;
    if (!cr.check_failure.empty()) s.failures.push_back(cr.check_failure);
    for (const auto& [v, r] : cr.variants) {
      const double fl = cr.floor_of(v);
      s.time[v].add(r.median_us);
      s.event[v].add(r.event_median_us);
      s.x_floor[v].add(r.median_us / fl);
      s.x_floor_empty[v].add(r.median_us / (fl + empty));
      if (large) s.x_floor_large[v].add(r.median_us / fl);
    }
    const VariantResult* k = find_variant(cr, AppendVariant::kKvrope);
    const VariantResult* kip = find_variant(cr, AppendVariant::kKvropeKeyInPlace);
    const VariantResult* n = find_variant(cr, AppendVariant::kNaive);
    if (k && n) s.naive_x_kvrope.add(n->median_us / k->median_us);
    if (kip && n) s.naive_x_kip.add(n->median_us / kip->median_us);
    if (k) s.kvrope_x_floor_by_config[append_config_name(cr.sc)].add(k->median_us / cr.floor_us);
    const VariantResult* pair = find_variant(cr, AppendVariant::kPair);
    const VariantResult* pdl = find_variant(cr, AppendVariant::kPairPdl);
    if (pair && pdl && cr.sc.tokens() <= 32) {
      const double saving = pair->median_us - pdl->median_us;
      s.pair.add(pair->median_us);
      s.pair_pdl.add(pdl->median_us);
      s.pdl_saving_sum += saving;
      s.pdl_saving_least = s.pdl_cases == 0 ? saving : std::min(s.pdl_saving_least, saving);
      ++s.pdl_cases;
    }
  }
  return s;
}

// The groups after the base group, in the order of their lines.
constexpr AppendGroup kAppendLaterGroups[] = {AppendGroup::kNvfp4, AppendGroup::kMrope, AppendGroup::kMla};

// The NVFP4, mRoPE and MLA groups' notes under the summary's title, when they ran.
inline void print_append_group_notes(const Run& run) {
  if (append_group_ran(run, AppendGroup::kNvfp4))
    std::printf(
        "nvfp4 cases (cache nvfp4): NVFP4 caches (e2m1 codes, D / 2 bytes a row, and e4m3 block scales, D / 16 "
        "bytes, a block of 16 along D; global scales k %g, v %g); floors count D / 2 + D / 16 bytes a cache row; "
        "no naive variant (it has no NVFP4 cache); checked against the float64 reference; summarized apart, "
        "after the means of the other cases\n",
        static_cast<double>(kAppendKeyScale), static_cast<double>(kAppendValueScale));
  if (append_group_ran(run, AppendGroup::kMrope))
    std::printf(
        "mRoPE cases (cache bf16+mrope): the bf16-cache cases with positions [3, T] (temporal p, height p / 2, "
        "width max_position - 1 - p, p the twin's position), contiguous sections {R/8, 3R/16, 3R/16} ({16, 24, 24} "
        "at R = 128, Qwen2-VL's); floors count the three positions; no naive variant (it has no mRoPE); checked "
        "against the float64 reference; summarized apart, after the means of the other cases, beside their "
        "twins\n");
  if (append_group_ran(run, AppendGroup::kMla))
    std::printf(
        "mla cases (cache mla_bf16, mla_fp8+q8; layout L+R): mla_append, L %lld, R %lld (interleaved), Hq 16 and 128, "
        "one cache [pages, P, L + R] (vLLM's); mla_bf16: q [T, Hq, %lld + R], q_pe rotated in place; mla_fp8+q8: q "
        "[T, Hq, %lld + R] written whole to fp8 (scale %g), the cache in fp8 (scale %g); floors count q_pe (and "
        "q_nope and the fp8 q) a head, kv_c, k_pe, the latent row, a table row, the position and the slot; kvrope "
        "only (no kip, naive or pair); checked against the float64 reference; summarized apart\n",
        static_cast<long long>(kMlaLatentDim), static_cast<long long>(kMlaRotaryDim),
        static_cast<long long>(kMlaNopeDim), static_cast<long long>(kMlaNopeDimFp8),
        static_cast<double>(kAppendQueryScale), static_cast<double>(kMlaKvScale));
}

// Each mRoPE case's time over its twin's (the same case with positions [T]), variant v, where both ran.
inline Means append_mrope_over_ordinary(const Run& run, AppendVariant v) {
  Means m;
  for (const auto& [id, cr] : run.append_results) {
    (void)id;
    if (cr.variants.empty() || !cr.sc.mrope) continue;
    const auto twin = run.append_results.find(cr.sc.twin);
    if (twin == run.append_results.end()) continue;
    const VariantResult* a = find_variant(cr, v);
    const VariantResult* b = find_variant(twin->second, v);
    if (a && b) m.add(a->median_us / b->median_us);
  }
  return m;
}

// The lines of the NVFP4, mRoPE and MLA groups (after the base group's, which they do not enter), each "NAME: ..."
// (not the "NAME geomean us = X" of the base lines, which dev/scripts/ab_suites.sh reads), and
// "mrope/ordinary geomean = X".
inline void print_append_groups(const Run& run) {
  const Options& o = run.options;
  const bool decode = o.suite == Suite::kServeDecode;
  const double empty = run.calibration.empty_kernel_us;
  const std::vector<AppendVariant> order = append_variant_order(o);
  for (const AppendGroup g : kAppendLaterGroups) {
    if (!append_group_ran(run, g)) continue;
    const AppendSummary s = summarize_append(run, g);
    const std::string name = append_group_name(g);
    auto line = [&](const std::string& label, const Means& m, const char* f, int of) {
      if (m.n == 0) return;
      std::printf("%s: %s = %s", name.c_str(), label.c_str(), fmt(f, m.geometric()).c_str());
      if (m.n != of) std::printf("   (over %d of %d cases)", m.n, of);
      std::printf("\n");
    };
    std::printf(
        "\n%s cases: geometric means over the %d case(s) that ran, apart from the means above (CUPTI "
        "medians, us; no naive variant):\n",
        name.c_str(), s.cases);
    for (AppendVariant v : order)
      if (s.time.count(v)) line(std::string(append_variant_name(v)) + " geomean us", s.time.at(v), "%.2f", s.cases);
    line("kvrope floor geomean us", s.floor, "%.2f", s.cases);
    if (g != AppendGroup::kMla) line("kvrope_kip floor geomean us", s.floor_kip, "%.2f", s.cases);  // MLA: no k
    for (AppendVariant v : order)
      if (s.x_floor.count(v))
        line(std::string(append_variant_name(v)) + "/floor geomean", s.x_floor.at(v), "%.3f", s.cases);
    if (decode) {
      for (AppendVariant v : order)
        if (s.x_floor_empty.count(v))
          line(std::string(append_variant_name(v)) + "/(floor+empty) geomean (empty kernel " + fmt("%.2f", empty) +
                   " us)",
               s.x_floor_empty.at(v), "%.3f", s.cases);
    } else {
      for (AppendVariant v : order)
        if (s.x_floor_large.count(v))
          line(std::string(append_variant_name(v)) + "/floor geomean (>= 64 MB, " + std::to_string(s.large_cases) +
                   " case(s))",
               s.x_floor_large.at(v), "%.3f", s.large_cases);
    }
    if (!s.kvrope_x_floor_by_config.empty()) {
      std::printf("%s: kvrope/floor geomean by configuration:", name.c_str());
      for (const auto& [config, m] : s.kvrope_x_floor_by_config)
        std::printf("  %s %.3f;", config.c_str(), m.geometric());
      std::printf("\n");
    }
    if (s.checked_cases == 0)
      std::printf("%s check: none (--no_check)\n", name.c_str());
    else if (s.failures.empty())
      std::printf("%s check: kvrope matched the float64 reference on all %d checked case(s)\n", name.c_str(),
                  s.checked_cases);
    else
      std::printf("%s check: FAILED on %zu of %d checked case(s); first: %s\n", name.c_str(), s.failures.size(),
                  s.checked_cases, s.failures.front().c_str());
    if (g == AppendGroup::kMrope) {
      const Means k = append_mrope_over_ordinary(run, AppendVariant::kKvrope);
      const Means kip = append_mrope_over_ordinary(run, AppendVariant::kKvropeKeyInPlace);
      if (k.n > 0)
        std::printf(
            "mrope/ordinary geomean = %.3f   (kvrope: each bf16+mrope case's median over its bf16 twin's, %d "
            "pair(s); kvrope_kip %s)\n",
            k.geometric(), k.n, fmt("%.3f", kip.geometric()).c_str());
      else
        std::printf(
            "mrope/ordinary geomean: no pair (run the twins too: each bf16+mrope case's twin is the bf16 case "
            "of the same shape, Hq and layout)\n");
    }
  }
}

inline void print_append_summary(const Run& run, const AppendSummary& s) {
  const Options& o = run.options;
  const bool decode = o.suite == Suite::kServeDecode;
  const double nan = std::nan(""), empty = run.calibration.empty_kernel_us;
  std::printf(
      "\nkvrope_bench summary (--suite=%s): %s; bf16 q, k, v (views of one qkv), pages of 16, fp32 table cache, "
      "q rotated in place; kvrope: k read only; kvrope_kip and naive: k rotated in place; times are CUPTI "
      "medians in us\n",
      suite_name(o.suite), run.device.name.c_str());
  if (append_any_query_fp8(run))
    std::printf(
        "q-fp8 cases (cache fp8_e4m3+q8): kvrope and kvrope_kip write RoPE(q) to query_out_fp8 in fp8 e4m3 "
        "(scale %g), q left as it was; floors count q written in 1 byte; naive: as on the fp8_e4m3 case (q in "
        "place in bf16: it has no fp8 q)\n",
        static_cast<double>(kAppendQueryScale));
  print_append_group_notes(run);
  std::printf("%4s %8s %3s %8s %3s | %8s %8s %8s | %7s %7s %8s | %7s %7s %7s %6s%s | %8s %8s | %s\n", "case", "shape",
              "Hq", "cache", "lay", "kvrope", "kip", "naive", "floor", "fl_kip", "MB", "k/fl", "kip/flk", "n/flk",
              "n/k", decode ? " k/(fl+em)" : "", "k_ev", "naive_ev", "check");
  for (const auto& [id, cr] : run.append_results) {
    if (cr.variants.empty()) continue;
    const VariantResult* k = find_variant(cr, AppendVariant::kKvrope);
    const VariantResult* kip = find_variant(cr, AppendVariant::kKvropeKeyInPlace);
    const VariantResult* n = find_variant(cr, AppendVariant::kNaive);
    const double kt = k ? k->median_us : nan, kipt = kip ? kip->median_us : nan, nt = n ? n->median_us : nan;
    const char* check = cr.checks == 0 ? "-" : cr.check_failure.empty() ? "ok" : "FAILED";
    std::printf("%4d %8s %3lld %8s %3s | %8s %8s %8s | %7s %7s %8s | %7s %7s %7s %6s%s | %8s %8s | %s\n", id,
                cr.sc.shape().c_str(), static_cast<long long>(cr.sc.query_heads), cr.sc.cache_label(),
                append_layout_name(cr.sc.layout), fmt("%.2f", kt).c_str(), fmt("%.2f", kipt).c_str(),
                fmt("%.2f", nt).c_str(), fmt("%.2f", cr.floor_us).c_str(), fmt("%.2f", cr.floor_kip_us).c_str(),
                fmt("%.3f", cr.bytes * 1e-6).c_str(), fmt("%.3f", kt / cr.floor_us).c_str(),
                fmt("%.3f", kipt / cr.floor_kip_us).c_str(), fmt("%.3f", nt / cr.floor_kip_us).c_str(),
                fmt("%.1f", nt / kt).c_str(), decode ? (" " + fmt("%9.3f", kt / (cr.floor_us + empty))).c_str() : "",
                fmt("%.2f", k ? k->event_median_us : nan).c_str(), fmt("%.2f", n ? n->event_median_us : nan).c_str(),
                check);
  }
  if (s.cases == 0) {  // no case of the base group: the other groups' lines, if any ran
    if (std::none_of(std::begin(kAppendLaterGroups), std::end(kAppendLaterGroups),
                     [&](AppendGroup g) { return append_group_ran(run, g); })) {
      std::printf("no case ran\n");
      return;
    }
    print_append_groups(run);
    print_append_host(run);
    return;
  }
  // A mean over fewer cases than ran (a variant skipped or failed somewhere) says so.
  auto line = [&](const std::string& label, const Means& m, bool geometric, const char* f, int of) {
    if (m.n == 0) return;
    std::printf("%s = %s", label.c_str(), fmt(f, geometric ? m.geometric() : m.arithmetic()).c_str());
    if (m.n != of) std::printf("   (over %d of %d cases)", m.n, of);
    std::printf("\n");
  };
  const std::vector<AppendVariant> order = append_variant_order(o);
  auto means = [&](bool geo) {
    const char* kind = geo ? "geomean" : "mean";
    for (AppendVariant v : order)
      if (s.time.count(v))
        line(std::string(append_variant_name(v)) + " " + kind + " us", s.time.at(v), geo, "%.2f", s.cases);
    line(std::string("kvrope floor ") + kind + " us", s.floor, geo, "%.2f", s.cases);
    line(std::string("kvrope_kip floor ") + kind + " us", s.floor_kip, geo, "%.2f", s.cases);
    for (AppendVariant v : order)
      if (s.event.count(v))
        line(std::string(append_variant_name(v)) + " event " + kind + " us", s.event.at(v), geo, "%.2f", s.cases);
  };
  std::printf(
      "\ngeometric means over the %d case(s) that ran (CUPTI medians, us; kvrope_kip and naive against "
      "the floor with k written):\n",
      s.cases);
  means(true);
  for (AppendVariant v : order)
    if (s.x_floor.count(v))
      line(std::string(append_variant_name(v)) + "/floor geomean", s.x_floor.at(v), true, "%.3f", s.cases);
  if (decode) {
    std::printf("time / (floor + one empty kernel, %.2f us):\n", empty);
    for (AppendVariant v : order)
      if (s.x_floor_empty.count(v))
        line(std::string(append_variant_name(v)) + "/(floor+empty) geomean", s.x_floor_empty.at(v), true, "%.3f",
             s.cases);
  } else {
    std::printf("cases of 64 MB or more (%d):\n", s.large_cases);
    for (AppendVariant v : order)
      if (s.x_floor_large.count(v))
        line(std::string(append_variant_name(v)) + "/floor geomean (>= 64 MB)", s.x_floor_large.at(v), true, "%.3f",
             s.large_cases);
  }
  line("naive/kvrope geomean speedup", s.naive_x_kvrope, true, "%.1f", s.cases);
  line("naive/kvrope_kip geomean speedup", s.naive_x_kip, true, "%.1f", s.cases);
  if (!s.kvrope_x_floor_by_config.empty()) {
    std::printf("kvrope/floor geomean by configuration:");
    for (const auto& [config, m] : s.kvrope_x_floor_by_config) std::printf("  %s %.3f;", config.c_str(), m.geometric());
    std::printf("\n");
  }
  if (s.checked_cases == 0) {
    std::printf("check: none (--no_check, or only the naive reference ran)\n");
  } else if (s.failures.empty()) {
    std::printf("check: kvrope matched the naive reference on all %d checked case(s)\n", s.checked_cases);
  } else {
    std::printf("check: FAILED on %zu of %d checked case(s); first: %s\n", s.failures.size(), s.checked_cases,
                s.failures.front().c_str());
  }
  for (const auto& [id, cr] : run.append_results)
    if (!cr.check_note.empty()) std::printf("check note (within tolerance): %s\n", cr.check_note.c_str());
  if (s.pdl_cases > 0)
    std::printf(
        "pdl: the pair (a kernel writing qkv, then kvrope) at T <= 32, %d case(s): span geomean %.2f us without "
        "enable_pdl, %.2f with; shorter by %.2f us on average, %.2f at least\n",
        s.pdl_cases, s.pair.geometric(), s.pair_pdl.geometric(), s.pdl_saving_sum / s.pdl_cases, s.pdl_saving_least);
  print_append_host(run);
  std::printf("\narithmetic means over the %d case(s) that ran (CUPTI medians, us):\n", s.cases);
  means(false);
  print_append_groups(run);
}

// --list_cases on a serve suite: the selected cases, one a line, with the bytes their floors count (k read
// only, and k written back) and their group; no device needed.
inline void print_append_case_list(const Options& o, const std::vector<AppendCase>& cases) {
  std::printf("%s: %zu case(s); bytes: what the floor counts, k read only and k written back (kvrope_kip, naive)\n",
              suite_name(o.suite), cases.size());
  std::printf("%4s %9s %4s %3s %4s %11s %4s %7s %12s %12s  %s\n", "case", "shape", "Hq", "H", "D", "cache", "lay",
              "tokens", "bytes", "bytes_kip", "group");
  for (const AppendCase& c : cases) {
    std::string group = append_group_name(c.group());
    if (c.mrope) group += " (twin " + std::to_string(c.twin) + ")";
    if (c.mla)
      group += " (L " + std::to_string(c.latent_dim) + ", R " + std::to_string(c.rotary_dim()) + ", N " +
               std::to_string(c.nope_dim) + (c.query_fp8 ? ", q to fp8 with q_nope" : ", q_pe in place") + ")";
    std::printf("%4d %9s %4lld %3lld %4lld %11s %4s %7lld %12.0f %12.0f  %s\n", c.id, c.shape().c_str(),
                static_cast<long long>(c.query_heads), static_cast<long long>(c.heads),
                static_cast<long long>(c.head_dim), c.cache_label(), append_layout_name(c.layout),
                static_cast<long long>(c.tokens()), append_bytes(c, false), append_bytes(c, true), group.c_str());
  }
}

// The --kvrope_json file of a serve suite: device, config, calibration, cases[] with every per-call time,
// geomean, arithmetic_mean.
inline void write_append_json(const Run& run, const AppendSummary& s, const std::string& path) {
  const Options& o = run.options;
  const bool decode = o.suite == Suite::kServeDecode;
  const double empty = run.calibration.empty_kernel_us;
  const std::vector<AppendVariant> order = append_variant_order(o);
  std::string variants;
  for (AppendVariant v : order)
    if (append_selected(o, v))
      variants += std::string(variants.empty() ? "" : ", ") + "\"" + append_variant_name(v) + "\"";
  std::string j = "{\n" + device_json(run.device);
  j += "  \"config\": {\"suite\": " + json_string(suite_name(o.suite)) +
       ", \"dtype\": \"bf16\", \"qkv\": \"views of one packed [T, (Hq + 2 H) D]\", \"page_size\": 16, "
       "\"positions\": \"int64, position in the sequence\", \"table\": \"fp32 [max_position, D]\", "
       "\"fp8_scales\": [" +
       json_number(kAppendKeyScale) + ", " + json_number(kAppendValueScale) +
       "], \"query_fp8_scale\": " + json_number(kAppendQueryScale) + ", \"iters\": " + std::to_string(o.iters) +
       ", \"warmup\": " + std::to_string(o.warmup) + ", \"check\": " + json_bool(o.check) +
       ", \"seed\": " + std::to_string(o.seed) + ", \"primer\": " + json_bool(o.primer) +
       ", \"naive_first\": " + json_bool(o.naive_first) + ", \"flush\": \"" + (o.flush_reads ? "read" : "write") +
       "\", \"variants\": [" + variants + "], \"clock\": " + json_string(clock_text(run)) + "},\n";
  j += calibration_json(run.calibration);
  j += "  \"cases\": [";
  bool first_case = true;
  for (const auto& [id, cr] : run.append_results) {
    if (cr.variants.empty()) continue;
    const AppendCase& c = cr.sc;
    j += first_case ? "\n" : ",\n";
    first_case = false;
    // The MLA cases' own members (sizes, cache layout, style, scales), after mRoPE's "twin"; none for the others.
    const std::string mla_members =
        c.mla ? ", \"latent_dim\": " + std::to_string(c.latent_dim) + ", \"nope_dim\": " + std::to_string(c.nope_dim) +
                    ", \"rotary_dim\": " + std::to_string(c.rotary_dim()) +
                    ", \"cache_layout\": \"[pages, P, L + R]\", \"style\": \"interleaved\", \"kv_scale\": " +
                    json_number(kMlaKvScale) +
                    (c.query_fp8 ? ", \"query_scale\": " + json_number(kAppendQueryScale) : std::string())
              : std::string();
    j += "    {\"case\": " + std::to_string(id) + ", \"shape\": " + json_string(c.shape()) +
         ", \"seqs\": " + std::to_string(c.seqs) + ", \"tokens_per_seq\": " + std::to_string(c.tokens_per_seq) +
         ", \"tokens\": " + std::to_string(c.tokens()) + ", \"s_max\": " + std::to_string(c.s_max) +
         ", \"query_heads\": " + std::to_string(c.query_heads) + ", \"heads\": " + std::to_string(c.heads) +
         ", \"head_dim\": " + std::to_string(c.head_dim) + ", \"cache\": " + json_string(append_cache_name(c.cache)) +
         ", \"query_fp8\": " + json_bool(c.query_fp8) + ", \"mrope\": " + json_bool(c.mrope) +
         (c.mrope ? ", \"twin\": " + std::to_string(c.twin) : std::string()) + mla_members +
         ", \"group\": " + json_string(append_group_name(c.group())) +
         ", \"layout\": " + json_string(append_layout_name(c.layout)) + ", \"pages\": " + std::to_string(c.pages()) +
         ", \"bytes\": " + json_number(cr.bytes) + ", \"bytes_key_written\": " + json_number(cr.bytes_kip) +
         ", \"floor_us\": " + json_number(cr.floor_us) + ", \"floor_key_written_us\": " + json_number(cr.floor_kip_us) +
         ", \"check\": " +
         json_string(cr.checks == 0             ? "none"
                     : cr.check_failure.empty() ? "ok"
                                                : cr.check_failure) +
         ",\n     \"variants\": {";
    bool first_variant = true;
    for (const auto& [v, r] : cr.variants) {
      j += first_variant ? "\n" : ",\n";
      first_variant = false;
      const double fl = cr.floor_of(v);
      j += std::string("       \"") + append_variant_name(v) + "\": {" + variant_stats_json(r, cr.bytes_of(v), fl);
      if (decode) j += ", \"x_floor_plus_empty\": " + json_number(r.median_us / (fl + empty));
      const VariantResult* n = find_variant(cr, AppendVariant::kNaive);
      if (v != AppendVariant::kNaive && n) j += ", \"speedup_vs_naive\": " + json_number(n->median_us / r.median_us);
      j += variant_times_json(r);
    }
    j += "}}";
  }
  j += "\n  ],\n";
  j += append_host_json(run);
  auto means_of = [&](const AppendSummary& sm, bool geo) {
    auto num = [&](const Means& m) { return json_number(geo ? m.geometric() : m.arithmetic()); };
    std::string m = "{\"cases\": " + std::to_string(sm.cases);
    for (AppendVariant v : order) {
      const std::string name = append_variant_name(v);
      if (sm.time.count(v)) m += ", \"" + name + "_us\": " + num(sm.time.at(v));
      if (sm.event.count(v)) m += ", \"" + name + "_event_us\": " + num(sm.event.at(v));
    }
    m += ", \"floor_us\": " + num(sm.floor) + ", \"floor_key_written_us\": " + num(sm.floor_kip);
    if (geo) {
      for (AppendVariant v : order) {
        const std::string name = append_variant_name(v);
        if (sm.x_floor.count(v)) m += ", \"" + name + "_over_floor\": " + num(sm.x_floor.at(v));
        if (decode && sm.x_floor_empty.count(v))
          m += ", \"" + name + "_over_floor_plus_empty\": " + num(sm.x_floor_empty.at(v));
        if (!decode && sm.x_floor_large.count(v))
          m += ", \"" + name + "_over_floor_64MB_or_more\": " + num(sm.x_floor_large.at(v));
      }
      m += ", \"naive_over_kvrope\": " + num(sm.naive_x_kvrope) + ", \"naive_over_kvrope_kip\": " + num(sm.naive_x_kip);
    }
    return m + "}";
  };
  auto means = [&](bool geo) { return means_of(s, geo); };
  j += "  \"geomean\": " + means(true) + ",\n";
  j += "  \"arithmetic_mean\": " + means(false) + ",\n";
  // The NVFP4, mRoPE and MLA groups, apart from the means above (which cover the base group only).
  std::string groups;
  for (const AppendGroup g : kAppendLaterGroups) {
    if (!append_group_ran(run, g)) continue;
    const AppendSummary gs = summarize_append(run, g);
    groups += std::string(groups.empty() ? "" : ", ") + json_string(append_group_name(g)) +
              ": {\"geomean\": " + means_of(gs, true) + ", \"checked_cases\": " + std::to_string(gs.checked_cases) +
              ", \"check_failures\": " + std::to_string(gs.failures.size()) + "}";
  }
  if (append_group_ran(run, AppendGroup::kMrope))
    groups += std::string(groups.empty() ? "" : ", ") + "\"mrope_over_ordinary\": {\"kvrope\": " +
              json_number(append_mrope_over_ordinary(run, AppendVariant::kKvrope).geometric()) + ", \"kvrope_kip\": " +
              json_number(append_mrope_over_ordinary(run, AppendVariant::kKvropeKeyInPlace).geometric()) + "}";
  if (!groups.empty()) j += "  \"groups\": {" + groups + "},\n";
  j += "  \"check_failures\": " + std::to_string(s.failures.size()) + "\n}\n";
  write_text_file(path, j);
}

}  // namespace kvrope_bench
