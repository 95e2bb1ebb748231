// The checker of the backward: a call's outputs (host copies) compared with the float64 reference of
// <kvrope/reference/cpu_backward.hpp>, within the tolerance of docs/spec.md §1.7 (verify/tolerance.hpp). Part of
// verify/ (kvrope_verify, not installed): what the tests and the benchmark check the backward with.
#pragma once

#include <cstdint>
#include <vector>

#include <kvrope/backward_params.cuh>
#include <kvrope/core/dtype.cuh>
#include <kvrope/reference/cpu_backward.hpp>

#include "verify/tolerance.hpp"

namespace kvrope::verify {

//! Host copies of what a call wrote (either variant: for in-place, the cache-input gradients are gK
//! and gV after the call).
template <typename T>
struct BackwardOutputs {
  HeadRows<const T> grad_key_states, grad_value_states, grad_key_cache_input, grad_value_cache_input;
  TokenRows<const T> grad_cos, grad_sin;
};

//! Compares a call's outputs (host copies) with the float64 reference computed from host copies of
//! its inputs: computed outputs within tolerance, copies (grad_value_states, the pass-through
//! elements R..D-1 of grad_key_states) and zeroed rows bit-exact. Out-of-range tokens must have zero
//! outputs. Null grad_cos/grad_sin outputs are not checked; one of batch_stride 0 must hold the sum
//! over the batch (its single [S, R] table is checked once).
template <typename T, typename Pos>
CheckResult check_backward(const BackwardParams<T, Pos>& in, const BackwardOutputs<T>& out) {
  const int64_t B = in.batch, H = in.heads, S = in.seq_len, L = in.cache_len, D = in.head_dim;
  const int64_t R = reference::rotary_dim_of(in);
  const T zero = from_float<T>(0.0f);
  std::vector<char> written(static_cast<size_t>(L), 0);
  for (int64_t t = 0; t < S; ++t)
    if (int64_t r = reference::cache_row(in, t); r >= 0) written[r] = 1;
  return detail::check_batches(B, [&](int64_t b, const auto& expect) {
    for (int64_t t = 0; t < S; ++t) {
      const int64_t r = reference::cache_row(in, t);
      for (int64_t j = 0; j < H; ++j) {
        const T* gks = out.grad_key_states.row(b, j, t);
        const T* gvs = out.grad_value_states.row(b, j, t);
        for (int64_t d = 0; d < D; ++d) {
          if (d < R) {
            const reference::Gold gold = reference::gold_grad_key(in, in.grad_key_cache, b, j, t, d);
            expect(within_tolerance(gks[d], gold.value, gold.abs_sum), "grad_key_states", j, t, d, to_float(gks[d]),
                   gold.value);
          } else {  // pass-through: the gathered gradient itself
            const T want = r < 0 ? zero : in.grad_key_cache.row(b, j, r)[d];
            expect(detail::same_bits(gks[d], want), "grad_key_states", j, t, d, to_float(gks[d]), to_float(want));
          }
          const T want = r < 0 ? zero : in.grad_value_cache.row(b, j, r)[d];
          expect(detail::same_bits(gvs[d], want), "grad_value_states", j, t, d, to_float(gvs[d]), to_float(want));
        }
      }
      for (int table = 0; table < 2; ++table) {
        const TokenRows<const T>& view = table == 0 ? out.grad_cos : out.grad_sin;
        if (!view.data) continue;
        const bool summed = view.batch_stride == 0;  // one table for the whole batch: checked with b = 0
        if (summed && b != 0) continue;
        for (int64_t d = 0; d < R; ++d) {
          const reference::Gold gold = summed ? reference::gold_grad_table_batch_sum(in, in.grad_key_cache, table, t, d)
                                              : reference::gold_grad_table(in, in.grad_key_cache, table, b, t, d);
          const T got = view.row(b, t)[d];
          expect(within_tolerance(got, gold.value, gold.abs_sum), table == 0 ? "grad_cos" : "grad_sin", -1, t, d,
                 to_float(got), gold.value);
        }
      }
    }
    for (int cache = 0; cache < 2; ++cache) {
      const HeadRows<const T>& src = cache == 0 ? in.grad_key_cache : in.grad_value_cache;
      const HeadRows<const T>& dst = cache == 0 ? out.grad_key_cache_input : out.grad_value_cache_input;
      const char* name = cache == 0 ? "grad_key_cache_input" : "grad_value_cache_input";
      for (int64_t j = 0; j < H; ++j)
        for (int64_t s = 0; s < L; ++s) {
          const T* want = src.row(b, j, s);
          const T* got = dst.row(b, j, s);
          for (int64_t d = 0; d < D; ++d) {
            const T w = written[s] ? zero : want[d];
            expect(detail::same_bits(got[d], w), name, j, s, d, to_float(got[d]), to_float(w));
          }
        }
    }
  });
}

}  // namespace kvrope::verify
