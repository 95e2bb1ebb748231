// The MLA append's test case, host side (tests/gpu/test_mla_append.cu runs it on the device,
// tests/host/test_mla_check.cu checks the checker): a configuration, the buffers' sizes and strides it implies,
// its slots and positions, the reference's arguments over host copies of the buffers, and the check of every
// element of every output buffer after a call against reference::cpu_mla: a copy bit for bit (fp8: the
// reference's code), a rotated value within the tolerance of docs/spec.md §1.7 (fp8: the code of a value in T
// within it), everything the call must not write unchanged, the error flag. Also the outputs a correct call
// leaves (emulate_mla: the reference's values rounded), which the host test feeds the check.
#pragma once

#include <kvrope/mla_append_params.cuh>
#include <kvrope/reference/cpu_mla.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "verify/check_append.hpp"  // verify::detail::fp8_within_tolerance
#include "verify/tolerance.hpp"

namespace kvrope::testing {

enum class MlaQMode { kInPlace, kOut, kOutNope, kOutFp8, kOutFp8Nope };
// How tokens name slots: distinct ones; distinct with some -1 (padding); few slots named many times (with some
// positions out of range, whose tokens do not count as writers); out-of-range slots and positions.
enum class MlaSlots { kDistinct, kPadding, kRepeats, kBad };
enum class MlaLaunch { kDirect, kPdl, kGraph };

inline const char* name(MlaQMode m) {
  const char* names[] = {"in place", "out", "out + q_nope", "out fp8", "out fp8 + q_nope"};
  return names[static_cast<int>(m)];
}
inline const char* name(MlaSlots s) {
  const char* names[] = {"distinct", "padding", "repeats", "bad"};
  return names[static_cast<int>(s)];
}

struct MlaConfig {
  int64_t tokens = 33, query_heads = 16, nope_dim = 128, rotary_dim = 64, latent_dim = 512;
  RotaryStyle style = RotaryStyle::kInterleaved;
  bool split = false;  // FlashInfer's two caches, else vLLM's one
  MlaQMode qmode = MlaQMode::kInPlace;
  bool fused_q = true;  // q [T, Hq, N + R]: q_nope = q, q_pe = q + N
  bool table_f32 = true;
  bool pos64 = true;
  int64_t page_size = 16;
  MlaSlots slots = MlaSlots::kDistinct;
  int64_t offset = 0;  // elements every view starts past its buffer (1: misaligned, the scalar path)
  int64_t pad = 16;    // elements added to every row stride (and page stride)
  bool scales = true;  // fp8: query_scale and kv_scale given, else null (1)
  float scale_magnitude = 1.0f;
  MlaLaunch launch = MlaLaunch::kDirect;
  uint64_t seed = 1;

  bool q_out() const { return qmode != MlaQMode::kInPlace; }
  bool q_fp8() const { return qmode == MlaQMode::kOutFp8 || qmode == MlaQMode::kOutFp8Nope; }
  bool q_nope() const { return qmode == MlaQMode::kOutNope || qmode == MlaQMode::kOutFp8Nope; }
  std::string describe() const {
    std::ostringstream s;
    s << "T " << tokens << " Hq " << query_heads << " N " << nope_dim << " R " << rotary_dim << " L " << latent_dim
      << (style == RotaryStyle::kInterleaved ? " interleaved" : " rotate-half") << (split ? " split" : " concat")
      << " q " << name(qmode) << (fused_q ? " fused" : " separate") << (table_f32 ? " f32 table" : " T table")
      << (pos64 ? " int64" : " int32") << " P " << page_size << " slots " << name(slots) << " offset " << offset
      << " pad " << pad << (scales ? " scales" : " no scales") << " x" << scale_magnitude << " launch "
      << static_cast<int>(launch) << " seed " << seed;
    return s.str();
  }
};

// The tests' shapes (N, R, L): DeepSeek-V3 / Kimi K2 (the compiled instance), a generic one on the vector path, odd
// ones on the scalar path (L not a whole number of 16-byte chunks, R not a whole number of pairs of them); every q
// mode and slot pattern.
struct MlaShape {
  int64_t nope, rotary, latent;
};
inline constexpr MlaShape kShapes[] = {{128, 64, 512}, {64, 32, 256}, {128, 64, 511}, {24, 40, 72}};
inline constexpr MlaQMode kQModes[] = {MlaQMode::kInPlace, MlaQMode::kOut, MlaQMode::kOutNope, MlaQMode::kOutFp8,
                                       MlaQMode::kOutFp8Nope};
inline constexpr MlaSlots kSlots[] = {MlaSlots::kDistinct, MlaSlots::kPadding, MlaSlots::kRepeats, MlaSlots::kBad};

inline void set_shape(MlaConfig& c, const MlaShape& s) {
  c.nope_dim = s.nope;
  c.rotary_dim = s.rotary;
  c.latent_dim = s.latent;
}

//! Host copies of every buffer a call reads or writes (empty: the call has none).
template <typename T, typename C>
struct MlaSnapshot {
  std::vector<T> q, q_nope, q_out, kv, table;
  std::vector<float> table_f32;
  std::vector<__nv_fp8_e4m3> q_out8;
  std::vector<C> cache, ckv, kpe;
};

//! What a configuration implies: the buffers' sizes and strides (elements), the slots and positions, the scales.
template <typename Pos>
struct MlaCase {
  MlaConfig cfg;
  int64_t W = 0, num_pages = 0, max_position = 0, num_slots = 0;
  int64_t q_head = 0, q_tok = 0, nope_head = 0, nope_tok = 0, out_head = 0, out_tok = 0, kv_row = 0;
  int64_t lat_off = 0, lat_page = 0, rope_off = 0, rope_page = 0;
  // Buffer sizes (elements).
  int64_t q_size = 0, q_nope_size = 0, out_size = 0, kv_size = 0, table_size = 0;
  int64_t cache_size = 0, ckv_size = 0, kpe_size = 0;
  std::vector<Pos> pos;
  std::vector<int64_t> slots;
  float q_scale = 1.0f, kv_scale = 1.0f;
  bool has_q_scale = false, has_kv_scale = false;

  MlaCase(const MlaConfig& c, bool fp8_cache) : cfg(c) {
    const int64_t NT = c.tokens, Hq = c.query_heads, N = c.nope_dim, R = c.rotary_dim, L = c.latent_dim;
    const int64_t o = c.offset, pad = c.pad, P = c.page_size;
    W = N + R;
    max_position = 1000 + NT;
    num_pages = (2 * NT + 8 + P - 1) / P;
    num_slots = num_pages * P;
    // q: fused [T, Hq, N + R (+ pad)] or q_pe [T, Hq, R (+ pad)] and q_nope [T, Hq, N (+ pad)].
    q_head = (c.fused_q ? W : R) + pad;
    q_tok = Hq * q_head + pad;
    q_size = Hq ? o + NT * q_tok : 0;
    nope_head = c.fused_q ? q_head : N + pad;
    nope_tok = c.fused_q ? q_tok : Hq * nope_head + pad;
    q_nope_size = !c.fused_q && Hq && N ? o + NT * nope_tok : 0;
    out_head = W + pad;
    out_tok = Hq * out_head + pad;
    out_size = c.q_out() && Hq ? o + NT * out_tok : 0;
    kv_row = L + R + pad;  // kv_c and k_pe: views of one projection [T, L + R (+ pad)]
    kv_size = o + NT * kv_row;
    table_size = o + max_position * R;
    if (c.split) {
      lat_off = L + pad, lat_page = P * lat_off + pad;
      rope_off = R + pad, rope_page = P * rope_off + pad;
      ckv_size = o + num_pages * lat_page;
      kpe_size = o + num_pages * rope_page;
    } else {
      lat_off = rope_off = L + R + pad;
      lat_page = rope_page = P * lat_off + pad;
      cache_size = o + num_pages * lat_page;
    }
    has_kv_scale = fp8_cache && c.scales;
    has_q_scale = c.q_fp8() && c.scales;
    if (has_kv_scale) kv_scale = 1.25f * c.scale_magnitude;
    if (has_q_scale) q_scale = 0.75f * c.scale_magnitude;
    make_slots();
  }

  void make_slots() {
    std::mt19937_64 rng(cfg.seed * 7919 + 17);
    auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    const int64_t NT = cfg.tokens;
    pos.assign(static_cast<size_t>(NT), Pos{0});
    slots.assign(static_cast<size_t>(NT), -1);
    std::vector<int64_t> perm(static_cast<size_t>(num_slots));
    for (int64_t s = 0; s < num_slots; ++s) perm[s] = s;
    for (int64_t s = num_slots - 1; s > 0; --s) std::swap(perm[s], perm[uniform(0, s)]);
    const int64_t pool = NT / 3 + 1;
    for (int64_t t = 0; t < NT; ++t) {
      int64_t p = uniform(0, max_position - 1), s = perm[t];
      switch (cfg.slots) {
        case MlaSlots::kDistinct: break;
        case MlaSlots::kPadding:
          if (uniform(0, 3) == 0) s = -1;
          break;
        case MlaSlots::kRepeats:
          s = perm[uniform(0, pool - 1)];
          if (uniform(0, 4) == 0) p = uniform(0, 1) ? max_position : -1;
          break;
        case MlaSlots::kBad: {
          const int64_t r = uniform(0, 9);
          if (r == 0) s = num_slots + uniform(0, 100);
          if (r == 1) s = -1 - uniform(0, 5);
          if (r == 2) p = max_position + uniform(0, 1000);
          if (r == 3) p = -1 - uniform(0, 1000);
          if (r == 4) s = num_slots, p = max_position;  // both: the position's bit is required, the slot's allowed
          break;
        }
      }
      pos[static_cast<size_t>(t)] = static_cast<Pos>(p);
      slots[static_cast<size_t>(t)] = s;
    }
  }

  //! The reference's arguments over the host copies `s` taken before the call.
  template <typename T, typename C>
  reference::MlaHostArgs<T, C, Pos> host_args(const MlaSnapshot<T, C>& s) const {
    const MlaConfig& c = cfg;
    const int64_t N = c.nope_dim, R = c.rotary_dim, L = c.latent_dim, o = c.offset;
    reference::MlaHostArgs<T, C, Pos> a;
    a.tokens = c.tokens, a.query_heads = c.query_heads, a.nope_dim = N, a.rotary_dim = R, a.latent_dim = L;
    a.style = c.style;
    if (!s.q.empty()) {
      a.query_pe = s.q.data() + o + (c.fused_q ? N : 0);
      a.query_pe_token_stride = q_tok, a.query_pe_head_stride = q_head;
      a.query_nope = c.fused_q ? s.q.data() + o : s.q_nope.empty() ? nullptr : s.q_nope.data() + o;
      a.query_nope_token_stride = nope_tok, a.query_nope_head_stride = nope_head;
    }
    if (!s.q_out.empty()) a.query_out = s.q_out.data() + o;
    if (!s.q_out8.empty()) a.query_out_fp8 = s.q_out8.data() + o;
    a.query_out_token_stride = out_tok, a.query_out_head_stride = out_head;
    a.write_query_nope = c.q_nope();
    a.query_scale = has_q_scale ? &q_scale : nullptr;
    a.kv_c = s.kv.data() + o, a.kv_c_stride = kv_row;
    a.k_pe = s.kv.data() + o + L, a.k_pe_stride = kv_row;
    a.cos_sin_cache = s.table.empty() ? nullptr : s.table.data() + o;
    a.cos_sin_cache_f32 = s.table_f32.empty() ? nullptr : s.table_f32.data() + o;
    a.max_position = max_position;
    a.positions = pos.data();
    a.slot_mapping = slots.data();
    a.num_pages = num_pages, a.page_size = c.page_size;
    if (c.split)
      a.caches = {{s.ckv.data() + o, lat_page, lat_off}, {s.kpe.data() + o, rope_page, rope_off}};
    else
      a.caches = {{s.cache.data() + o, lat_page, lat_off}, {s.cache.data() + o + L, rope_page, rope_off}};
    a.kv_scale = has_kv_scale ? &kv_scale : nullptr;
    return a;
  }

  //! Where element d < L + R of slot s's row lies in its cache buffer (the latent buffer for d < L).
  int64_t cache_at(int64_t s, int64_t d) const {
    const int64_t L = cfg.latent_dim, page = s / cfg.page_size, off = s % cfg.page_size;
    if (d < L) return cfg.offset + page * lat_page + off * lat_off + d;
    return cfg.offset + page * rope_page + off * rope_off + (cfg.split ? d - L : d);
  }
  //! Where element d < W of query head i of token t lies in q_out (the in-place row: q_pe's element d - N in q).
  int64_t out_at(int64_t t, int64_t i, int64_t d) const { return cfg.offset + t * out_tok + i * out_head + d; }
  int64_t q_pe_at(int64_t t, int64_t i, int64_t e) const {
    return cfg.offset + t * q_tok + i * q_head + (cfg.fused_q ? cfg.nope_dim : 0) + e;
  }
};

//! The outcome of a check: mismatches counted and the first described, per output.
struct MlaCheckResult {
  int64_t checked = 0, bad = 0;
  std::string first;
  //! Counts one element; the first mismatch is described as `what` (a C string: millions of elements a call
  //! are checked, and a std::string an element took most of the check's time).
  void expect(bool ok, const char* what, int64_t at, double got, double want) {
    ++checked;
    if (ok || bad++ > 0) return;
    std::ostringstream s;
    s << what << " [" << at << "]: got " << got << ", expected " << want;
    first = s.str();
  }
  bool ok() const { return bad == 0; }
};

namespace mla_detail {
template <typename U>
bool same_bits(const U& a, const U& b) {
  return std::memcmp(&a, &b, sizeof(U)) == 0;
}
// Every element no written row covers is bit-identical before and after.
template <typename U>
void outside_unchanged(MlaCheckResult& r, const char* what, const std::vector<U>& before, const std::vector<U>& after,
                       const std::vector<char>& covered) {
  const std::string label = std::string(what) + " (outside the rows)";  // (once a buffer, not an element)
  for (size_t i = 0; i < before.size(); ++i)
    if (!covered[i]) r.expect(same_bits(before[i], after[i]), label.c_str(), static_cast<int64_t>(i), 0.0, 0.0);
}
}  // namespace mla_detail

//! Checks every element of every output buffer after a call (`after`, flag `flag`) against the reference
//! computed from `before`.
template <typename T, typename C, typename Pos>
MlaCheckResult check_mla(const MlaCase<Pos>& k, const MlaSnapshot<T, C>& before, const MlaSnapshot<T, C>& after,
                         int flag) {
  using mla_detail::same_bits;
  const MlaConfig& c = k.cfg;
  const reference::MlaHostArgs<T, C, Pos> in = k.host_args(before);
  const reference::MlaGold g = reference::cpu_mla(in);
  const int64_t NT = c.tokens, Hq = c.query_heads, N = c.nope_dim, R = c.rotary_dim, L = c.latent_dim, W = k.W;
  const float qs = k.q_scale;
  [[maybe_unused]] const float ks = k.kv_scale;
  MlaCheckResult r;
  if (after.q.size() != before.q.size() || after.q_out.size() != before.q_out.size() ||
      after.q_out8.size() != before.q_out8.size() || after.cache.size() != before.cache.size() ||
      after.ckv.size() != before.ckv.size() || after.kpe.size() != before.kpe.size()) {
    r.expect(false, "buffer sizes", 0, 0, 0);
    return r;
  }

  // q: each element of each row the call may write; then every element of the buffers outside them.
  std::vector<char> q_cov(after.q.size(), 0), out_cov(std::max(after.q_out.size(), after.q_out8.size()), 0);
  for (int64_t t = 0; t < NT; ++t) {
    const bool valid = reference::mla_token_valid(in, t);
    for (int64_t i = 0; i < Hq; ++i) {
      const reference::Gold* gold = &g.query[(t * Hq + i) * W];
      if (!c.q_out()) {
        // In place: q_pe's R elements; q_nope (its own buffer, or the first N of a fused row) is not written.
        for (int64_t e = 0; e < R; ++e) {
          const int64_t at = k.q_pe_at(t, i, e);
          q_cov[at] = 1;
          const T got = after.q[at];
          if (valid)
            r.expect(verify::within_tolerance<T>(got, gold[N + e].value, gold[N + e].abs_sum), "q_pe", at,
                     to_float(got), gold[N + e].value);
          else
            r.expect(same_bits(got, before.q[at]), "q_pe (invalid token)", at, to_float(got), to_float(before.q[at]));
        }
        continue;
      }
      for (int64_t d = 0; d < W; ++d) {
        const int64_t at = k.out_at(t, i, d);
        out_cov[at] = 1;
        const bool written = valid && (d >= N || c.q_nope());
        if (c.q_fp8()) {
          const uint8_t got = reference::fp8_bits(after.q_out8[at]), was = reference::fp8_bits(before.q_out8[at]);
          const double v = reference::fp8_decode(got, reference::Fp8Format::kE4M3);
          if (!written)
            r.expect(got == was, "query_out_fp8 (unwritten)", at, v, was);
          else if (d < N)  // q_nope quantized as given: the reference's code
            r.expect(got == g.query_fp8[(t * Hq + i) * W + d], "query_out_fp8 (q_nope)", at, v, gold[d].value);
          else
            r.expect(verify::detail::fp8_within_tolerance<__nv_fp8_e4m3, T>(got, gold[d], qs),
                     "query_out_fp8 (RoPE(q_pe))", at, v, gold[d].value);
        } else {
          const T got = after.q_out[at];
          if (!written)
            r.expect(same_bits(got, before.q_out[at]), "query_out (unwritten)", at, to_float(got),
                     to_float(before.q_out[at]));
          else if (d < N)  // a copy of q_nope, bit for bit
            r.expect(same_bits(got, in.query_nope[t * k.nope_tok + i * k.nope_head + d]), "query_out (q_nope)", at,
                     to_float(got), gold[d].value);
          else
            r.expect(verify::within_tolerance<T>(got, gold[d].value, gold[d].abs_sum), "query_out (RoPE(q_pe))", at,
                     to_float(got), gold[d].value);
        }
      }
    }
  }
  mla_detail::outside_unchanged(r, "q", before.q, after.q, q_cov);
  mla_detail::outside_unchanged(r, "q_nope", before.q_nope, after.q_nope, std::vector<char>(after.q_nope.size(), 0));
  mla_detail::outside_unchanged(r, "kv", before.kv, after.kv, std::vector<char>(after.kv.size(), 0));
  mla_detail::outside_unchanged(r, "query_out", before.q_out, after.q_out, out_cov);
  mla_detail::outside_unchanged(r, "query_out_fp8", before.q_out8, after.q_out8, out_cov);

  // The caches: each slot's L + R elements, from its writer or as before.
  const std::vector<C>& lat_after = c.split ? after.ckv : after.cache;
  const std::vector<C>& lat_before = c.split ? before.ckv : before.cache;
  const std::vector<C>& rope_after = c.split ? after.kpe : after.cache;
  const std::vector<C>& rope_before = c.split ? before.kpe : before.cache;
  std::vector<char> lat_cov(lat_after.size(), 0), rope_cov(rope_after.size(), 0);
  for (int64_t s = 0; s < k.num_slots; ++s) {
    const int64_t t = g.writer[s];
    for (int64_t d = 0; d < L + R; ++d) {
      const bool rot = d >= L;
      const int64_t at = k.cache_at(s, d);
      (rot ? rope_cov : lat_cov)[at] = 1;
      const C got = (rot ? rope_after : lat_after)[at], was = (rot ? rope_before : lat_before)[at];
      const reference::Gold& gold = g.cache[s * (L + R) + d];
      const double v = reference::detail::cache_value(got);
      if (t < 0) {
        r.expect(same_bits(got, was), "cache (unwritten slot)", at, v, reference::detail::cache_value(was));
      } else if constexpr (kIsFp8<C>) {
        const uint8_t code = reference::fp8_bits(got);
        if (!rot)  // kv_c quantized as given: the reference's code
          r.expect(code == g.cache_fp8[s * (L + R) + d], "latent cache (kv_c)", at, v, gold.value);
        else
          r.expect(verify::detail::fp8_within_tolerance<C, T>(code, gold, ks), "rope cache (RoPE(k_pe))", at, v,
                   gold.value);
      } else {
        if (!rot)  // a copy of kv_c, bit for bit
          r.expect(same_bits(got, in.kv_c[t * k.kv_row + d]), "latent cache (kv_c)", at, v, gold.value);
        else
          r.expect(verify::within_tolerance<T>(got, gold.value, gold.abs_sum), "rope cache (RoPE(k_pe))", at, v,
                   gold.value);
      }
    }
  }
  if (c.split) {
    mla_detail::outside_unchanged(r, "ckv", before.ckv, after.ckv, lat_cov);
    mla_detail::outside_unchanged(r, "kpe", before.kpe, after.kpe, rope_cov);
  } else {
    std::vector<char> cov(after.cache.size(), 0);
    for (size_t i = 0; i < cov.size(); ++i) cov[i] = static_cast<char>(lat_cov[i] | rope_cov[i]);
    mla_detail::outside_unchanged(r, "cache", before.cache, after.cache, cov);
  }
  const std::string flag_what = "error flag (required " + std::to_string(g.error_flag.required) + ", allowed " +
                                std::to_string(g.error_flag.allowed) + ")";
  r.expect(g.error_flag.accepts(flag), flag_what.c_str(), 0, flag, g.error_flag.required);
  return r;
}

//! What a correct call leaves: every written element the reference's value rounded to T (fp8: its code), the
//! rest as before; and the flag's required bits.
template <typename T, typename C, typename Pos>
MlaSnapshot<T, C> emulate_mla(const MlaCase<Pos>& k, const MlaSnapshot<T, C>& before, int* flag) {
  const MlaConfig& c = k.cfg;
  const reference::MlaHostArgs<T, C, Pos> in = k.host_args(before);
  const reference::MlaGold g = reference::cpu_mla(in);
  const int64_t NT = c.tokens, Hq = c.query_heads, N = c.nope_dim, R = c.rotary_dim, L = c.latent_dim, W = k.W;
  MlaSnapshot<T, C> after = before;
  auto fp8_of = [](uint8_t code) {
    __nv_fp8_e4m3 e;
    std::memcpy(&e, &code, 1);
    return e;
  };
  for (int64_t t = 0; t < NT; ++t) {
    if (!reference::mla_token_valid(in, t)) continue;
    for (int64_t i = 0; i < Hq; ++i)
      for (int64_t d = 0; d < W; ++d) {
        const double v = g.query[(t * Hq + i) * W + d].value;
        if (!c.q_out()) {
          if (d >= N) after.q[k.q_pe_at(t, i, d - N)] = reference::detail::round_to<T>(v);
        } else if (d >= N || c.q_nope()) {
          if (c.q_fp8())
            after.q_out8[k.out_at(t, i, d)] = fp8_of(g.query_fp8[(t * Hq + i) * W + d]);
          else
            after.q_out[k.out_at(t, i, d)] = reference::detail::round_to<T>(v);
        }
      }
  }
  for (int64_t s = 0; s < k.num_slots; ++s) {
    if (g.writer[s] < 0) continue;
    for (int64_t d = 0; d < L + R; ++d) {
      std::vector<C>& buf = c.split ? (d < L ? after.ckv : after.kpe) : after.cache;
      C e;
      if constexpr (kIsFp8<C>)
        std::memcpy(&e, &g.cache_fp8[s * (L + R) + d], 1);
      else
        e = reference::detail::round_to<T>(g.cache[s * (L + R) + d].value);
      buf[k.cache_at(s, d)] = e;
    }
  }
  *flag = g.error_flag.required;
  return after;
}

}  // namespace kvrope::testing
