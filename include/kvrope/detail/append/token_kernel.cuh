// The append for calls of few tokens (decode): a warp takes rows of one token, a group of lanes one
// row; nothing is staged and no barrier is met, so a row's longest chain is its position, then its
// table row, then its stores.
#pragma once

#include "kernel.cuh"

namespace kvrope::detail {

//! Whether a later token of the call with its position in range names `slot` (in range): the warp's
//! lanes load kAppendSlotLoads later slots each a round, all in flight at once.
template <typename T, typename C>
__device__ __forceinline__ bool later_names_slot(const AppendArgs<T, C>& a, int64_t token, int64_t slot) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  bool found = false;
  for (int64_t u0 = token + 1 + lane; u0 < a.tokens; u0 += 32 * kAppendSlotLoads) {
    int64_t s[kAppendSlotLoads];
#pragma unroll
    for (int k = 0; k < kAppendSlotLoads; ++k) {
      const int64_t u = u0 + 32 * k;
      s[k] = u < a.tokens ? a.slots[u] : -1;
    }
#pragma unroll
    for (int k = 0; k < kAppendSlotLoads; ++k)
      if (s[k] == slot && append_position(a, u0 + 32 * k) >= 0) found = true;
  }
  return __any_sync(0xffffffffu, found);
}

//! The few-token append (plan: a.token_warps warps a token; warp w takes its rows first + i * G + g, g the
//! lane's group of G = 32 / lanes, i < kAppendTokenRows, first = w * G * kAppendTokenRows). Vector path,
//! a lane one unit (units <= lanes). A lane's rows share their token's angles: every row is finished
//! before any is stored, so the table row is read once.
template <typename T, typename C, int N>
__global__ void __launch_bounds__(kAppendTokenBlockThreads) append_token_kernel(const AppendArgs<T, C> a) {
  constexpr int kRows = kAppendTokenRows;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const uint32_t warp = blockIdx.x * (kAppendTokenBlockThreads / 32) + threadIdx.x / 32;
  const int64_t token = a.div_token_warps.div32(warp);
  if (token >= a.tokens) return;  // (the whole warp)
  const int groups = 32 / a.lanes;
  const int first = static_cast<int>(warp - static_cast<uint32_t>(token) * a.div_token_warps.divisor) * groups * kRows;
  const int per_token = static_cast<int>(a.div_rows.divisor);
  const int unit = lane & (a.lanes - 1);
  const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, unit);
  AppendRow r[kRows];
  UnitChunks<T, N> x[kRows];
  float scale[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {  // first: nothing they need is loaded
    const int j = first + i * groups + lane / a.lanes;
    r[i] = token_row(a, token, 0, j < per_token ? j : 0);
    if (j < per_token && unit < a.units) x[i] = load_chunks<T, N>(row_source(a, r[i]), pl);
    scale[i] = j < per_token ? row_scale(a, r[i]) : 1.0f;  // in flight beside the position, off its chain
  }
  const int64_t p = append_position(a, token);
  int64_t slot = a.heads > 0 ? a.slots[token] : -1;
  const bool in_range = slot >= 0 && slot < a.num_slots;
  // The warp's rows include a k or v row: whether the slot is this token's to write.
  if (in_range && first + groups * kRows > a.q_heads && first < per_token && later_names_slot(a, token, slot))
    slot = -1;
  if (first == 0 && lane == 0 && a.error_flag != nullptr) {
    if (p < 0)
      atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
    else if (slot >= a.num_slots)
      atomicOr(a.error_flag, kErrorSlotOutOfRange);
  }
  if (p < 0) return;  // (the whole warp: the token writes nothing)
  const unsigned char* table = static_cast<const unsigned char*>(a.table) + p * append_table_bytes(a);
  AppendRowContext<T, C> ctx[kRows];
  bool ok[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    ok[i] = first + i * groups + lane / a.lanes < per_token;  // (whole groups)
    if (ok[i]) {
      row_context(a, r[i], table, in_range ? slot : -1, scale[i], ctx[i]);
      const bool active = unit < a.units;
      if (ctx[i].norm != nullptr)
        ctx[i].inv_rms = row_inv_rms(a, group_sum(active ? unit_square_sum(x[i]) : 0.0f, a.lanes));
      if (active) finish_unit<T, C, N>(a, ctx[i], pl, x[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    if (ok[i] && unit < a.units) store_unit<T, C, N>(a, ctx[i], pl, x[i]);
}

}  // namespace kvrope::detail
