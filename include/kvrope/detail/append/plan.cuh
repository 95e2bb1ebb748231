// The append's planner: small pure functions from a call's shape and a few device facts to the launch.
// No CUDA calls: tested on the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../../append_params.cuh"
#include "args.cuh"
#include "policy.cuh"

namespace kvrope::detail {

//! The kernel's view of a call: q's and k's outputs resolved, the table source folded into one pointer.
template <typename T, typename C, typename Pos>
AppendArgs<T, C> append_args(const AppendParams<T, C, Pos>& p) {
  AppendArgs<T, C> a{};
  a.tokens = p.tokens;
  a.heads = p.heads;
  a.q_heads = p.query_heads;
  a.head_dim = p.head_dim;
  a.rotary_dim = effective_rotary_dim(p.rotary_dim, p.head_dim);
  a.style = p.style;
  a.q = p.query;
  a.k = p.key;
  a.v = p.value;
  a.q_out = p.query_out.data != nullptr ? p.query_out : p.query;
  a.k_out = p.key_out;
  if (p.key_in_place) a.k_back = p.key;
  a.positions = p.positions;
  a.positions_are_int64 = sizeof(Pos) == 8;
  a.table_f32 = p.cos_sin_cache_f32 != nullptr;
  a.table = a.table_f32 ? static_cast<const void*>(p.cos_sin_cache_f32) : p.cos_sin_cache;
  a.max_position = p.max_position;
  a.q_norm = p.query_norm_weight;
  a.k_norm = p.key_norm_weight;
  a.norm_eps = p.norm_eps;
  a.norm_offset = p.norm_weight_plus_one ? 1.0f : 0.0f;
  a.k_cache = p.key_cache;
  a.v_cache = p.value_cache;
  a.slots = p.slot_mapping;
  a.num_slots = p.num_pages * p.page_size;
  a.div_page = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.page_size, 1)));
  a.k_scale = p.key_scale;
  a.v_scale = p.value_scale;
  a.scale_per_head = p.scale_per_head;
  a.error_flag = p.error_flag;
  return a;
}

template <typename V>
bool aligned_to(const V& v, int64_t bytes, int64_t elem) {
  return reinterpret_cast<uintptr_t>(v.data) % bytes == 0 && (v.token_stride * elem) % bytes == 0 &&
         (v.head_stride * elem) % bytes == 0;
}
template <typename C>
bool cache_aligned_to(const PagedCache<C>& c, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(c.data) % bytes == 0 && (c.page_stride * int64_t{sizeof(C)}) % bytes == 0 &&
         (c.offset_stride * int64_t{sizeof(C)}) % bytes == 0 && (c.head_stride * int64_t{sizeof(C)}) % bytes == 0;
}

//! Whether chunks of 16 bytes of T fit every row: R / 2 and (D - R) / 2 whole chunks, every row of q,
//! k, v and their outputs and the norm weights 16-byte aligned, the cache rows aligned to a chunk of C.
template <typename T, typename C>
bool append_vectorizable(const AppendArgs<T, C>& a) {
  constexpr int64_t kWide = 16 / sizeof(T), kT = sizeof(T);
  const int64_t cache_bytes = kWide * int64_t{sizeof(C)};
  return a.head_dim % (2 * kWide) == 0 && a.rotary_dim % (2 * kWide) == 0 && aligned_to(a.q, 16, kT) &&
         aligned_to(a.k, 16, kT) && aligned_to(a.v, 16, kT) && aligned_to(a.q_out, 16, kT) &&
         aligned_to(a.k_out, 16, kT) && aligned_to(a.k_back, 16, kT) &&
         reinterpret_cast<uintptr_t>(a.q_norm) % 16 == 0 && reinterpret_cast<uintptr_t>(a.k_norm) % 16 == 0 &&
         cache_aligned_to(a.k_cache, cache_bytes) && cache_aligned_to(a.v_cache, cache_bytes);
}

//! Lanes a row for `units` units: the power of two that holds them, or 32 (each lane then loops).
inline int append_lanes(int units) {
  int lanes = 1;
  while (lanes < units && lanes < 32) lanes *= 2;
  return lanes;
}

//! Fills the plan part of `a` for chunks of `n` elements, `sms` SMs and `resident` blocks a SM.
template <typename T, typename C>
void plan_append_launch(AppendArgs<T, C>& a, int n, int sms, int resident, AppendPlan& plan) {
  a.units = static_cast<int>(a.head_dim / (2 * n));
  a.rotary_units = static_cast<int>(a.rotary_dim / (2 * n));
  a.lanes = append_lanes(a.units);
  const int64_t per_token = a.q_heads + 2 * a.heads;
  a.rows = a.tokens * per_token;
  a.div_rows = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(per_token, 1)));
  // The repeat bitmask: kAppendMaskBitsPerToken bits a token, a power of two of words; none for one token
  // or no cache rows.
  int64_t words = 32;
  while (words * 32 < a.tokens * kAppendMaskBitsPerToken && words < kAppendMaskMaxWords) words *= 2;
  a.mask_words = a.tokens > 1 && a.heads > 0 ? words : 0;
  const bool single = a.units <= 32;
  const int64_t rows_per_block = kAppendBlockThreads / a.lanes * (single ? kAppendRowsInFlight : 1);
  const int64_t grid_max = int64_t{sms} * std::max(resident, 1);
  plan.launched = true;
  plan.vec_width = n;
  plan.lanes = a.lanes;
  plan.block = kAppendBlockThreads;
  plan.grid = static_cast<int>(std::clamp<int64_t>((a.rows + rows_per_block - 1) / rows_per_block, 1, grid_max));
}

//! Dynamic shared memory of a launch: the two repeat bitmasks.
template <typename T, typename C>
int append_shared_bytes(const AppendArgs<T, C>& a) {
  return static_cast<int>(2 * a.mask_words * 4);
}

}  // namespace kvrope::detail
