// How a head row splits into units (two chunks a lane handles) under each rotary style and partial rotary, and
// how a unit's angles load from a table row.
#pragma once

#include <cstdint>
#include <cstring>

#include "../../core/dtype.cuh"
#include "../../core/rotary.cuh"
#include "../../core/vec.cuh"
#include "../../rope.cuh"

namespace kvrope::detail {

//! Where unit u of a row lies: chunks of N elements at `lo` and `hi`; `rotated` unless it is in the
//! pass-through part; `cross`: the pairs span the two chunks (rotate-half, or interleaved with N = 1),
//! else each chunk holds whole pairs (interleaved). The chunks of consecutive units are consecutive, so a
//! warp's access to a row is contiguous in every style. `pair_lo` / `pair_hi`: the table-cache column of
//! each chunk's first element.
struct UnitPlace {
  int lo, hi, pair_lo, pair_hi;  // (validate: D < 2^31)
  bool rotated, cross;
};

template <int N>
__host__ __device__ __forceinline__ UnitPlace unit_place(RotaryStyle style, int64_t rotary_dim, int64_t head_dim,
                                                         int rotary_units, int u) {
  const int r = static_cast<int>(rotary_dim), d = static_cast<int>(head_dim);
  if (u >= rotary_units) {
    const int at = r + (u - rotary_units) * N;
    return {at, at + (d - r) / 2, 0, 0, false, false};
  }
  if (style == RotaryStyle::kInterleaved && N == 1) return {2 * u, 2 * u + 1, u, u, true, true};
  const int at = u * N;
  if (style == RotaryStyle::kRotateHalf) return {at, at + r / 2, at, at, true, true};
  return {at, at + r / 2, at / 2, (at + r / 2) / 2, true, false};
}

//! A unit's tables, an angle at a time, in fp32: angle `at` from the table cache row row(at) (elements of
//! E, cos at [at], sin at [half + at]; one row for all but under mRoPE, where each pair has its stream's).
//! The pairs span the chunks (element i of each is angle pair_lo + i), or each chunk holds N / 2 whole
//! pairs (angles pair_lo + i / 2 and pair_hi + i / 2).
template <int N, typename E, typename Row>
__device__ __forceinline__ void load_pair_angles(Row&& row, int64_t half, const UnitPlace& pl, RopeChunk<N>& c,
                                                 RopeChunk<N>& s) {
  float ac[N], as[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int at = pl.cross ? pl.pair_lo + i : (i < N / 2 ? pl.pair_lo + i : pl.pair_hi + i - N / 2);
    const E* cs = row(at);
    ac[i] = to_float(cs[at]);
    as[i] = to_float(cs[half + at]);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    c.lo[i] = pl.cross ? ac[i] : ac[i / 2];
    s.lo[i] = pl.cross ? as[i] : as[i / 2];
    c.hi[i] = pl.cross ? ac[i] : ac[N / 2 + i / 2];
    s.hi[i] = pl.cross ? as[i] : as[N / 2 + i / 2];
  }
}

//! The same from one table cache row: cos at `cs`, sin `half` elements after it.
template <int N, typename E>
__device__ __forceinline__ void load_cached_angles(const E* cs, int64_t half, const UnitPlace& pl, RopeChunk<N>& c,
                                                   RopeChunk<N>& s) {
  load_pair_angles<N, E>([cs](int) { return cs; }, half, pl, c, s);
}

//! K consecutive elements of E at p (aligned to their size, a power of two of bytes), in fp32: one access
//! of up to 16 bytes, or two.
template <int K, typename E>
__device__ __forceinline__ void load_run(const E* p, float (&out)[K]) {
  constexpr int kBytes = K * static_cast<int>(sizeof(E));
  constexpr int kWord = kBytes >= 16 ? 16 : kBytes;
  using Word = typename RawWord<kWord>::type;
  E e[K];
#pragma unroll
  for (int w = 0; w < kBytes / kWord; ++w) {
    const Word v = reinterpret_cast<const Word*>(p)[w];
    memcpy(reinterpret_cast<unsigned char*>(e) + w * kWord, &v, kWord);
  }
#pragma unroll
  for (int i = 0; i < K; ++i) out[i] = to_float(e[i]);
}

//! A unit's angles from its token's table row (cos at `cs`, sin at `sn`), as load_cached_angles gives
//! them, in whole accesses: the pairs span the chunks (N angles from pair_lo), or each chunk holds N / 2
//! pairs (N / 2 angles from pair_lo and from pair_hi).
template <int N, typename E>
__device__ __forceinline__ void load_staged_angles(const E* cs, const E* sn, const UnitPlace& pl, RopeChunk<N>& c,
                                                   RopeChunk<N>& s) {
  if constexpr (N >= 2) {
    if (!pl.cross) {
      float c0[N / 2], c1[N / 2], s0[N / 2], s1[N / 2];
      load_run<N / 2>(cs + pl.pair_lo, c0);
      load_run<N / 2>(cs + pl.pair_hi, c1);
      load_run<N / 2>(sn + pl.pair_lo, s0);
      load_run<N / 2>(sn + pl.pair_hi, s1);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        c.lo[i] = c0[i / 2];
        c.hi[i] = c1[i / 2];
        s.lo[i] = s0[i / 2];
        s.hi[i] = s1[i / 2];
      }
      return;
    }
  }
  float ac[N], as[N];
  load_run<N>(cs + pl.pair_lo, ac);
  load_run<N>(sn + pl.pair_lo, as);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    c.lo[i] = c.hi[i] = ac[i];
    s.lo[i] = s.hi[i] = as[i];
  }
}

}  // namespace kvrope::detail
