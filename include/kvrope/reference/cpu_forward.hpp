// The float64 CPU reference of the forward op (docs/spec.md §2): every output of a call computed from host copies
// of its inputs (cpu_forward), and the per-element pieces it is made of (gold_rope, row_writers, the expected
// error flag), to check a port or an integration against. Each computed value comes with the sum of |products|
// the tolerance of §1.7 needs (Gold).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "../core/dtype.cuh"
#include "../core/rotary.cuh"
#include "../error_flag.cuh"
#include "../forward_params.cuh"
#include "common.hpp"

namespace kvrope::reference {

// (cache_row and positions_in_range: common.hpp, for either op's parameters.)

//! True when the rotary tables come from a table cache (cos_sin_cache or cos_sin_cache_f32), false for per-token
//! tables.
template <typename T, typename Pos>
bool uses_table_cache(const ForwardParams<T, Pos>& p) {
  return p.cos_sin_cache != nullptr || p.cos_sin_cache_f32 != nullptr;
}

//! The row of the table cache token t of batch b reads: its position id, or -1 when the id is outside
//! [0, max_position) (the token then writes nothing at all). With per-token tables: t (always valid).
template <typename T, typename Pos>
int64_t table_row(const ForwardParams<T, Pos>& p, int64_t b, int64_t t) {
  if (!uses_table_cache(p)) return t;
  const int64_t id = static_cast<int64_t>(p.position_ids[b * p.position_ids_batch_stride + t]);
  return (id >= 0 && id < p.max_position) ? id : -1;
}

//! True when token t of batch b is rotated and written (its position id, if any, is in range).
template <typename T, typename Pos>
bool token_valid(const ForwardParams<T, Pos>& p, int64_t b, int64_t t) {
  return table_row(p, b, t) >= 0;
}

//! The bits a call must OR into error_flag: kErrorPositionOutOfRange when some cache_position is outside
//! [-S_max, S_max), kErrorPositionIdOutOfRange when some position id (of a batch b < B) is outside
//! [0, max_position). Nothing when B = 0 (no token is read).
template <typename T, typename Pos>
int expected_error_flag(const ForwardParams<T, Pos>& p) {
  if (p.batch <= 0) return 0;
  int flag = positions_in_range(p) ? 0 : kErrorPositionOutOfRange;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < p.seq_len; ++t)
      if (!token_valid(p, b, t)) flag |= kErrorPositionIdOutOfRange;
  return flag;
}

//! The cos and sin that element e < R of token t in batch b is rotated with (the token must be valid): the
//! per-token tables' [b, t, e], or the table cache's columns c and R/2 + c of the token's position id, with
//! c = rotary_pair_index(style, R, e).
template <typename T, typename Pos>
Angle angle_of(const ForwardParams<T, Pos>& p, int64_t b, int64_t t, int64_t e) {
  const int64_t R = rotary_dim_of(p);
  if (!uses_table_cache(p)) return {detail::at(p.cos.row(b, t), e), detail::at(p.sin.row(b, t), e)};
  const int64_t row = table_row(p, b, t);
  const int64_t c = rotary_pair_index(p.style, R, e);
  if (p.cos_sin_cache_f32) return {p.cos_sin_cache_f32[row * R + c], p.cos_sin_cache_f32[row * R + R / 2 + c]};
  return {detail::at(p.cos_sin_cache + row * R, c), detail::at(p.cos_sin_cache + row * R, R / 2 + c)};
}

//! Element e of RoPE(x) for the head row x of token t in batch b (the token must be valid): for the pair (a, b)
//! of e < R, out[a] = x[a] cos[a] - x[b] sin[a] and out[b] = x[b] cos[b] + x[a] sin[b]; for e >= R, x[e] (a copy:
//! abs_sum 0).
template <typename T, typename Pos>
Gold gold_rope(const ForwardParams<T, Pos>& p, const T* x, int64_t b, int64_t t, int64_t e) {
  using detail::at;
  const int64_t R = rotary_dim_of(p);
  if (e >= R) return {at(x, e), 0.0};
  const Angle a = angle_of(p, b, t, e);
  const int64_t o = rotary_partner(p.style, R, e);
  const double xc = at(x, e) * a.cos;
  const double ys = at(x, o) * a.sin;
  return {rotary_first(p.style, R, e) ? xc - ys : xc + ys, std::fabs(xc) + std::fabs(ys)};
}

//! For each cache row r of batch b, the token whose keys and values it holds after the call, or -1 when no
//! token writes it: the last token t naming r whose cache_position is in range and which is valid (tokens are
//! applied in order; one that writes nothing does not count).
template <typename T, typename Pos>
std::vector<int64_t> row_writers(const ForwardParams<T, Pos>& p, int64_t b) {
  std::vector<int64_t> writer(static_cast<size_t>(p.cache_len), -1);
  for (int64_t t = 0; t < p.seq_len; ++t) {
    const int64_t r = cache_row(p, t);
    if (r >= 0 && token_valid(p, b, t)) writer[r] = t;
  }
  return writer;
}

//! Dense float64 results of the reference, for small problems: each buffer as it must be after the call.
//! Copies (v, the pass-through elements R..D-1, rows and tokens left as they were) have abs_sum 0 and a value
//! exact in T.
struct ForwardGold {
  std::vector<Gold> key_cache;      // [B, H, S_max, D]
  std::vector<double> value_cache;  // [B, H, S_max, D]
  std::vector<Gold> key_out;        // [B, H, S, D]; empty when key_out is null
  std::vector<Gold> query;          // [B, Hq, S, D]: query_out, or query when rotated in place; empty when Hq = 0
  int error_flag = 0;               // expected_error_flag
};

namespace detail {
// The rotated query rows, and what they held before the call: query_out, or query itself in place.
template <typename T, typename Pos>
HeadRows<const T> query_before(const ForwardParams<T, Pos>& p) {
  return p.query_out.data ? p.query_out : p.query;
}
}  // namespace detail

//! Computes every output of the forward in float64 from host copies of the inputs taken before the call:
//! k, v, q, the tables and positions, and the previous contents of the caches, of key_out and of query_out
//! (which tokens that write nothing leave as they were).
template <typename T, typename Pos>
ForwardGold cpu_forward(const ForwardParams<T, Pos>& in) {
  const int64_t B = in.batch, H = in.heads, S = in.seq_len, L = in.cache_len, D = in.head_dim;
  const int64_t Hq = in.query_heads;
  ForwardGold g;
  g.key_cache.resize(B * H * L * D);
  g.value_cache.resize(B * H * L * D);
  if (in.key_out.data) g.key_out.resize(B * H * S * D);
  if (Hq > 0) g.query.resize(B * Hq * S * D);
  g.error_flag = expected_error_flag(in);
  const HeadRows<const T> query_before = detail::query_before(in);
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t> writer = row_writers(in, b);
    for (int64_t j = 0; j < H; ++j)
      for (int64_t r = 0; r < L; ++r) {
        const int64_t t = writer[r];
        for (int64_t d = 0; d < D; ++d) {
          const int64_t o = ((b * H + j) * L + r) * D + d;
          if (t < 0) {
            g.key_cache[o] = {detail::at(in.key_cache.row(b, j, r), d), 0.0};
            g.value_cache[o] = detail::at(in.value_cache.row(b, j, r), d);
          } else {
            g.key_cache[o] = gold_rope(in, in.key_states.row(b, j, t), b, t, d);
            g.value_cache[o] = detail::at(in.value_states.row(b, j, t), d);
          }
        }
      }
    for (int64_t t = 0; t < S; ++t) {
      const bool valid = token_valid(in, b, t);
      for (int64_t j = 0; j < H && in.key_out.data; ++j)
        for (int64_t d = 0; d < D; ++d)
          g.key_out[((b * H + j) * S + t) * D + d] = valid ? gold_rope(in, in.key_states.row(b, j, t), b, t, d)
                                                           : Gold{detail::at(in.key_out.row(b, j, t), d), 0.0};
      for (int64_t i = 0; i < Hq; ++i)
        for (int64_t d = 0; d < D; ++d)
          g.query[((b * Hq + i) * S + t) * D + d] = valid ? gold_rope(in, in.query.row(b, i, t), b, t, d)
                                                          : Gold{detail::at(query_before.row(b, i, t), d), 0.0};
    }
  }
  return g;
}

}  // namespace kvrope::reference
