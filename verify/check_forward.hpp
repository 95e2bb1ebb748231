// The checker of the forward: a call's outputs (host copies) compared with the float64 reference of
// <kvrope/reference/cpu_forward.hpp>, within the tolerance of docs/spec.md §1.7 (verify/tolerance.hpp). Part of
// verify/ (kvrope_verify, not installed): what the tests and the benchmark check the forward with.
#pragma once

#include <cstdint>
#include <vector>

#include <kvrope/core/dtype.cuh>
#include <kvrope/forward_params.cuh>
#include <kvrope/reference/cpu_forward.hpp>

#include "verify/tolerance.hpp"

namespace kvrope::verify {

//! Host copies of what a call wrote: the caches after the call, key_out, and the rotated queries (query_out, or
//! query after an in-place call). A null key_out or query is not checked.
template <typename T>
struct ForwardOutputs {
  HeadRows<const T> key_cache, value_cache, key_out, query;
};

//! Compares a call's outputs (host copies) with the float64 reference computed from host copies of its inputs
//! taken before the call (as cpu_forward takes them): rotated elements within tolerance; copies bit-exact (the
//! values, the pass-through elements R..D-1, the cache rows no token writes, and the key_out and query rows of
//! tokens that write nothing, left as they were). key_out is checked when both in.key_out and out.key_out are
//! given; the queries when query_heads > 0 and out.query is given.
template <typename T, typename Pos>
CheckResult check_forward(const ForwardParams<T, Pos>& in, const ForwardOutputs<T>& out) {
  const int64_t B = in.batch, H = in.heads, S = in.seq_len, L = in.cache_len, D = in.head_dim;
  const int64_t R = reference::rotary_dim_of(in);
  const bool check_key_out = in.key_out.data && out.key_out.data;
  const bool check_query = in.query_heads > 0 && out.query.data;
  const HeadRows<const T> query_before = reference::detail::query_before(in);
  return detail::check_batches(B, [&](int64_t b, const auto& expect) {
    // One head row of a rotated output: RoPE(x) when the token is valid, else `before` unchanged.
    auto expect_rope = [&](const char* name, const T* got, const T* x, const T* before, int64_t j, int64_t s, int64_t t,
                           bool valid) {
      for (int64_t d = 0; d < D; ++d) {
        if (valid && d < R) {
          const reference::Gold gold = reference::gold_rope(in, x, b, t, d);
          expect(within_tolerance(got[d], gold.value, gold.abs_sum), name, j, s, d, to_float(got[d]), gold.value);
        } else {
          const T want = valid ? x[d] : before[d];
          expect(detail::same_bits(got[d], want), name, j, s, d, to_float(got[d]), to_float(want));
        }
      }
    };
    const std::vector<int64_t> writer = reference::row_writers(in, b);
    for (int64_t j = 0; j < H; ++j)
      for (int64_t r = 0; r < L; ++r) {
        const int64_t t = writer[r];
        const T* k = t < 0 ? nullptr : in.key_states.row(b, j, t);
        expect_rope("key_cache", out.key_cache.row(b, j, r), k, in.key_cache.row(b, j, r), j, r, t, t >= 0);
        const T* want = t < 0 ? in.value_cache.row(b, j, r) : in.value_states.row(b, j, t);
        const T* got = out.value_cache.row(b, j, r);
        for (int64_t d = 0; d < D; ++d)
          expect(detail::same_bits(got[d], want[d]), "value_cache", j, r, d, to_float(got[d]), to_float(want[d]));
      }
    for (int64_t t = 0; t < S; ++t) {
      const bool valid = reference::token_valid(in, b, t);
      for (int64_t j = 0; j < H && check_key_out; ++j)
        expect_rope("key_out", out.key_out.row(b, j, t), in.key_states.row(b, j, t), in.key_out.row(b, j, t), j, t, t,
                    valid);
      for (int64_t i = 0; i < in.query_heads && check_query; ++i)
        expect_rope("query", out.query.row(b, i, t), in.query.row(b, i, t), query_before.row(b, i, t), i, t, t, valid);
    }
  });
}

}  // namespace kvrope::verify
