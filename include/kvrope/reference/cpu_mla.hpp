// The float64 CPU reference of the MLA append (docs/spec.md §6.6: multi-head latent attention, DeepSeek-V2/V3,
// Kimi K2): per token, the rotary part q_pe of each query head rotated (in place, or into q_out beside a copy of
// q_nope, in T or e4m3), and the latent row [kv_c | RoPE(k_pe)] written to a paged cache, one cache of rows
// [L + R] (vLLM's concat_and_cache_mla) or two, [L] and [R] (FlashInfer's append_paged_mla_kv_cache), in T or
// fp8. Every output of a call computed from host copies of its inputs (cpu_mla), with the per-row pieces it is
// made of (mla_rotate, mla_slot_writers, the expected error flag), to check a kernel or an integration against.
// Each computed value comes with the sum of |products| the tolerance of §1.7 needs (Gold); the fp8 codes are
// common.hpp's encoder applied to the value rounded to T.
#pragma once

#include <cstdint>
#include <vector>

#include "../core/dtype.cuh"
#include "../core/rotary.cuh"
#include "../error_flag.cuh"
#include "common.hpp"

namespace kvrope::reference {

//! The rows of one MLA cache: slot s (page s / P, offset s % P) at data + page * page_stride + offset *
//! offset_stride (elements of C), its elements contiguous.
template <typename C>
struct MlaCacheRows {
  const C* data = nullptr;
  int64_t page_stride = 0;
  int64_t offset_stride = 0;
  const C* row(int64_t slot, int64_t page_size) const {
    return data + (slot / page_size) * page_stride + (slot % page_size) * offset_stride;
  }
};

//! Where the latent row of a slot goes: its L latent elements (kv_c) to `latent`, its R rotary ones
//! (RoPE(k_pe)) to `rope`. One description for both layouts (concat and split).
template <typename C>
struct MlaCaches {
  MlaCacheRows<C> latent, rope;
};

//! vLLM's layout: one contiguous cache [num_pages, P, L + R], kv_c in [0, L), RoPE(k_pe) in [L, L + R).
template <typename C>
MlaCaches<C> mla_concat_caches(const C* cache, int64_t page_size, int64_t latent_dim, int64_t rotary_dim) {
  const int64_t w = latent_dim + rotary_dim;
  return {{cache, page_size * w, w}, {cache + latent_dim, page_size * w, w}};
}

//! FlashInfer's layout: two contiguous caches, ckv [num_pages, P, L] and kpe [num_pages, P, R].
template <typename C>
MlaCaches<C> mla_split_caches(const C* ckv, const C* kpe, int64_t page_size, int64_t latent_dim, int64_t rotary_dim) {
  return {{ckv, page_size * latent_dim, latent_dim}, {kpe, page_size * rotary_dim, rotary_dim}};
}

//! The host arrays of an MLA call, as they are before it (strides in elements; the last dim contiguous).
//! T the activations' type (bf16, fp16, fp32), C the caches' (T, or fp8 with kv_scale), Pos the positions'.
template <typename T, typename C = T, typename Pos = int64_t>
struct MlaHostArgs {
  int64_t tokens = 0;                             //!< T
  int64_t query_heads = 0;                        //!< Hq (0: no q)
  int64_t nope_dim = 0;                           //!< N: the non-rotary dims of a query row (0: none)
  int64_t rotary_dim = 0;                         //!< R (even): the rotary dims of a query row and of k_pe
  int64_t latent_dim = 0;                         //!< L: the dims of kv_c
  RotaryStyle style = RotaryStyle::kInterleaved;  //!< DeepSeek's: interleaved (GPT-J)

  //! q_pe [T, Hq, R], the rotary part of q, and q_nope [T, Hq, N] (null when N = 0). A fused q [T, Hq, N + R]
  //! is q_nope = q and q_pe = q + N with q's strides.
  const T* query_pe = nullptr;
  int64_t query_pe_token_stride = 0, query_pe_head_stride = 0;
  const T* query_nope = nullptr;
  int64_t query_nope_token_stride = 0, query_nope_head_stride = 0;

  //! Where RoPE(q_pe) goes: rows [N + R] of query_out (in T) or of query_out_fp8 (e4m3 under query_scale),
  //! RoPE(q_pe) in [N, N + R), with write_query_nope q_nope copied into [0, N); both null: q_pe in place.
  const T* query_out = nullptr;
  const __nv_fp8_e4m3* query_out_fp8 = nullptr;
  int64_t query_out_token_stride = 0, query_out_head_stride = 0;
  bool write_query_nope = false;
  const float* query_scale = nullptr;  //!< one float; null: 1

  const T* kv_c = nullptr;  //!< [T, L]
  int64_t kv_c_stride = 0;
  const T* k_pe = nullptr;  //!< [T, R]
  int64_t k_pe_stride = 0;

  //! The table cache [max_position, R] (cos in [0, R/2), sin in [R/2, R)): cos_sin_cache_f32 if not null,
  //! else cos_sin_cache (in T).
  const T* cos_sin_cache = nullptr;
  const float* cos_sin_cache_f32 = nullptr;
  int64_t max_position = 0;
  const Pos* positions = nullptr;         //!< [T]
  const int64_t* slot_mapping = nullptr;  //!< [T]

  int64_t num_pages = 0, page_size = 0;
  MlaCaches<C> caches;              //!< mla_concat_caches or mla_split_caches, or any strides
  const float* kv_scale = nullptr;  //!< fp8 caches: one float for both parts; null: 1
};

template <typename T, typename C, typename Pos>
int64_t mla_num_slots(const MlaHostArgs<T, C, Pos>& a) {
  return a.num_pages * a.page_size;
}

//! True when token t's position is in [0, max_position); else the token writes nothing at all.
template <typename T, typename C, typename Pos>
bool mla_token_valid(const MlaHostArgs<T, C, Pos>& a, int64_t t) {
  const int64_t pos = static_cast<int64_t>(a.positions[t]);
  return pos >= 0 && pos < a.max_position;
}

//! The error flag of the call: kErrorPositionIdOutOfRange required for a position outside [0, max_position),
//! kErrorSlotOutOfRange for a valid token's slot at or above num_pages * P (allowed for an invalid one's).
template <typename T, typename C, typename Pos>
AppendFlag expected_mla_flag(const MlaHostArgs<T, C, Pos>& a) {
  return detail::slots_flag(a.tokens, a.slot_mapping, mla_num_slots(a),
                            [&](int64_t t) { return mla_token_valid(a, t); });
}

//! For each slot of [0, num_pages * P), the token whose latent row it holds after the call, or -1: the last
//! token naming it whose position is valid.
template <typename T, typename C, typename Pos>
std::vector<int64_t> mla_slot_writers(const MlaHostArgs<T, C, Pos>& a) {
  return detail::last_writers(a.tokens, a.slot_mapping, mla_num_slots(a),
                              [&](int64_t t) { return mla_token_valid(a, t); });
}

//! RoPE of the R elements x of token t (valid): out[e] for e < R, from row positions[t] of the table cache.
template <typename T, typename C, typename Pos>
void mla_rotate(const MlaHostArgs<T, C, Pos>& a, const T* x, int64_t t, Gold* out) {
  const int64_t R = a.rotary_dim, row = static_cast<int64_t>(a.positions[t]);
  std::vector<double> y(static_cast<size_t>(R));
  for (int64_t e = 0; e < R; ++e) y[e] = detail::at(x, e);
  for (int64_t e = 0; e < R; ++e) {
    const Angle ang = table_angle(a.cos_sin_cache_f32, a.cos_sin_cache, R, row, rotary_pair_index(a.style, R, e));
    out[e] = rotated_element(a.style, R, y.data(), e, ang);
  }
}

//! Dense float64 results of the reference, each output as it must be after the call.
struct MlaGold {
  std::vector<Gold> query;         // [T, Hq, N + R]: the rows q goes to (query_out's; in place, q_nope then q_pe);
                                   // parts the call does not write and tokens writing nothing: as before
  std::vector<uint8_t> query_fp8;  // with query_out_fp8, [T, Hq, N + R]: the codes (the T value, quantized)
  std::vector<Gold> cache;         // [num_pages * P, L + R]: kv_c then RoPE(k_pe) of the slot's writer (before
                                   // quantization), or the previous content (abs_sum 0; fp8 decoded)
  std::vector<uint8_t> cache_fp8;  // fp8 caches, [num_pages * P, L + R]: the codes each row holds
  std::vector<int64_t> writer;     // mla_slot_writers
  AppendFlag error_flag;           // expected_mla_flag
};

//! Computes every output of the MLA append in float64 from host copies of the inputs taken before the call:
//! q_pe, q_nope, kv_c, k_pe, the table cache, positions, slots and scales, and the previous contents of the
//! caches and of query_out.
template <typename T, typename C, typename Pos>
MlaGold cpu_mla(const MlaHostArgs<T, C, Pos>& a) {
  const int64_t NT = a.tokens, Hq = a.query_heads, N = a.nope_dim, R = a.rotary_dim, L = a.latent_dim;
  const int64_t W = N + R, slots = mla_num_slots(a);
  const bool fp8_q = a.query_out_fp8 != nullptr, in_place = a.query_out == nullptr && !fp8_q;
  MlaGold g;
  g.writer = mla_slot_writers(a);
  g.error_flag = expected_mla_flag(a);
  g.query.resize(NT * Hq * W);
  if (fp8_q) g.query_fp8.resize(NT * Hq * W);
  const float qs = fp8_q ? scale_of(a.query_scale, false, 0) : 1.0f;
  for (int64_t t = 0; t < NT; ++t) {
    const bool valid = mla_token_valid(a, t);
    for (int64_t i = 0; i < Hq; ++i) {
      Gold* out = &g.query[(t * Hq + i) * W];
      const T* pe = a.query_pe + t * a.query_pe_token_stride + i * a.query_pe_head_stride;
      const T* nope = N ? a.query_nope + t * a.query_nope_token_stride + i * a.query_nope_head_stride : nullptr;
      const int64_t o = t * a.query_out_token_stride + i * a.query_out_head_stride;
      // What each element holds before the call (in place: q_nope, q_pe themselves).
      for (int64_t d = 0; d < W; ++d) {
        double before;
        if (in_place)
          before = d < N ? detail::at(nope, d) : detail::at(pe, d - N);
        else
          before = fp8_q ? detail::cache_value(a.query_out_fp8[o + d]) : detail::at(a.query_out + o, d);
        out[d] = {before, 0.0};
      }
      if (valid) {
        mla_rotate(a, pe, t, out + N);
        if (!in_place && a.write_query_nope)
          for (int64_t d = 0; d < N; ++d) out[d] = {detail::at(nope, d), 0.0};
      }
      if (!fp8_q) continue;
      uint8_t* codes = &g.query_fp8[(t * Hq + i) * W];
      for (int64_t d = 0; d < W; ++d) {
        const bool written = valid && (d >= N || a.write_query_nope);
        codes[d] =
            written ? quantize<__nv_fp8_e4m3>(detail::round_to<T>(out[d].value), qs) : fp8_bits(a.query_out_fp8[o + d]);
      }
    }
  }
  g.cache.resize(slots * (L + R));
  if constexpr (kIsFp8<C>) g.cache_fp8.resize(slots * (L + R));
  const float ks = scale_of(a.kv_scale, false, 0);
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t t = g.writer[s];
    Gold* out = &g.cache[s * (L + R)];
    const C* lat = a.caches.latent.row(s, a.page_size);
    const C* rot = a.caches.rope.row(s, a.page_size);
    if (t >= 0) {
      for (int64_t d = 0; d < L; ++d) out[d] = {detail::at(a.kv_c + t * a.kv_c_stride, d), 0.0};
      mla_rotate(a, a.k_pe + t * a.k_pe_stride, t, out + L);
    } else {
      for (int64_t d = 0; d < L + R; ++d) out[d] = {detail::cache_value(d < L ? lat[d] : rot[d - L]), 0.0};
    }
    if constexpr (kIsFp8<C>) {
      for (int64_t d = 0; d < L + R; ++d)
        g.cache_fp8[s * (L + R) + d] =
            t >= 0 ? quantize<C>(detail::round_to<T>(out[d].value), ks) : fp8_bits(d < L ? lat[d] : rot[d - L]);
    }
  }
  return g;
}

}  // namespace kvrope::reference
