// The checker of the append: a call's outputs (host copies) compared with the float64 reference of
// <kvrope/reference/cpu_append.hpp>, within the tolerance of docs/spec.md §1.7 (verify/tolerance.hpp), fp8 codes
// included. Part of verify/ (kvrope_verify, not installed): what the tests and the benchmark check the append with.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <kvrope/append_params.cuh>
#include <kvrope/core/dtype.cuh>
#include <kvrope/reference/cpu_append.hpp>

#include "verify/tolerance.hpp"

namespace kvrope::verify {

//! Host copies of what a call left, each checked when given (data non-null): q and k after the call
//! (rotated where done in place, else unchanged), query_out or query_out_fp8, key_out, v (unchanged),
//! and the caches.
template <typename T, typename C>
struct AppendOutputs {
  TokenHeads<const T> query, query_out, key, key_out, value;
  TokenHeads<const __nv_fp8_e4m3> query_out_fp8;
  PagedCache<const C> key_cache, value_cache;
};

namespace detail {

// The next value of T above (up) or below x, for finite x.
template <typename T>
T next_value(T x, bool up) {
  if constexpr (std::is_same_v<T, float>) {
    return std::nextafter(x, up ? HUGE_VALF : -HUGE_VALF);
  } else {
    uint16_t b;
    std::memcpy(&b, &x, 2);
    const bool negative = b & 0x8000;
    if ((b & 0x7FFF) == 0)
      b = up ? 0x0001 : 0x8001;
    else
      b = static_cast<uint16_t>(up != negative ? b + 1 : b - 1);
    std::memcpy(static_cast<void*>(&x), &b, 2);
    return x;
  }
}

// The smallest (or largest) value of T within [lo, hi] (assumed to hold one).
template <typename T>
T t_bound(double lo, double hi, bool lowest) {
  T x = reference::detail::round_to<T>(lowest ? lo : hi);
  if (lowest) {
    while (to_float(x) < lo) x = next_value(x, true);
    while (to_float(next_value(x, false)) >= lo) x = next_value(x, false);
  } else {
    while (to_float(x) > hi) x = next_value(x, false);
    while (to_float(next_value(x, true)) <= hi) x = next_value(x, true);
  }
  return x;
}

// Whether an fp8 code is what quantize(x, scale) gives for some x in T within the tolerance of `gold`
// (when the rotated key the kernel quantized is not visible): quantize is monotone, so the codes of
// the lowest and highest such x bound the accepted ones.
template <typename C, typename T>
bool fp8_within_tolerance(uint8_t got, const reference::Gold& gold, float scale) {
  const double tol = ulp<T>(gold.value) + std::ldexp(gold.abs_sum, -21);
  const T lo = t_bound<T>(gold.value - tol, gold.value + tol, true);
  const T hi = t_bound<T>(gold.value - tol, gold.value + tol, false);
  const uint8_t qlo = reference::quantize<C>(lo, scale), qhi = reference::quantize<C>(hi, scale);
  if (got == qlo || got == qhi) return true;
  if ((got & 0x7F) == 0) {
    // A zero: -0 comes from the x <= -0 nearest zero, +0 from the x >= +0 nearest zero, if in range.
    const bool negative = got & 0x80;
    const T x =
        negative ? (to_float(hi) < 0 ? hi : from_float<T>(-0.0f)) : (to_float(lo) > 0 ? lo : from_float<T>(0.0f));
    return to_float(lo) <= to_float(x) && to_float(x) <= to_float(hi) && reference::quantize<C>(x, scale) == got;
  }
  const reference::Fp8Format f = reference::fp8_format_of<C>();
  const double v = reference::fp8_decode(got, f);
  return v > reference::fp8_decode(qlo, f) && v < reference::fp8_decode(qhi, f);
}

// Collects one check unit's comparisons and its first failure.
struct UnitTally {
  int64_t checked = 0, bad = 0;
  std::string first;
  template <typename Where>
  void expect(bool ok, const char* name, Where&& where, double got, double want) {
    ++checked;
    if (ok || bad++ != 0) return;
    std::ostringstream os;
    os.precision(9);
    os << name << where() << " = " << got << ", expected " << want;
    first = os.str();
  }
};

}  // namespace detail

//! Compares a call's outputs (host copies) with the float64 reference computed from host copies of its
//! inputs taken before the call (as cpu_append takes them):
//! - rotated elements of q (query_out, or query in place) and of k (key_out and/or key in place) within
//!   the tolerance of docs/spec.md §1.7, its sum of |products| widened for normed rows
//!   (norm_abs_sum_factor); pass-through elements without norm bit-exact copies;
//! - tokens with an invalid position: every row as it was; q left as it was when query_out is given, k
//!   unless key_in_place, v always;
//! - each cache row a token writes: for C = T, the key within tolerance and bit-equal to the rotated key
//!   the call wrote to key_out (or key in place), v bit-exact; for fp8, the code quantize() gives for the
//!   call's own rotated key (or, when neither key_out nor key in place shows it, for some key in T
//!   within tolerance) and for v as given;
//! - every other cache row unchanged, bit for bit.
//! The error flag is checked apart (expected_append_flag).
template <typename T, typename C, typename Pos>
CheckResult check_append(const AppendParams<T, C, Pos>& in, const AppendOutputs<T, C>& out) {
  const int64_t N = in.tokens, H = in.heads, Hq = in.query_heads, D = in.head_dim, P = in.page_size;
  const int64_t R = reference::rotary_dim_of(in);
  const int64_t slots = reference::num_slots(in);
  const int64_t pages = slots > 0 ? in.num_pages : 0;
  const std::vector<int64_t> writer = reference::slot_writers(in);
  const bool q_fp8 = in.query_out_fp8.data != nullptr;
  const bool q_in_place = in.query_out.data == nullptr && !q_fp8;
  const float qs = reference::scale_of(in.query_scale, false, 0);
  // The rotated key as the call wrote it, when some output shows it.
  const TokenHeads<const T> k_written = in.key_out.data && out.key_out.data ? out.key_out
                                        : in.key_in_place && out.key.data   ? out.key
                                                                            : TokenHeads<const T>{};
  detail::Tally tally;
  // Units [0, N): the tokens' q, k and v rows; [N, N + pages): the caches' pages.
  detail::parallel_for(N + pages, [&](int64_t unit) {
    detail::UnitTally u;
    std::vector<reference::Gold> gold(static_cast<size_t>(D));
    auto token_at = [](int64_t t, int64_t h, int64_t d) {
      return [=] { return "[t=" + std::to_string(t) + ", h=" + std::to_string(h) + ", d=" + std::to_string(d) + "]"; };
    };
    // One rotated row of the input row x: gold (computed beforehand) where the token is valid, else
    // `before` unchanged.
    auto expect_rotated = [&](const char* name, const T* got, const T* x, const T* before, bool valid, bool normed,
                              int64_t t, int64_t h) {
      for (int64_t d = 0; d < D; ++d) {
        const double g = to_float(got[d]);
        if (!valid)
          u.expect(detail::same_bits(got[d], before[d]), name, token_at(t, h, d), g, to_float(before[d]));
        else if (d >= R && !normed)  // a pass-through element: a copy
          u.expect(detail::same_bits(got[d], x[d]), name, token_at(t, h, d), g, to_float(x[d]));
        else
          u.expect(within_tolerance(got[d], gold[d].value, gold[d].abs_sum), name, token_at(t, h, d), g, gold[d].value);
      }
    };
    auto expect_unchanged = [&](const char* name, const T* got, const T* before, int64_t t, int64_t h) {
      for (int64_t d = 0; d < D; ++d)
        u.expect(detail::same_bits(got[d], before[d]), name, token_at(t, h, d), to_float(got[d]), to_float(before[d]));
    };
    if (unit < N) {
      const int64_t t = unit;
      const reference::TableRows rows = reference::append_table_rows(in, t);
      const bool valid = rows.valid();
      for (int64_t i = 0; i < Hq; ++i) {
        if (valid) reference::gold_row(in, in.query.row(t, i), in.query_norm_weight, rows, gold.data());
        const bool normed = in.query_norm_weight != nullptr;
        if (out.query.data) {
          if (q_in_place)
            expect_rotated("query", out.query.row(t, i), in.query.row(t, i), in.query.row(t, i), valid, normed, t, i);
          else
            expect_unchanged("query", out.query.row(t, i), in.query.row(t, i), t, i);
        }
        if (!q_in_place && !q_fp8 && out.query_out.data)
          expect_rotated("query_out", out.query_out.row(t, i), in.query.row(t, i), in.query_out.row(t, i), valid,
                         normed, t, i);
        if (q_fp8 && out.query_out_fp8.data) {
          // fp8 q: the code quantize() gives for some q in T within tolerance (for the pass-through
          // elements without norm: for q's own element); tokens writing nothing: as before.
          const uint8_t* got = reinterpret_cast<const uint8_t*>(out.query_out_fp8.row(t, i));
          const uint8_t* before = reinterpret_cast<const uint8_t*>(in.query_out_fp8.row(t, i));
          for (int64_t d = 0; d < D; ++d) {
            const double g = reference::fp8_decode(got[d], reference::Fp8Format::kE4M3);
            if (!valid)
              u.expect(got[d] == before[d], "query_out_fp8", token_at(t, i, d), g,
                       reference::fp8_decode(before[d], reference::Fp8Format::kE4M3));
            else if (d >= R && !normed) {
              const uint8_t want = reference::quantize<__nv_fp8_e4m3>(in.query.row(t, i)[d], qs);
              u.expect(got[d] == want, "query_out_fp8", token_at(t, i, d), g,
                       reference::fp8_decode(want, reference::Fp8Format::kE4M3));
            } else {
              u.expect(detail::fp8_within_tolerance<__nv_fp8_e4m3, T>(got[d], gold[d], qs), "query_out_fp8",
                       token_at(t, i, d), g, gold[d].value / qs);
            }
          }
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        if (valid) reference::gold_row(in, in.key.row(t, j), in.key_norm_weight, rows, gold.data());
        const bool normed = in.key_norm_weight != nullptr;
        if (out.key.data) {
          if (in.key_in_place)
            expect_rotated("key", out.key.row(t, j), in.key.row(t, j), in.key.row(t, j), valid, normed, t, j);
          else
            expect_unchanged("key", out.key.row(t, j), in.key.row(t, j), t, j);
        }
        if (in.key_out.data && out.key_out.data)
          expect_rotated("key_out", out.key_out.row(t, j), in.key.row(t, j), in.key_out.row(t, j), valid, normed, t, j);
        if (out.value.data) expect_unchanged("value", out.value.row(t, j), in.value.row(t, j), t, j);
      }
    } else {
      const int64_t page = unit - N;
      for (int64_t off = 0; off < P; ++off) {
        const int64_t s = page * P + off;
        const int64_t t = writer[static_cast<size_t>(s)];
        for (int64_t j = 0; j < H; ++j) {
          auto slot_at = [&](int64_t d) {
            return [=] {
              return "[page=" + std::to_string(page) + ", offset=" + std::to_string(off) + ", h=" + std::to_string(j) +
                     ", d=" + std::to_string(d) + "]";
            };
          };
          const C* kb = in.key_cache.row(page, off, j);
          const C* vb = in.value_cache.row(page, off, j);
          const C* kg = out.key_cache.data ? out.key_cache.row(page, off, j) : nullptr;
          const C* vg = out.value_cache.data ? out.value_cache.row(page, off, j) : nullptr;
          if (t < 0) {  // no token writes the slot: both rows as they were
            for (int64_t d = 0; d < D; ++d) {
              if (kg)
                u.expect(detail::same_bits(kg[d], kb[d]), "key_cache", slot_at(d),
                         reference::detail::cache_value(kg[d]), reference::detail::cache_value(kb[d]));
              if (vg)
                u.expect(detail::same_bits(vg[d], vb[d]), "value_cache", slot_at(d),
                         reference::detail::cache_value(vg[d]), reference::detail::cache_value(vb[d]));
            }
            continue;
          }
          const T* v = in.value.row(t, j);
          const T* kw = k_written.data ? k_written.row(t, j) : nullptr;
          const float ks = reference::scale_of(in.key_scale, in.scale_per_head, j);
          const float vs = reference::scale_of(in.value_scale, in.scale_per_head, j);
          const bool normed = in.key_norm_weight != nullptr;
          if (kg)
            reference::gold_row(in, in.key.row(t, j), in.key_norm_weight, reference::append_table_rows(in, t),
                                gold.data());
          for (int64_t d = 0; d < D && kg; ++d) {
            const double got = reference::detail::cache_value(kg[d]);
            const bool copy = d >= R && !normed;  // k's own element, exact in T
            if constexpr (kIsFp8<C>) {
              const uint8_t bits = reference::fp8_bits(kg[d]);
              const T* src = copy ? in.key.row(t, j) : kw;
              if (src) {
                const uint8_t want = reference::quantize<C>(src[d], ks);
                u.expect(bits == want, "key_cache", slot_at(d), got,
                         reference::fp8_decode(want, reference::fp8_format_of<C>()));
              } else {
                u.expect(detail::fp8_within_tolerance<C, T>(bits, gold[d], ks), "key_cache", slot_at(d), got,
                         gold[d].value / ks);
              }
            } else {
              bool ok = copy ? detail::same_bits(kg[d], in.key.row(t, j)[d])
                             : within_tolerance(kg[d], gold[d].value, gold[d].abs_sum);
              if (kw) ok = ok && detail::same_bits(kg[d], kw[d]);  // the key exactly as written to key_out
              u.expect(ok, "key_cache", slot_at(d), got, kw ? to_float(kw[d]) : gold[d].value);
            }
          }
          for (int64_t d = 0; d < D && vg; ++d) {
            const double got = reference::detail::cache_value(vg[d]);
            if constexpr (kIsFp8<C>) {
              const uint8_t want = reference::quantize<C>(v[d], vs);
              u.expect(reference::fp8_bits(vg[d]) == want, "value_cache", slot_at(d), got,
                       reference::fp8_decode(want, reference::fp8_format_of<C>()));
            } else {
              u.expect(detail::same_bits(vg[d], v[d]), "value_cache", slot_at(d), got, to_float(v[d]));
            }
          }
        }
      }
    }
    tally.add(u.checked, u.bad, u.first);
  });
  return tally.result();
}

}  // namespace kvrope::verify
