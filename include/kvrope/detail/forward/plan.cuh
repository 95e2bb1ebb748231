// The forward's planner: small pure functions from a call's shape and a few device facts to the launch.
// No CUDA calls: tested on the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../../forward_params.cuh"
#include "../common/alignment.cuh"
#include "args.cuh"
#include "policy.cuh"

namespace kvrope::detail {

//! The kernel's view of a call: q's output resolved, the table source folded into one pointer.
template <typename T, typename Pos>
ForwardArgs<T> forward_args(const ForwardParams<T, Pos>& p) {
  ForwardArgs<T> a{};
  a.batch = p.batch;
  a.heads = p.heads;
  a.seq_len = p.seq_len;
  a.cache_len = p.cache_len;
  a.head_dim = p.head_dim;
  a.rotary_dim = effective_rotary_dim(p.rotary_dim, p.head_dim);
  a.style = p.style;
  a.k = p.key_states;
  a.v = p.value_states;
  a.k_cache = p.key_cache;
  a.v_cache = p.value_cache;
  a.k_out = p.key_out;
  a.q_heads = p.query_heads;
  a.q = p.query;
  a.q_out = p.query_out.data != nullptr ? p.query_out : p.query;
  a.cos = p.cos;
  a.sin = p.sin;
  a.table_f32 = p.cos_sin_cache_f32 != nullptr;
  a.table_cache = a.table_f32 ? static_cast<const void*>(p.cos_sin_cache_f32) : p.cos_sin_cache;
  a.max_position = p.max_position;
  a.position_ids = p.position_ids;
  a.position_ids_batch_stride = p.position_ids_batch_stride;
  a.positions = p.cache_position;
  a.positions_are_int64 = sizeof(Pos) == 8;
  a.error_flag = p.error_flag;
  a.div_seq = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.seq_len, 1)));
  return a;
}

//! Whether every row is 16-byte aligned and R / 2 and (D - R) / 2 are whole vectors.
template <typename T>
bool forward_vectorizable(const ForwardArgs<T>& a) {
  constexpr int64_t kWide = 16 / sizeof(T);
  return a.head_dim % (2 * kWide) == 0 && a.rotary_dim % (2 * kWide) == 0 && aligned16(a.k) && aligned16(a.v) &&
         aligned16(a.k_cache) && aligned16(a.v_cache) && aligned16(a.k_out) && aligned16(a.q) && aligned16(a.q_out) &&
         aligned16(a.cos) && aligned16(a.sin);
}

//! Threads a block: fewer for a decode step, which has no run check (kernel.cuh).
inline int forward_block_threads(int64_t seq_len) {
  return seq_len > 1 ? kForwardBlockThreads : kForwardDecodeBlockThreads;
}

//! Fills the plan part of `a` for chunks of `n` elements, `sms` SMs and `resident` blocks a SM (of
//! forward_block_threads(S) threads).
template <typename T>
void plan_forward_launch(ForwardArgs<T>& a, int n, int sms, int resident, ForwardPlan& plan) {
  a.units = static_cast<int>(a.head_dim / (2 * n));
  a.rotary_units = static_cast<int>(a.rotary_dim / (2 * n));
  a.items = a.batch * a.seq_len * (a.heads + a.q_heads) * a.units;
  a.div_units = FastDivmod(static_cast<uint32_t>(a.units));
  a.div_heads = FastDivmod(static_cast<uint32_t>(a.heads + a.q_heads));
  int64_t rows = 32;  // the repeat bitmask: a power of two of rows, one token a batch needs none
  while (rows < std::min(a.cache_len, kForwardMaskRows)) rows *= 2;
  a.mask_words = a.seq_len > 1 && a.cache_len > 0 ? rows / 32 : 0;
  const int64_t grid_max = int64_t{sms} * std::max(resident, 1);
  plan.launched = true;
  plan.vec_width = n;
  plan.block = forward_block_threads(a.seq_len);
  plan.grid = static_cast<int>(std::clamp<int64_t>((a.items + plan.block - 1) / plan.block, 1, grid_max));
  plan.shared_bytes = static_cast<int>(2 * a.mask_words * 4);
}

}  // namespace kvrope::detail
