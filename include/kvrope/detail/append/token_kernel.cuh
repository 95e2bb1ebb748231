// The append for calls of few tokens (decode): a warp takes rows of one token, a group of lanes one
// row; nothing is staged and no barrier is met, so a row's longest chain is its position, then its
// table row, then its stores.
#pragma once

#include "kernel.cuh"

namespace kvrope::detail {

//! Whether a later token of the call with its position in range names `slot` (in range).
template <typename T, typename C>
__device__ __forceinline__ bool later_names_slot(const AppendArgs<T, C>& a, int64_t token, int64_t slot) {
  bool found = false;
  for_later_slots(a, token + 1 + (threadIdx.x & 31), 32, [&](int64_t s, int64_t u) {
    if (s == slot && append_position(a, u) >= 0) found = true;
  });
  return __any_sync(0xffffffffu, found);
}

//! The few-token append (plan: a.token_warps warps a token, rows j = w * (32 / lanes) + lane / lanes of
//! its warp w). Vector path, a lane one unit (units <= lanes).
template <typename T, typename C, int N>
__global__ void __launch_bounds__(kAppendTokenBlockThreads) append_token_kernel(const AppendArgs<T, C> a) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const uint32_t warp = blockIdx.x * (kAppendTokenBlockThreads / 32) + threadIdx.x / 32;
  const int64_t token = a.div_token_warps.div32(warp);
  if (token >= a.tokens) return;  // (the whole warp)
  const int rows_per_warp = 32 / a.lanes;
  const int first = static_cast<int>(warp - static_cast<uint32_t>(token) * a.div_token_warps.divisor) * rows_per_warp;
  const int per_token = static_cast<int>(a.div_rows.divisor);
  const int j = first + lane / a.lanes;
  const int unit = lane & (a.lanes - 1);
  const bool row_ok = j < per_token, active = row_ok && unit < a.units;
  const UnitPlace pl = unit_place<N>(a.style, a.rotary_dim, a.head_dim, a.rotary_units, unit);
  const AppendRow r = token_row(a, token, 0, j);
  UnitChunks<T, N> x;
  if (active) x = load_chunks<T, N>(row_source(a, r), pl);  // first: nothing it needs is loaded
  const float scale = row_ok ? row_scale(a, r) : 1.0f;      // in flight beside the position, off its chain
  const int64_t p = append_position(a, token);
  int64_t slot = a.heads > 0 ? a.slots[token] : -1;
  const bool in_range = slot >= 0 && slot < a.num_slots;
  // The warp's rows include a k or v row: whether the slot is this token's to write.
  if (in_range && first + rows_per_warp > a.q_heads && first < per_token && later_names_slot(a, token, slot)) slot = -1;
  if (first == 0 && lane == 0 && a.error_flag != nullptr) {
    if (p < 0)
      atomicOr(a.error_flag, kErrorPositionIdOutOfRange);
    else if (slot >= a.num_slots)
      atomicOr(a.error_flag, kErrorSlotOutOfRange);
  }
  if (!row_ok) return;  // (whole groups)
  AppendRowContext<T, C> ctx;
  const unsigned char* table = static_cast<const unsigned char*>(a.table) + p * append_table_bytes(a);
  if (row_context(a, r, table, p < 0 ? -2 : in_range ? slot : -1, scale, ctx))
    finish_row<T, C, N>(a, ctx, pl, active, x);
}

}  // namespace kvrope::detail
