// The float64 CPU reference of the backward op (docs/spec.md §1, with the styles and partial rotary of §2.7):
// every output of a call computed from host copies of its inputs (cpu_backward), and the per-element pieces it is
// made of (gold_grad_key, gold_grad_table), to check a port or an integration against. Each computed value comes
// with the sum of |products| the tolerance of §1.7 needs (Gold).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "../backward_params.cuh"
#include "../core/dtype.cuh"
#include "../core/rotary.cuh"
#include "common.hpp"

namespace kvrope::reference {

//! grad_key_states[b, j, t, d] from gK (host pointers): for the pair (a, b) of d < R, the adjoint of the rotation,
//! gx[a] = g[a] cos[a] + g[b] sin[b] and gx[b] = g[b] cos[b] - g[a] sin[a]; for d >= R the gradient itself (a
//! copy: abs_sum 0). Zero for a token whose position is out of range.
template <typename T, typename Pos>
Gold gold_grad_key(const BackwardCommon<T, Pos>& p, HeadRows<const T> gk, int64_t b, int64_t j, int64_t t, int64_t d) {
  const int64_t r = cache_row(p, t);
  if (r < 0) return {};
  const int64_t R = rotary_dim_of(p);
  const T* g = gk.row(b, j, r);
  using detail::at;
  if (d >= R) return {at(g, d), 0.0};
  const T* c = p.cos.row(b, t);
  const T* s = p.sin.row(b, t);
  const int64_t o = rotary_partner(p.style, R, d);
  const double x = at(g, d) * at(c, d);
  const double y = rotary_first(p.style, R, d) ? at(g, o) * at(s, o) : -at(g, o) * at(s, o);
  return {x + y, std::fabs(x) + std::fabs(y)};
}

//! grad_cos[b, t, d] (table = 0) or grad_sin[b, t, d] (table = 1), d < R: a sum over the heads of g[d] k[d] (cos),
//! of -g[a] k[b] (sin, d = a the first of its pair (a, b)) or g[b] k[a] (sin, d = b the second).
template <typename T, typename Pos>
Gold gold_grad_table(const BackwardCommon<T, Pos>& p, HeadRows<const T> gk, int table, int64_t b, int64_t t,
                     int64_t d) {
  const int64_t r = cache_row(p, t);
  if (r < 0) return {};
  const int64_t R = rotary_dim_of(p);
  const int64_t o = rotary_partner(p.style, R, d);
  const bool first = rotary_first(p.style, R, d);
  Gold out;
  using detail::at;
  for (int64_t j = 0; j < p.heads; ++j) {
    const T* g = gk.row(b, j, r);
    const T* k = p.key_states.row(b, j, t);
    double rot_k = at(k, d);
    if (table == 1) rot_k = first ? -at(k, o) : at(k, o);
    const double prod = at(g, d) * rot_k;
    out.value += prod;
    out.abs_sum += std::fabs(prod);
  }
  return out;
}

//! The same summed over the batch too: what a grad_cos / grad_sin output of batch_stride 0 holds.
template <typename T, typename Pos>
Gold gold_grad_table_batch_sum(const BackwardCommon<T, Pos>& p, HeadRows<const T> gk, int table, int64_t t, int64_t d) {
  Gold out;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Gold one = gold_grad_table(p, gk, table, b, t, d);
    out.value += one.value;
    out.abs_sum += one.abs_sum;
  }
  return out;
}

//! Dense float64 results of the reference, for small problems.
struct BackwardGold {
  std::vector<Gold> grad_key_states;                                 // [B, H, S, D]
  std::vector<Gold> grad_cos, grad_sin;                              // [B, S, R]: one table a batch
  std::vector<Gold> grad_cos_batch_sum, grad_sin_batch_sum;          // [S, R]: an output of batch_stride 0
  std::vector<double> grad_value_states;                             // [B, H, S, D]
  std::vector<double> grad_key_cache_input, grad_value_cache_input;  // [B, H, S_max, D]
};

//! Computes every output of the backward in float64 from host inputs (the output fields of
//! `inputs` are ignored: both forms of the table gradients are given). Out-of-range tokens give
//! zero outputs and zero no row.
template <typename T, typename Pos>
BackwardGold cpu_backward(const BackwardParams<T, Pos>& in) {
  const int64_t B = in.batch, H = in.heads, S = in.seq_len, L = in.cache_len, D = in.head_dim;
  const int64_t R = rotary_dim_of(in);
  BackwardGold g;
  g.grad_key_states.resize(B * H * S * D);
  g.grad_value_states.resize(B * H * S * D);
  g.grad_cos.resize(B * S * R);
  g.grad_sin.resize(B * S * R);
  g.grad_cos_batch_sum.resize(S * R);
  g.grad_sin_batch_sum.resize(S * R);
  g.grad_key_cache_input.resize(B * H * L * D);
  g.grad_value_cache_input.resize(B * H * L * D);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < S; ++t) {
      const int64_t r = cache_row(in, t);
      for (int64_t d = 0; d < R; ++d) {
        Gold* sums[2] = {&g.grad_cos_batch_sum[t * R + d], &g.grad_sin_batch_sum[t * R + d]};
        Gold* per_batch[2] = {&g.grad_cos[(b * S + t) * R + d], &g.grad_sin[(b * S + t) * R + d]};
        for (int table = 0; table < 2; ++table) {
          *per_batch[table] = gold_grad_table(in, in.grad_key_cache, table, b, t, d);
          sums[table]->value += per_batch[table]->value;
          sums[table]->abs_sum += per_batch[table]->abs_sum;
        }
      }
      for (int64_t j = 0; j < H; ++j)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t o = ((b * H + j) * S + t) * D + d;
          g.grad_key_states[o] = gold_grad_key(in, in.grad_key_cache, b, j, t, d);
          g.grad_value_states[o] = r < 0 ? 0.0 : detail::at(in.grad_value_cache.row(b, j, r), d);
        }
    }
    for (int64_t j = 0; j < H; ++j)
      for (int64_t s = 0; s < L; ++s)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t o = ((b * H + j) * L + s) * D + d;
          g.grad_key_cache_input[o] = detail::at(in.grad_key_cache.row(b, j, s), d);
          g.grad_value_cache_input[o] = detail::at(in.grad_value_cache.row(b, j, s), d);
        }
  }
  for (int64_t t = 0; t < S; ++t) {
    const int64_t r = cache_row(in, t);
    if (r < 0) continue;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < H; ++j)
        for (int64_t d = 0; d < D; ++d) {
          g.grad_key_cache_input[((b * H + j) * L + r) * D + d] = 0.0;
          g.grad_value_cache_input[((b * H + j) * L + r) * D + d] = 0.0;
        }
  }
  return g;
}

}  // namespace kvrope::reference
