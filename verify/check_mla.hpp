// The checker of the MLA append: a call's outputs (host copies) compared with the float64 reference of
// <kvrope/reference/cpu_mla.hpp>, within the tolerance of docs/spec.md §1.7 (verify/tolerance.hpp), fp8 codes
// included. Row by row (mla_rotate, mla_slot_writers), never the reference's dense outputs, so that a call of
// thousands of tokens and 128 query heads is checked in its own memory. Part of verify/ (kvrope_verify, not
// installed): what the benchmark checks the MLA append with (the tests' tests/support/mla_case.hpp checks whole
// buffers, strides and padding included).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_fp8.h>

#include <kvrope/core/dtype.cuh>
#include <kvrope/reference/cpu_mla.hpp>

#include "verify/check_append.hpp"  // detail::fp8_within_tolerance, detail::UnitTally
#include "verify/tolerance.hpp"

namespace kvrope::verify {

//! Host copies of what an MLA call left, each laid out as the copy of the same buffer in the reference's
//! arguments (reference::MlaHostArgs: the same strides) and checked when not null: q_pe and q_nope (rotated in
//! place, or unchanged), query_out or query_out_fp8, kv_c and k_pe (unchanged), and the caches.
template <typename T, typename C>
struct MlaOutputs {
  const T* query_pe = nullptr;
  const T* query_nope = nullptr;
  const T* query_out = nullptr;
  const __nv_fp8_e4m3* query_out_fp8 = nullptr;
  const T* kv_c = nullptr;
  const T* k_pe = nullptr;
  reference::MlaCaches<C> caches;  // data null: not checked
};

//! Compares an MLA call's outputs (host copies) with the float64 reference computed from host copies of its
//! inputs taken before the call (`in`, as cpu_mla takes them):
//! - q in place: RoPE(q_pe) within the tolerance, q_nope unchanged; with query_out (query_out_fp8): q_pe and
//!   q_nope unchanged, the rows' [N, N + R) RoPE(q_pe) within the tolerance (fp8: the code quantize() gives for
//!   some value in T within it, under the query scale), [0, N) a copy of q_nope with write_query_nope (fp8: its
//!   code), else as before; tokens with an invalid position: every row as it was;
//! - kv_c and k_pe unchanged;
//! - each slot's latent row from its writer (mla_slot_writers): kv_c a copy (fp8: its code under kv_scale),
//!   RoPE(k_pe) within the tolerance (fp8: as q's); every slot no token writes unchanged, bit for bit.
//! The error flag is checked apart (reference::expected_mla_flag).
template <typename T, typename C, typename Pos>
CheckResult check_mla(const reference::MlaHostArgs<T, C, Pos>& in, const MlaOutputs<T, C>& out) {
  const int64_t NT = in.tokens, Hq = in.query_heads, N = in.nope_dim, R = in.rotary_dim, L = in.latent_dim;
  const int64_t slots = reference::mla_num_slots(in);
  const bool q_fp8 = in.query_out_fp8 != nullptr, q_in_place = in.query_out == nullptr && !q_fp8;
  const float qs = reference::scale_of(in.query_scale, false, 0);
  const float ks = reference::scale_of(in.kv_scale, false, 0);
  const std::vector<int64_t> writer = out.caches.latent.data ? reference::mla_slot_writers(in) : std::vector<int64_t>{};
  const int64_t cache_units = writer.empty() ? 0 : slots;
  detail::Tally tally;
  // Units [0, NT): the tokens' q, kv_c and k_pe rows; [NT, NT + slots): the caches' slots.
  detail::parallel_for(NT + cache_units, [&](int64_t unit) {
    detail::UnitTally u;
    std::vector<reference::Gold> gold(static_cast<size_t>(R));
    auto at = [](const char* what, int64_t a, int64_t b, int64_t d) {
      return [=] {
        return std::string("[") + what + "=" + std::to_string(a) + (b >= 0 ? ", h=" + std::to_string(b) : "") +
               ", d=" + std::to_string(d) + "]";
      };
    };
    auto unchanged = [&](const char* name, const T* got, const T* was, int64_t n, int64_t t, int64_t h) {
      for (int64_t d = 0; d < n; ++d)
        u.expect(detail::same_bits(got[d], was[d]), name, at("t", t, h, d), to_float(got[d]), to_float(was[d]));
    };
    if (unit < NT) {
      const int64_t t = unit;
      const bool valid = reference::mla_token_valid(in, t);
      for (int64_t i = 0; i < Hq; ++i) {
        const T* pe = in.query_pe + t * in.query_pe_token_stride + i * in.query_pe_head_stride;
        const T* nope = N ? in.query_nope + t * in.query_nope_token_stride + i * in.query_nope_head_stride : nullptr;
        const int64_t pe_at = t * in.query_pe_token_stride + i * in.query_pe_head_stride;
        const int64_t nope_at = t * in.query_nope_token_stride + i * in.query_nope_head_stride;
        const int64_t o = t * in.query_out_token_stride + i * in.query_out_head_stride;
        if (valid) reference::mla_rotate(in, pe, t, gold.data());
        if (out.query_pe) {
          const T* got = out.query_pe + pe_at;
          if (q_in_place && valid) {
            for (int64_t e = 0; e < R; ++e)
              u.expect(within_tolerance(got[e], gold[e].value, gold[e].abs_sum), "query_pe", at("t", t, i, e),
                       to_float(got[e]), gold[e].value);
          } else {
            unchanged("query_pe", got, pe, R, t, i);
          }
        }
        if (out.query_nope && nope) unchanged("query_nope", out.query_nope + nope_at, nope, N, t, i);
        if (!q_in_place && !q_fp8 && out.query_out) {
          const T* got = out.query_out + o;
          const T* was = in.query_out + o;
          for (int64_t d = 0; d < N + R; ++d) {
            const double g = to_float(got[d]);
            if (!valid || (d < N && !in.write_query_nope))
              u.expect(detail::same_bits(got[d], was[d]), "query_out", at("t", t, i, d), g, to_float(was[d]));
            else if (d < N)  // a copy of q_nope
              u.expect(detail::same_bits(got[d], nope[d]), "query_out", at("t", t, i, d), g, to_float(nope[d]));
            else
              u.expect(within_tolerance(got[d], gold[d - N].value, gold[d - N].abs_sum), "query_out", at("t", t, i, d),
                       g, gold[d - N].value);
          }
        }
        if (q_fp8 && out.query_out_fp8) {
          const auto* got = reinterpret_cast<const uint8_t*>(out.query_out_fp8 + o);
          const auto* was = reinterpret_cast<const uint8_t*>(in.query_out_fp8 + o);
          for (int64_t d = 0; d < N + R; ++d) {
            const double g = reference::fp8_decode(got[d], reference::Fp8Format::kE4M3);
            if (!valid || (d < N && !in.write_query_nope)) {
              u.expect(got[d] == was[d], "query_out_fp8", at("t", t, i, d), g,
                       reference::fp8_decode(was[d], reference::Fp8Format::kE4M3));
            } else if (d < N) {  // q_nope quantized as given
              const uint8_t want = reference::quantize<__nv_fp8_e4m3>(nope[d], qs);
              u.expect(got[d] == want, "query_out_fp8", at("t", t, i, d), g,
                       reference::fp8_decode(want, reference::Fp8Format::kE4M3));
            } else {
              u.expect(detail::fp8_within_tolerance<__nv_fp8_e4m3, T>(got[d], gold[d - N], qs), "query_out_fp8",
                       at("t", t, i, d), g, gold[d - N].value / qs);
            }
          }
        }
      }
      if (out.kv_c) unchanged("kv_c", out.kv_c + t * in.kv_c_stride, in.kv_c + t * in.kv_c_stride, L, t, -1);
      if (out.k_pe) unchanged("k_pe", out.k_pe + t * in.k_pe_stride, in.k_pe + t * in.k_pe_stride, R, t, -1);
    } else {
      const int64_t s = unit - NT, t = writer[static_cast<size_t>(s)], P = in.page_size;
      const C* lat = out.caches.latent.row(s, P);
      const C* rot = out.caches.rope.row(s, P);
      const C* lat_was = in.caches.latent.row(s, P);
      const C* rot_was = in.caches.rope.row(s, P);
      if (t < 0) {  // no token writes the slot: its row as it was
        for (int64_t d = 0; d < L + R; ++d) {
          const C got = d < L ? lat[d] : rot[d - L], was = d < L ? lat_was[d] : rot_was[d - L];
          u.expect(detail::same_bits(got, was), "cache", at("slot", s, -1, d), reference::detail::cache_value(got),
                   reference::detail::cache_value(was));
        }
      } else {
        const T* kv_c = in.kv_c + t * in.kv_c_stride;
        reference::mla_rotate(in, in.k_pe + t * in.k_pe_stride, t, gold.data());
        for (int64_t d = 0; d < L; ++d) {  // kv_c: a copy, or its code
          const double g = reference::detail::cache_value(lat[d]);
          if constexpr (kIsFp8<C>) {
            const uint8_t want = reference::quantize<C>(kv_c[d], ks);
            u.expect(reference::fp8_bits(lat[d]) == want, "latent_cache", at("slot", s, -1, d), g,
                     reference::fp8_decode(want, reference::fp8_format_of<C>()));
          } else {
            u.expect(detail::same_bits(lat[d], kv_c[d]), "latent_cache", at("slot", s, -1, d), g, to_float(kv_c[d]));
          }
        }
        for (int64_t e = 0; e < R; ++e) {  // RoPE(k_pe)
          const double g = reference::detail::cache_value(rot[e]);
          if constexpr (kIsFp8<C>)
            u.expect(detail::fp8_within_tolerance<C, T>(reference::fp8_bits(rot[e]), gold[e], ks), "rope_cache",
                     at("slot", s, -1, L + e), g, gold[e].value / ks);
          else
            u.expect(within_tolerance(rot[e], gold[e].value, gold[e].abs_sum), "rope_cache", at("slot", s, -1, L + e),
                     g, gold[e].value);
        }
      }
    }
    tally.add(u.checked, u.bad, u.first);
  });
  return tally.result();
}

}  // namespace kvrope::verify
