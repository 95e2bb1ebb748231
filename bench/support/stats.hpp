// Statistics of the bench: medians and percentiles of a case's calls, means over the cases.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvrope_bench {

inline double median_of(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

inline double percentile_of(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::lround(q * static_cast<double>(v.size() - 1)));
  return v[std::min(i, v.size() - 1)];
}

// Geometric and arithmetic means over the positive finite values added (the suite statistic is the
// geometric one, docs/spec.md §5.4).
struct Means {
  double log_sum = 0, sum = 0;
  int n = 0;
  void add(double x) {
    if (x > 0 && std::isfinite(x)) {
      log_sum += std::log(x);
      sum += x;
      ++n;
    }
  }
  double geometric() const { return n > 0 ? std::exp(log_sum / n) : std::nan(""); }
  double arithmetic() const { return n > 0 ? sum / n : std::nan(""); }
};

}  // namespace kvrope_bench
