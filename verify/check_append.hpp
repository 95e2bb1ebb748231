// The checker of the append: a call's outputs (host copies) compared with the float64 reference of
// <kvrope/reference/cpu_append.hpp>, within the tolerance of docs/spec.md §1.7 (verify/tolerance.hpp), fp8 codes
// and NVFP4 blocks included. Part of verify/ (kvrope_verify, not installed): what the tests and the benchmark check the
// append with.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
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
//! and the caches (NVFP4: with their block scales).
template <typename T, typename C>
struct AppendOutputs {
  TokenHeads<const T> query, query_out, key, key_out, value;
  TokenHeads<const __nv_fp8_e4m3> query_out_fp8;
  PagedCache<const C> key_cache, value_cache;
  PagedCache<const __nv_fp8_e4m3> key_block_scales, value_block_scales;
};

//! The quotient and reciprocal of NVFP4 blocks as the GPU computes them (docs/spec.md §6.4: its approximate
//! division and reciprocal), one a (amax, global scale) asked: with it check_append compares each block bit
//! for bit with the reference fed them (reference::nvfp4_quantize_block); without, with the reference's
//! correctly rounded ones (which a GPU's block rarely differs from).
using Nvfp4Oracle = std::function<std::vector<reference::Nvfp4Approx>(const std::vector<std::array<float, 2>>&)>;

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

// What an NVFP4 cache row's block quantizes, when the call's inputs and outputs show it exactly: 16 values in
// fp32 from v, from k's own pass-through elements (not normed), or from the rotated key the call wrote.
template <typename T, typename C, typename Pos>
const T* nvfp4_block_source(const AppendParams<T, C, Pos>& in, const TokenHeads<const T>& k_written, bool value,
                            int64_t t, int64_t j, int64_t block) {
  if (value) return in.value.row(t, j);
  if (block * reference::kNvfp4Block >= reference::rotary_dim_of(in) && in.key_norm_weight == nullptr)
    return in.key.row(t, j);
  return k_written.data ? k_written.row(t, j) : nullptr;
}

template <typename T>
float nvfp4_block_values(const T* src, int64_t block, float (&x)[reference::kNvfp4Block]) {
  for (int i = 0; i < reference::kNvfp4Block; ++i) x[i] = to_float(src[block * reference::kNvfp4Block + i]);
  return static_cast<float>(reference::nvfp4_amax(x));
}

using Nvfp4Table = std::map<std::array<uint32_t, 2>, reference::Nvfp4Approx>;

inline std::array<uint32_t, 2> nvfp4_key(float amax, float g) {
  std::array<uint32_t, 2> k;
  std::memcpy(&k[0], &amax, 4);
  std::memcpy(&k[1], &g, 4);
  return k;
}

// The oracle's answers for every block an NVFP4 cache row gets from a source check_append sees (empty
// without an oracle).
template <typename T, typename C, typename Pos>
Nvfp4Table nvfp4_table(const AppendParams<T, C, Pos>& in, const TokenHeads<const T>& k_written,
                       const std::vector<int64_t>& writer, const Nvfp4Oracle& oracle) {
  Nvfp4Table table;
  if (!oracle) return table;
  const int64_t blocks = in.head_dim / reference::kNvfp4Block;
  for (size_t s = 0; s < writer.size(); ++s) {
    const int64_t t = writer[s];
    if (t < 0) continue;
    for (int64_t j = 0; j < in.heads; ++j)
      for (const bool value : {false, true}) {
        const float g = reference::scale_of(value ? in.value_scale : in.key_scale, in.scale_per_head, j);
        for (int64_t b = 0; b < blocks; ++b)
          if (const T* src = nvfp4_block_source(in, k_written, value, t, j, b)) {
            float x[reference::kNvfp4Block];
            table[nvfp4_key(nvfp4_block_values(src, b, x), g)] = {};
          }
      }
  }
  std::vector<std::array<float, 2>> asked;
  for (const auto& entry : table) {
    std::array<float, 2> a;
    std::memcpy(&a[0], &entry.first[0], 4);
    std::memcpy(&a[1], &entry.first[1], 4);
    asked.push_back(a);
  }
  const std::vector<reference::Nvfp4Approx> answers = oracle(asked);
  size_t i = 0;
  for (auto& entry : table) entry.second = i < answers.size() ? answers[i++] : reference::Nvfp4Approx{};
  return table;
}

// Whether a block is at most one step from `want` (a key check_append cannot see: the call's own rounding of
// it to T may differ from the reference's by an ulp): the scale byte within one e4m3 code, each element's
// e2m1 magnitude within one code, of the same sign where both are non-zero.
inline bool nvfp4_block_near(uint8_t scale, const uint8_t* codes, const reference::Nvfp4Block& want) {
  if (std::abs(int{scale} - int{want.scale}) > 1) return false;
  for (int i = 0; i < reference::kNvfp4Block; ++i) {
    const int g = (codes[i / 2] >> (4 * (i % 2))) & 0xF, w = (want.packed[i / 2] >> (4 * (i % 2))) & 0xF;
    if (std::abs((g & 7) - (w & 7)) > 1 || ((g & 7) && (w & 7) && (g & 8) != (w & 8))) return false;
  }
  return true;
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
//! - NVFP4: each block (scale byte and code bytes) of a written row the reference's block of the same 16
//!   values in T (v, k's own pass-through elements, or the call's own rotated key), bit for bit, with the
//!   GPU's quotient and reciprocal when `nvfp4_oracle` gives them; when no output shows the rotated key, the
//!   reference's block of the key rounded to T nearest gold, within one step (nvfp4_block_near);
//! - every other cache row unchanged, bit for bit (NVFP4: its block scales too).
//! The error flag is checked apart (expected_append_flag).
template <typename T, typename C, typename Pos>
CheckResult check_append(const AppendParams<T, C, Pos>& in, const AppendOutputs<T, C>& out,
                         const Nvfp4Oracle& nvfp4_oracle = {}) {
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
  detail::Nvfp4Table nvfp4;
  if constexpr (kIsNvfp4<C>) nvfp4 = detail::nvfp4_table(in, k_written, writer, nvfp4_oracle);
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
    } else if constexpr (kIsNvfp4<C>) {
      const int64_t page = unit - N;
      const int64_t half = D / 2, blocks = D / reference::kNvfp4Block;
      for (int64_t off = 0; off < P; ++off) {
        const int64_t s = page * P + off;
        const int64_t t = writer[static_cast<size_t>(s)];
        for (int64_t j = 0; j < H; ++j) {
          if (t >= 0)
            reference::gold_row(in, in.key.row(t, j), in.key_norm_weight, reference::append_table_rows(in, t),
                                gold.data());
          for (const bool value : {false, true}) {
            const char* name = value ? "value_cache" : "key_cache";
            const char* scales_name = value ? "value_block_scales" : "key_block_scales";
            auto at = [&](int64_t i) {
              return [=] {
                return "[page=" + std::to_string(page) + ", offset=" + std::to_string(off) +
                       ", h=" + std::to_string(j) + ", byte=" + std::to_string(i) + "]";
              };
            };
            const PagedCache<const C> got_rows = value ? out.value_cache : out.key_cache;
            const PagedCache<const __nv_fp8_e4m3> got_sf = value ? out.value_block_scales : out.key_block_scales;
            if (!got_rows.data || !got_sf.data) continue;
            const auto* got = reinterpret_cast<const uint8_t*>(got_rows.row(page, off, j));
            const auto* got_scales = reinterpret_cast<const uint8_t*>(got_sf.row(page, off, j));
            if (t < 0) {  // no token writes the slot: the row and its scales as they were
              const auto* was =
                  reinterpret_cast<const uint8_t*>((value ? in.value_cache : in.key_cache).row(page, off, j));
              const auto* was_scales = reinterpret_cast<const uint8_t*>(
                  (value ? in.value_block_scales : in.key_block_scales).row(page, off, j));
              for (int64_t i = 0; i < half; ++i) u.expect(got[i] == was[i], name, at(i), got[i], was[i]);
              for (int64_t i = 0; i < blocks; ++i)
                u.expect(got_scales[i] == was_scales[i], scales_name, at(i), got_scales[i], was_scales[i]);
              continue;
            }
            const float g = reference::scale_of(value ? in.value_scale : in.key_scale, in.scale_per_head, j);
            for (int64_t b = 0; b < blocks; ++b) {
              float x[reference::kNvfp4Block];
              const uint8_t* codes = got + b * (reference::kNvfp4Block / 2);
              if (const T* src = detail::nvfp4_block_source(in, k_written, value, t, j, b)) {
                const float amax = detail::nvfp4_block_values(src, b, x);
                const auto found = nvfp4.find(detail::nvfp4_key(amax, g));
                const reference::Nvfp4Block want =
                    reference::nvfp4_quantize_block(x, g, found == nvfp4.end() ? nullptr : &found->second);
                u.expect(got_scales[b] == want.scale, scales_name, at(b), got_scales[b], want.scale);
                for (int i = 0; i < reference::kNvfp4Block / 2; ++i)
                  u.expect(codes[i] == want.packed[i], name, at(b * 8 + i), codes[i], want.packed[i]);
              } else {
                for (int i = 0; i < reference::kNvfp4Block; ++i)
                  x[i] = to_float(reference::detail::round_to<T>(gold[b * reference::kNvfp4Block + i].value));
                const reference::Nvfp4Block want = reference::nvfp4_quantize_block(x, g);
                u.expect(detail::nvfp4_block_near(got_scales[b], codes, want), name, at(b * 8), got_scales[b],
                         want.scale);
              }
            }
          }
        }
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
