// The summary after every benchmark has run: a per-case table, then the means over the cases.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include "results.cuh"
#include "stats.hpp"

namespace kvrope_bench {

// The published well-ranked entry of the leaderboard, in us (docs/spec.md §5.4).
constexpr double kLeaderboardEntryUs = 33.9;

struct Summary {
  Means naive, fused, inplace, floor, inplace_floor, fused_x_floor, inplace_x_floor, naive_x_fused, naive_x_inplace;
  Means inplace_x_chain;  // in place against its floor plus one dependent chain (chain_bound_us)
  Means naive_event, fused_event, inplace_event;
  Means sol_bound;  // the table's b200_sol_bound_ms, every row, in us
  int cases = 0;
};

// The least an in-place call takes (docs/performance-log.md, chain study): its floor plus one dependent
// chain (position, then row, then store), 1.1 us, or 1.7 us where the floor is the empty kernel.
constexpr double kChainUs = 1.1, kChainAtEmptyUs = 1.7;
inline double chain_bound_us(double floor_us, double empty_kernel_us) {
  return floor_us + (floor_us <= empty_kernel_us * (1 + 1e-9) ? kChainAtEmptyUs : kChainUs);
}

inline Summary summarize(const Run& run) {
  Summary s;
  for (const LeaderboardCase& lc : run.table) s.sol_bound.add(1e3 * lc.b200_sol_bound_ms);
  for (const auto& [id, cr] : run.results) {
    (void)id;
    const VariantResult* n = find_variant(cr, Variant::kNaive);
    const VariantResult* f = find_variant(cr, Variant::kFused);
    const VariantResult* p = find_variant(cr, Variant::kInPlace);
    ++s.cases;
    s.floor.add(cr.floor_us);
    s.inplace_floor.add(cr.inplace_floor_us);
    if (n) {
      s.naive.add(n->median_us);
      s.naive_event.add(n->event_median_us);
    }
    if (f) {
      s.fused.add(f->median_us);
      s.fused_event.add(f->event_median_us);
      s.fused_x_floor.add(f->median_us / cr.floor_us);
    }
    if (p) {
      s.inplace.add(p->median_us);
      s.inplace_event.add(p->event_median_us);
      s.inplace_x_floor.add(p->median_us / cr.inplace_floor_us);
      s.inplace_x_chain.add(p->median_us / chain_bound_us(cr.inplace_floor_us, run.calibration.empty_kernel_us));
    }
    if (n && f) s.naive_x_fused.add(n->median_us / f->median_us);
    if (n && p) s.naive_x_inplace.add(n->median_us / p->median_us);
  }
  return s;
}

inline std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

inline void print_summary(const Run& run, const Summary& s) {
  const Options& o = run.options;
  std::printf("\nkvrope_bench summary (--suite=%s): %s, dtype %s, %s, positions %s; times are CUPTI medians in us\n",
              suite_name(o.suite), run.device.name.c_str(), dtype_text(run).c_str(), dims_text(run.cases).c_str(),
              positions_text(run).c_str());
  std::printf("%4s %3s %5s %5s | %9s %9s %9s | %8s %8s | %7s %7s %7s | %9s %9s %9s\n", "case", "B", "S", "S_max",
              "naive", "fused", "inplace", "floor", "ip_floor", "f/floor", "ip/ipfl", "n/fused", "naive_ev", "fused_ev",
              "inpl_ev");
  for (const auto& [id, cr] : run.results) {
    const VariantResult* n = find_variant(cr, Variant::kNaive);
    const VariantResult* f = find_variant(cr, Variant::kFused);
    const VariantResult* p = find_variant(cr, Variant::kInPlace);
    const double nan = std::nan("");
    std::printf("%4d %3lld %5lld %5lld | %9s %9s %9s | %8s %8s | %7s %7s %7s | %9s %9s %9s\n", id,
                static_cast<long long>(cr.lc.batch), static_cast<long long>(cr.lc.seq_len),
                static_cast<long long>(cr.lc.cache_len), fmt("%.2f", n ? n->median_us : nan).c_str(),
                fmt("%.2f", f ? f->median_us : nan).c_str(), fmt("%.2f", p ? p->median_us : nan).c_str(),
                fmt("%.2f", cr.floor_us).c_str(), fmt("%.2f", cr.inplace_floor_us).c_str(),
                fmt("%.3f", f ? f->median_us / cr.floor_us : nan).c_str(),
                fmt("%.3f", p ? p->median_us / cr.inplace_floor_us : nan).c_str(),
                fmt("%.1f", n && f ? n->median_us / f->median_us : nan).c_str(),
                fmt("%.2f", n ? n->event_median_us : nan).c_str(), fmt("%.2f", f ? f->event_median_us : nan).c_str(),
                fmt("%.2f", p ? p->event_median_us : nan).c_str());
  }
  if (s.cases == 0) {
    std::printf("no case ran\n");
    return;
  }
  // A mean over fewer cases than ran (a variant skipped or failed somewhere) says so.
  auto line = [&](const char* label, const Means& m, bool geometric, const char* f) {
    if (m.n == 0) return;
    std::printf("%s = %s", label, fmt(f, geometric ? m.geometric() : m.arithmetic()).c_str());
    if (m.n != s.cases) std::printf("   (over %d of %d cases)", m.n, s.cases);
    std::printf("\n");
  };
  std::printf("\ngeometric means over the %d case(s) that ran (CUPTI medians, us):\n", s.cases);
  line("naive geomean us", s.naive, true, "%.2f");
  line("fused geomean us", s.fused, true, "%.2f");
  line("inplace geomean us", s.inplace, true, "%.2f");
  line("floor geomean us", s.floor, true, "%.2f");
  line("inplace floor geomean us", s.inplace_floor, true, "%.2f");
  line("naive event geomean us", s.naive_event, true, "%.2f");
  line("fused event geomean us", s.fused_event, true, "%.2f");
  line("inplace event geomean us", s.inplace_event, true, "%.2f");
  line("fused/floor geomean", s.fused_x_floor, true, "%.3f");
  line("inplace/inplace-floor geomean", s.inplace_x_floor, true, "%.3f");
  line("inplace/(inplace-floor + chain) geomean", s.inplace_x_chain, true, "%.3f");
  line("naive/fused geomean speedup", s.naive_x_fused, true, "%.1f");
  line("naive/inplace geomean speedup", s.naive_x_inplace, true, "%.1f");
  std::printf("\narithmetic means over the %d case(s) that ran (CUPTI medians, us):\n", s.cases);
  line("naive mean us", s.naive, false, "%.2f");
  line("fused mean us", s.fused, false, "%.2f");
  line("inplace mean us", s.inplace, false, "%.2f");
  line("floor mean us", s.floor, false, "%.2f");
  line("inplace floor mean us", s.inplace_floor, false, "%.2f");
  line("naive event mean us", s.naive_event, false, "%.2f");
  line("fused event mean us", s.fused_event, false, "%.2f");
  line("inplace event mean us", s.inplace_event, false, "%.2f");
  // docs/spec.md §5.4: an arithmetic mean could not fall below the bounds' arithmetic mean.
  if (o.suite != Suite::kLeaderboard) return;
  std::printf(
      "leaderboard statistic: geometric mean (its published %.1f us entry is below the arithmetic mean of "
      "its own speed-of-light bounds, %.1f us; their geometric mean is %.2f us)\n",
      kLeaderboardEntryUs, s.sol_bound.arithmetic(), s.sol_bound.geometric());
}

}  // namespace kvrope_bench
