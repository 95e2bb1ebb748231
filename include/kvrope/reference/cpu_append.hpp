// The float64 CPU reference of the append op (the serving forward, docs/spec.md §6: ragged tokens' q and k
// optionally RMS-normed and rotated, RoPE(k) and v appended to paged caches in T or fp8): every output of a call
// computed from host copies of its inputs (cpu_append), and the per-row pieces it is made of (gold_row,
// slot_writers, the expected error flag), to check a port or an integration against; the fp8 encoder is
// common.hpp's. Each computed value comes with the sum of |products| the tolerance of §1.7 needs (Gold).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../append_params.cuh"
#include "../core/dtype.cuh"
#include "../core/rotary.cuh"
#include "../error_flag.cuh"
#include "common.hpp"
#include "cpu_nvfp4.hpp"

namespace kvrope::reference {

// ---------------------------------------------------------------------------------------------------
// The op.
// ---------------------------------------------------------------------------------------------------

//! With mRoPE (has_mrope), the stream of positions whose row pair i (0 <= i < R/2) of a token takes its cos
//! and sin from (docs/spec.md §6.2): contiguous sections, 0 below s0, 1 below s0 + s1, else 2; interleaved,
//! 1 when i % 3 == 1 and i < 3 s1, 2 when i % 3 == 2 and i < 3 s2, else 0. Without mRoPE, 0.
template <typename T, typename C, typename Pos>
int mrope_stream(const AppendParams<T, C, Pos>& p, int64_t i) {
  if (!has_mrope(p)) return 0;
  const int64_t* s = p.mrope_section;
  if (p.mrope_interleaved) return i % 3 == 1 && i < 3 * s[1] ? 1 : i % 3 == 2 && i < 3 * s[2] ? 2 : 0;
  return i < s[0] ? 0 : i < s[0] + s[1] ? 1 : 2;
}

//! The rows of the table cache token t reads: `stream[j]` the position of stream j (with mRoPE positions is
//! [3, T], streams position_stream_stride apart; else all three are the token's position), or all -1 when
//! one of them is outside [0, max_position) (the token then writes nothing at all: no q, no k out, no cache
//! row).
struct TableRows {
  int64_t stream[3];
  bool valid() const { return stream[0] >= 0; }
};

template <typename T, typename C, typename Pos>
TableRows append_table_rows(const AppendParams<T, C, Pos>& p, int64_t t) {
  TableRows r{};
  bool ok = true;
  for (int j = 0; j < 3; ++j) {
    const int64_t at = has_mrope(p) ? t + j * p.position_stream_stride : t;
    r.stream[j] = static_cast<int64_t>(p.positions[at]);
    ok = ok && r.stream[j] >= 0 && r.stream[j] < p.max_position;
  }
  return ok ? r : TableRows{{-1, -1, -1}};
}

//! The row of the table cache token t reads (with mRoPE, its first stream's), or -1 when its position (with
//! mRoPE, any of the three) is outside [0, max_position).
template <typename T, typename C, typename Pos>
int64_t append_table_row(const AppendParams<T, C, Pos>& p, int64_t t) {
  return append_table_rows(p, t).stream[0];
}

template <typename T, typename C, typename Pos>
bool append_token_valid(const AppendParams<T, C, Pos>& p, int64_t t) {
  return append_table_row(p, t) >= 0;
}

//! The slots the caches have: num_pages * page_size.
template <typename T, typename C, typename Pos>
int64_t num_slots(const AppendParams<T, C, Pos>& p) {
  return p.num_pages * p.page_size;
}

//! The error flag of the append (detail::slots_flag): a token whose position (with mRoPE, any of its three)
//! is outside [0, max_position) must set kErrorPositionIdOutOfRange; a valid token whose slot is at or above
//! num_pages * P must set kErrorSlotOutOfRange. A call with no head rows (H + Hq = 0) reads nothing and sets
//! nothing; slot_mapping is read only with KV heads.
template <typename T, typename C, typename Pos>
AppendFlag expected_append_flag(const AppendParams<T, C, Pos>& p) {
  if (p.heads + p.query_heads <= 0) return {};
  return detail::slots_flag(p.tokens, p.heads > 0 ? p.slot_mapping : nullptr, num_slots(p),
                            [&](int64_t t) { return append_token_valid(p, t); });
}

//! For each slot of [0, num_pages * P), the token whose k and v rows it holds after the call, or -1:
//! the last token naming it whose position is valid (tokens apply in order; one writing nothing does
//! not count). Negative and out-of-range slots name no slot.
template <typename T, typename C, typename Pos>
std::vector<int64_t> slot_writers(const AppendParams<T, C, Pos>& p) {
  return detail::last_writers(p.tokens, p.heads > 0 ? p.slot_mapping : nullptr, num_slots(p),
                              [&](int64_t t) { return append_token_valid(p, t); });
}

//! The cos and sin element e < R of a token reading table rows `rows` (valid) is rotated with: the table
//! cache's columns c and R/2 + c, c = rotary_pair_index(style, R, e), of the row of pair c's stream.
template <typename T, typename C, typename Pos>
Angle append_angle(const AppendParams<T, C, Pos>& p, const TableRows& rows, int64_t e) {
  const int64_t R = rotary_dim_of(p);
  const int64_t c = rotary_pair_index(p.style, R, e);
  return table_angle(p.cos_sin_cache_f32, p.cos_sin_cache, R, rows.stream[mrope_stream(p, c)], c);
}

//! The factor by which the sum of |products| of a normed output is widened: 2 + D / 16. The kernel's
//! norm scale rsqrt(mean(x^2) + eps) is computed in fp32 from a sum of D squares (non-negative: no
//! cancellation, relative error at most (D - 1) u, u = 2^-24, in any order), halved by the square
//! root, plus the mean, the eps, rsqrtf (<= 2 ulp), the products with x and w and the 1 + w: below
//! (D / 2 + 8) u relative. That scale multiplies the whole output, so its error is bounded by that
//! relative error times A, the rotation's sum of |products| of the normed values; the rotation itself
//! adds about 3 u A. 2^-21 (2 + D / 16) A = (16 + D / 2) u A covers both with room.
inline double norm_abs_sum_factor(int64_t head_dim) { return 2.0 + static_cast<double>(head_dim) / 16.0; }

//! The whole rotated row of a head row x of a token reading table rows `rows` (append_table_rows, valid):
//! optionally RMS-normed with `weight` over its D elements, then rotated; elements R..D-1 pass through
//! (normed if asked). out[d].abs_sum is the sum of |products| of the rotation (docs/spec.md §1.7), widened
//! by norm_abs_sum_factor when normed; 0 for a plain copy (a pass-through element without norm).
template <typename T, typename C, typename Pos>
void gold_row(const AppendParams<T, C, Pos>& p, const T* x, const T* weight, const TableRows& rows, Gold* out) {
  const int64_t D = p.head_dim, R = rotary_dim_of(p);
  std::vector<double> y(static_cast<size_t>(D));
  double widen = 0.0;  // 0: no norm
  if (weight) {
    double squares = 0.0;
    for (int64_t d = 0; d < D; ++d) squares += detail::at(x, d) * detail::at(x, d);
    const double r = 1.0 / std::sqrt(squares / static_cast<double>(D) + static_cast<double>(p.norm_eps));
    const double offset = p.norm_weight_plus_one ? 1.0 : 0.0;
    for (int64_t d = 0; d < D; ++d) y[d] = detail::at(x, d) * r * (detail::at(weight, d) + offset);
    widen = norm_abs_sum_factor(D);
  } else {
    for (int64_t d = 0; d < D; ++d) y[d] = detail::at(x, d);
  }
  for (int64_t e = 0; e < D; ++e) {
    if (e >= R) {
      out[e] = {y[e], std::fabs(y[e]) * widen};
      continue;
    }
    const Gold r = rotated_element(p.style, R, y.data(), e, append_angle(p, rows, e));
    out[e] = {r.value, weight ? r.abs_sum * widen : r.abs_sum};
  }
}

//! Dense float64 results of the reference, for small problems: each output as it must be after the call.
//! Caches are in slot order [num_pages * P, H, D] (slot s = page * P + offset).
struct AppendGold {
  std::vector<Gold> query;          // [T, Hq, D]: query_out, or query in place (tokens writing nothing: as before)
  std::vector<Gold> key;            // [T, H, D]: key_out, or key in place, or (neither) what the caches get
  std::vector<Gold> key_cache;      // RoPE(norm(k)) of the slot's writer before quantization; unwritten rows:
                                    // their previous content (abs_sum 0; fp8 decoded)
  std::vector<double> value_cache;  // v of the writer (as given), or the previous content
  std::vector<uint8_t> key_fp8, value_fp8;  // fp8 caches: the codes each row holds (the key rounded to
                                            // T nearest to gold, then quantized); empty otherwise
  // NVFP4 caches: each row's code bytes [slots, H, D / 2] and block scales [slots, H, D / 16] (the key rounded
  // to T nearest to gold, then quantized with correctly rounded quotients: nvfp4_quantize_row); else empty
  std::vector<uint8_t> key_nvfp4, value_nvfp4, key_nvfp4_scales, value_nvfp4_scales;
  std::vector<uint8_t> query_fp8;  // with query_out_fp8 [T, Hq, D]: q rounded to T nearest to
                                   // gold, then quantized (tokens writing nothing: as before)
  std::vector<int64_t> writer;     // slot_writers
  AppendFlag error_flag;           // expected_append_flag
};

namespace detail {
// The rows q is rotated into, and what they held before the call: query_out, or query itself in place.
template <typename T, typename C, typename Pos>
TokenHeads<const T> query_target(const AppendParams<T, C, Pos>& p) {
  return p.query_out.data ? TokenHeads<const T>(p.query_out) : TokenHeads<const T>(p.query);
}
// The rows the rotated k goes to besides the caches, as they were before the call: key_out, or key in
// place, or null.
template <typename T, typename C, typename Pos>
TokenHeads<const T> key_target(const AppendParams<T, C, Pos>& p) {
  if (p.key_out.data) return p.key_out;
  if (p.key_in_place) return p.key;
  return {};
}
}  // namespace detail

//! The NVFP4 caches' part of cpu_append (C = nvfp4_e2m1x2; g's q and k rows computed): each written row is
//! its writer's key (gold, rounded to T nearest) or value quantized with nvfp4_quantize_row under the head's
//! global scale; an unwritten row keeps its bytes. key_cache and value_cache get the values before
//! quantization, or an unwritten row's decoded ones (nvfp4_dequantize).
template <typename T, typename C, typename Pos>
void cpu_append_nvfp4(const AppendParams<T, C, Pos>& in, AppendGold& g) {
  const int64_t H = in.heads, D = in.head_dim, P = in.page_size, slots = num_slots(in);
  const int64_t half = D / 2, blocks = D / kNvfp4Block;
  g.key_nvfp4.resize(slots * H * half);
  g.value_nvfp4.resize(slots * H * half);
  g.key_nvfp4_scales.resize(slots * H * blocks);
  g.value_nvfp4_scales.resize(slots * H * blocks);
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t t = g.writer[s];
    for (int64_t j = 0; j < H; ++j) {
      const int64_t r = s * H + j;
      for (int which = 0; which < 2; ++which) {  // the key cache, then the value cache
        const float gs = scale_of(which ? in.value_scale : in.key_scale, in.scale_per_head, j);
        uint8_t* codes = (which ? g.value_nvfp4 : g.key_nvfp4).data() + r * half;
        uint8_t* scales = (which ? g.value_nvfp4_scales : g.key_nvfp4_scales).data() + r * blocks;
        if (t < 0) {
          const PagedCache<C>& cache = which ? in.value_cache : in.key_cache;
          const PagedCache<__nv_fp8_e4m3>& sf = which ? in.value_block_scales : in.key_block_scales;
          std::memcpy(codes, cache.row(s / P, s % P, j), static_cast<size_t>(half));
          std::memcpy(scales, sf.row(s / P, s % P, j), static_cast<size_t>(blocks));
          for (int64_t d = 0; d < D; ++d) {
            const double x = nvfp4_dequantize(codes, scales, gs, d);
            if (which)
              g.value_cache[r * D + d] = x;
            else
              g.key_cache[r * D + d] = {x, 0.0};
          }
          continue;
        }
        for (int64_t d = 0; d < D; ++d) {
          const Gold k = g.key[(t * H + j) * D + d];
          const T v = in.value.row(t, j)[d];
          if (which)
            g.value_cache[r * D + d] = to_float(v);
          else
            g.key_cache[r * D + d] = k;
          row[d] = which ? to_float(v) : to_float(detail::round_to<T>(k.value));
        }
        nvfp4_quantize_row(row.data(), D, gs, codes, scales);
      }
    }
  }
}

//! Computes every output of the append in float64 from host copies of the inputs taken before the call:
//! q, k, v, the table cache, positions, slots, weights and scales, and the previous contents of the
//! caches, of query_out and of key_out (which tokens writing nothing leave as they were).
template <typename T, typename C, typename Pos>
AppendGold cpu_append(const AppendParams<T, C, Pos>& in) {
  const int64_t N = in.tokens, H = in.heads, Hq = in.query_heads, D = in.head_dim, P = in.page_size;
  const int64_t slots = num_slots(in);
  AppendGold g;
  g.query.resize(N * Hq * D);
  g.key.resize(N * H * D);
  g.key_cache.resize(slots * H * D);
  g.value_cache.resize(slots * H * D);
  g.writer = slot_writers(in);
  g.error_flag = expected_append_flag(in);
  const TokenHeads<const T> q_before = detail::query_target(in), k_before = detail::key_target(in);
  for (int64_t t = 0; t < N; ++t) {
    const TableRows rows = append_table_rows(in, t);
    for (int64_t i = 0; i < Hq; ++i) {
      Gold* out = &g.query[(t * Hq + i) * D];
      if (rows.valid())
        gold_row(in, in.query.row(t, i), in.query_norm_weight, rows, out);
      else
        for (int64_t d = 0; d < D; ++d) out[d] = {detail::at(q_before.row(t, i), d), 0.0};
    }
    for (int64_t j = 0; j < H; ++j) {
      Gold* out = &g.key[(t * H + j) * D];
      if (rows.valid())
        gold_row(in, in.key.row(t, j), in.key_norm_weight, rows, out);
      else
        for (int64_t d = 0; d < D; ++d) out[d] = {detail::at((k_before.data ? k_before : in.key).row(t, j), d), 0.0};
    }
  }
  if (in.query_out_fp8.data) {
    g.query_fp8.resize(N * Hq * D);
    const float qs = scale_of(in.query_scale, false, 0);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t i = 0; i < Hq; ++i)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t o = (t * Hq + i) * D + d;
          g.query_fp8[o] = append_table_row(in, t) >= 0
                               ? quantize<__nv_fp8_e4m3>(detail::round_to<T>(g.query[o].value), qs)
                               : fp8_bits(in.query_out_fp8.row(t, i)[d]);
        }
  }
  if constexpr (kIsFp8<C>) {
    g.key_fp8.resize(slots * H * D);
    g.value_fp8.resize(slots * H * D);
  }
  if constexpr (kIsNvfp4<C>) {
    cpu_append_nvfp4(in, g);
  } else {
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t t = g.writer[s];
      for (int64_t j = 0; j < H; ++j) {
        const C* kc = in.key_cache.row(s / P, s % P, j);
        const C* vc = in.value_cache.row(s / P, s % P, j);
        for (int64_t d = 0; d < D; ++d) {
          const int64_t o = (s * H + j) * D + d;
          if (t < 0) {
            g.key_cache[o] = {detail::cache_value(kc[d]), 0.0};
            g.value_cache[o] = detail::cache_value(vc[d]);
            if constexpr (kIsFp8<C>) g.key_fp8[o] = fp8_bits(kc[d]), g.value_fp8[o] = fp8_bits(vc[d]);
            continue;
          }
          g.key_cache[o] = g.key[(t * H + j) * D + d];
          const T v = in.value.row(t, j)[d];
          g.value_cache[o] = to_float(v);
          if constexpr (kIsFp8<C>) {
            g.key_fp8[o] =
                quantize<C>(detail::round_to<T>(g.key_cache[o].value), scale_of(in.key_scale, in.scale_per_head, j));
            g.value_fp8[o] = quantize<C>(v, scale_of(in.value_scale, in.scale_per_head, j));
          }
        }
      }
    }
  }
  return g;
}

}  // namespace kvrope::reference
