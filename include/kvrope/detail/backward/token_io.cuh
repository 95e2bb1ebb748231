// A token's loads and stores, shared by the fused and the decode kernels: its position, its head rows
// as loaded, its outputs, and the head sum of the table gradients.
#pragma once

#include <cstdint>

#include "../../error_flag.cuh"
#include "../../rope.cuh"
#include "../common/async_copy.cuh"
#include "../common/position.cuh"
#include "args.cuh"

namespace kvrope::detail {

// Token t's position as loaded (common/position.cuh: its value is formed where it is used).
template <typename T>
__device__ __forceinline__ RawIndex load_position(const ProblemArgs<T>& a, int64_t t) {
  return load_raw_index(a.positions, a.positions_are_int64, t);
}

// The row of the cache a position names, or -1 when it is out of range.
template <typename T>
__device__ __forceinline__ int64_t position_row(const ProblemArgs<T>& a, const RawIndex& raw) {
  return wrapped_row(index_value(raw, a.positions_are_int64), a.cache_len);
}

// The row of the cache token t was written to, or -1 when its position is out of range.
template <typename T>
__device__ __forceinline__ int64_t cache_row(const ProblemArgs<T>& a, int64_t t) {
  return position_row(a, load_position(a, t));
}

// A position fetched ahead with cp.async into the warp's shared-memory slot (sm_80+): a register load
// shares a scoreboard with the item's row loads, whose first wait then waited for it (a round trip an item).
struct PositionPrefetch {
  RawIndex* slot;  // this warp's, in shared memory
  RawIndex held;   // without cp.async: the value as loaded

  template <typename T>
  __device__ __forceinline__ void issue(const ProblemArgs<T>& a, int64_t t, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __syncwarp();  // every lane has read the slot's previous position
    if (lane == 0) {
      if (a.positions_are_int64)
        copy_async(slot, static_cast<const int64_t*>(a.positions) + t, 8);
      else
        copy_async(slot, static_cast<const int32_t*>(a.positions) + t, 4);
      commit_async_copies();
    }
#else
    (void)lane;
    held = load_position(a, t);
#endif
  }

  __device__ __forceinline__ RawIndex take() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    wait_async_copies();
    __syncwarp();  // lane 0's copy is visible to the warp
    return *slot;
#else
    return held;
#endif
  }
};

// A chunk pair as loaded, still in T (widened to fp32 where it is used).
template <typename T, int N>
struct RawChunk {
  Vec<T, N> lo, hi;
  __device__ __forceinline__ RopeChunk<N> widen() const {
    RopeChunk<N> c;
    lo.to_float(c.lo);
    hi.to_float(c.hi);
    return c;
  }
};

template <cub::CacheLoadModifier M, int N, typename T>
__device__ __forceinline__ RawChunk<T, N> load_raw(const T* row, int64_t h, int64_t i0) {
  const T* p = row + i0;  // then p + h: the pair's two accesses share one address register
  return RawChunk<T, N>{load_vec<M, T, N>(p), load_vec<M, T, N>(p + h)};
}

template <cub::CacheStoreModifier M, typename T, int N>
__device__ __forceinline__ void store_raw(T* row, int64_t h, int64_t i0, const RawChunk<T, N>& c) {
  T* p = row + i0;
  store_vec<M>(p, c.lo);
  store_vec<M>(p + h, c.hi);
}

//! How a chunk pair rotates: pairs across the two chunks (rotate-half; the default), whole pairs
//! within each chunk (interleaved), or not at all (the pass-through elements of partial rotary).
enum class RopeMode : int { kCross, kWithin, kPass };

// A lane's outputs for its chunk pair of head j of token t: grad_value_states, grad_key_states, the
// table terms (into gcos / gsin when `tables`) and, with `zero_row`, zeros at row r of the
// cache-input gradients. A token with a bad position passes zero rows, key_ok and tables false
// (or zero tables), so its outputs are zeros whatever its inputs hold (0 x inf would be NaN).
template <RopeMode kMode = RopeMode::kCross, typename T, int N>
__device__ __forceinline__ void store_head_outputs(const ProblemArgs<T>& a, int64_t b, int64_t j, int64_t t, int64_t r,
                                                   int64_t half, int64_t i0, const RawChunk<T, N>& gk_row,
                                                   const RawChunk<T, N>& gv_row, const RawChunk<T, N>& key_row,
                                                   const RopeChunk<N>& cs, const RopeChunk<N>& sn, bool key_ok,
                                                   bool tables, bool zero_row, RopeChunk<N>& gcos, RopeChunk<N>& gsin) {
  if constexpr (kMode == RopeMode::kPass) {  // the gradient as gathered, bit-exact
    const RawChunk<T, N> zero{Vec<T, N>::zeros(), Vec<T, N>::zeros()};
    store_raw<cub::STORE_CS>(a.grad_value.row(b, j, t), half, i0, gv_row);
    store_raw<cub::STORE_CS>(a.grad_key.row(b, j, t), half, i0, key_ok ? gk_row : zero);
  } else if constexpr (kMode == RopeMode::kCross) {
    const RopeChunk<N> gf = gk_row.widen();
    if (tables) accumulate_rope_table_grads(gf, key_row.widen(), gcos, gsin);
    store_raw<cub::STORE_CS>(a.grad_value.row(b, j, t), half, i0, gv_row);
    store_chunk<cub::STORE_CS>(a.grad_key.row(b, j, t), half, i0,
                               key_ok ? rope_backward(gf, cs, sn) : RopeChunk<N>::zeros());
  } else {
    const RopeChunk<N> gf = gk_row.widen();
    if (tables) accumulate_rope_table_grads_interleaved(gf, key_row.widen(), gcos, gsin);
    store_raw<cub::STORE_CS>(a.grad_value.row(b, j, t), half, i0, gv_row);
    store_chunk<cub::STORE_CS>(a.grad_key.row(b, j, t), half, i0,
                               key_ok ? rope_backward_interleaved(gf, cs, sn) : RopeChunk<N>::zeros());
  }
  if (zero_row) {
    const RawChunk<T, N> zero{Vec<T, N>::zeros(), Vec<T, N>::zeros()};
    store_raw<cub::STORE_CS>(a.gk_out.row(b, j, r), half, i0, zero);
    store_raw<cub::STORE_CS>(a.gv_out.row(b, j, r), half, i0, zero);
  }
}

// Stores elements [offset, offset + L) of a lane's table gradients laid out as
// [grad_cos lo | grad_cos hi | grad_sin lo | grad_sin hi] (N elements each) of its chunk pair, whose
// first elements are at gcos / gsin (null: that table's gradient is not asked for).
template <typename T, int N, int L>
__device__ __forceinline__ void store_table_segment(T* gcos, T* gsin, int64_t h, const float (&x)[L], int offset) {
  if constexpr (L >= N) {
#pragma unroll
    for (int q0 = 0; q0 < L; q0 += N) {
      const int q = (offset + q0) / N;  // which of the four
      T* row = q < 2 ? gcos : gsin;
      if (row == nullptr) continue;
      float part[N];
#pragma unroll
      for (int i = 0; i < N; ++i) part[i] = x[q0 + i];
      store_vec<cub::STORE_CS>(row + ((q & 1) ? h : 0), Vec<T, N>::from_float(part));
    }
  } else {
    const int q = offset / N;
    T* row = q < 2 ? gcos : gsin;
    if (row != nullptr) store_vec<cub::STORE_CS>(row + ((q & 1) ? h : 0) + offset % N, Vec<T, L>::from_float(x));
  }
}

// The head sum of the table gradients over the `slots` lanes of a chunk pair, as a reduce-scatter:
// each step halves the values a lane holds, so each lane ends with a distinct 1 / slots of the sums.
template <typename T, int N, int L>
__device__ __forceinline__ void head_sum_and_store(T* gcos, T* gsin, int64_t h, const float (&x)[L], int mask,
                                                   int slots, int slot, int offset) {
  if constexpr (L > 1) {
    if (mask < slots) {
      const bool upper = (slot & mask) != 0;
      float y[L / 2];
#pragma unroll
      for (int i = 0; i < L / 2; ++i) {
        const float give = upper ? x[i] : x[i + L / 2];
        const float keep = upper ? x[i + L / 2] : x[i];
        y[i] = keep + __shfl_xor_sync(0xffffffffu, give, mask);
      }
      head_sum_and_store<T, N, L / 2>(gcos, gsin, h, y, mask * 2, slots, slot, offset + (upper ? L / 2 : 0));
      return;
    }
  }
  // More slots than values (the scalar path, or D = 2): a plain butterfly over the remaining bits.
  float z[L];
#pragma unroll
  for (int i = 0; i < L; ++i) z[i] = x[i];
  for (int m = mask; m < slots; m <<= 1) {
#pragma unroll
    for (int i = 0; i < L; ++i) z[i] += __shfl_xor_sync(0xffffffffu, z[i], m);
  }
  if (slot < mask) store_table_segment<T, N, L>(gcos, gsin, h, z, offset);
}

// A lane's table-gradient sums laid out as head_sum_and_store takes them:
// [grad_cos lo | grad_cos hi | grad_sin lo | grad_sin hi], N elements each.
template <int N>
__device__ __forceinline__ void table_sums(const RopeChunk<N>& gcos, const RopeChunk<N>& gsin, float (&x)[4 * N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    x[i] = gcos.lo[i];
    x[N + i] = gcos.hi[i];
    x[2 * N + i] = gsin.lo[i];
    x[3 * N + i] = gsin.hi[i];
  }
}

}  // namespace kvrope::detail
