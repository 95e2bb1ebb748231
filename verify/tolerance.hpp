// The tolerance of docs/spec.md §1.7 and the frame every op's checker shares (verify/check_forward.hpp,
// check_backward.hpp, check_append.hpp): ulp, the bound of a computed output, the outcome of a check and a
// parallel tally of mismatches. Part of verify/ (kvrope_verify, not installed): what the tests and the
// benchmark check the kernels' outputs with, against the float64 references of <kvrope/reference/>.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <kvrope/core/dtype.cuh>

namespace kvrope::verify {

//! Spacing of T's representable numbers at |x| (the smallest subnormal step at 0).
template <typename T>
double ulp(double x) {
  constexpr int kMantissa = std::is_same_v<T, float> ? 23 : std::is_same_v<T, __half> ? 10 : 7;
  constexpr int kMinExp = std::is_same_v<T, __half> ? -14 : -126;
  int e = kMinExp;
  if (x != 0.0 && std::isfinite(x)) e = std::max(std::ilogb(x), kMinExp);
  return std::ldexp(1.0, e - kMantissa);
}

//! The tolerance of docs/spec.md §1.7 for a computed output: |out - gold| <= ulp_T(gold) + 2^-21 * A, where A is
//! the sum of the absolute values of the products that make up the output.
template <typename T>
bool within_tolerance(T out, double gold, double abs_sum) {
  const double o = to_float(out);
  return std::isfinite(o) && std::fabs(o - gold) <= ulp<T>(gold) + std::ldexp(abs_sum, -21);
}

//! The outcome of a check (check_forward, check_backward, check_append): how many elements were compared, how many
//! failed, and the first failure described (output, index, value, expected).
struct CheckResult {
  int64_t checked = 0;
  int64_t mismatches = 0;
  std::string first_mismatch;
  bool ok() const { return mismatches == 0; }
};

namespace detail {

// Collects mismatches from several threads; keeps the first description.
class Tally {
 public:
  void add(int64_t checked, int64_t bad, const std::string& first) {
    std::lock_guard<std::mutex> lock(mu_);
    result_.checked += checked;
    result_.mismatches += bad;
    if (bad && result_.first_mismatch.empty()) result_.first_mismatch = first;
  }
  CheckResult result() const { return result_; }

 private:
  std::mutex mu_;
  CheckResult result_;
};

template <typename F>
void parallel_for(int64_t n, F&& f) {
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int64_t i = w; i < n; i += workers) f(i);
    });
  for (auto& th : pool) th.join();
}

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

inline std::string describe(const char* name, int64_t b, int64_t j, int64_t s, int64_t d, double got, double want) {
  std::ostringstream os;
  os.precision(9);
  os << name << "[b=" << b << ", h=" << j << ", s=" << s << ", d=" << d << "] = " << got << ", expected " << want;
  return os.str();
}

// Runs check(b, expect) for every batch b, in parallel. expect(ok, name, j, s, d, got, want) counts one
// compared element and keeps the first failure's description; the tally of all batches is returned.
template <typename F>
CheckResult check_batches(int64_t batches, F&& check) {
  Tally tally;
  parallel_for(batches, [&](int64_t b) {
    int64_t checked = 0, bad = 0;
    std::string first;
    auto expect = [&](bool ok, const char* name, int64_t j, int64_t s, int64_t d, double got, double want) {
      ++checked;
      if (ok) return;
      if (bad++ == 0) first = describe(name, b, j, s, d, got, want);
    };
    check(b, expect);
    tally.add(checked, bad, first);
  });
  return tally.result();
}

}  // namespace detail

}  // namespace kvrope::verify
