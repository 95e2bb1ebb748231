// Host tests of the MLA append's float64 reference (docs/spec.md §6.6, kvrope/reference/cpu_mla.hpp): a case
// worked by hand, then random non-zero problems (both rotary styles, both cache layouts, T and fp8 caches, q in
// place, out, out with q_nope, out in fp8, tables in fp32 and T, fused and separate q, bad slots and positions,
// repeated slots) checked against an independent formula written pair by pair from the spec, with fp8 codes
// from CUDA's own host conversion; and a check that the comparison finds a deliberately wrong rotation.
#include <kvrope/reference/cpu_mla.hpp>

#include <cuda_fp8.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"

using namespace kvrope;
using reference::Gold;
using reference::MlaGold;
using reference::MlaHostArgs;

namespace {

enum class QMode { kInPlace, kOut, kOutNope, kOutFp8, kOutFp8Nope };

template <typename C>
C elem_of(float x) {
  if constexpr (kIsFp8<C>) {
    const uint8_t b = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    C c;
    std::memcpy(&c, &b, 1);
    return c;
  } else {
    return from_float<C>(x);
  }
}

// What CUDA's host conversion stores for a value in T under a dividing scale.
template <typename T>
uint8_t e4m3_code(double gold, float scale) {
  const T x = from_float<T>(static_cast<float>(gold));
  const volatile float q = to_float(x) / scale;
  return __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
}

// An MLA problem on host vectors, filled with random non-zero values; padded strides.
template <typename T, typename C>
struct Problem {
  int64_t NT, Hq, N, R, L, P, pages, maxpos;
  RotaryStyle style = RotaryStyle::kInterleaved;
  bool split = false, fused_q = false, t_table = false;
  QMode qmode = QMode::kOut;
  float q_scale = 0.75f, kv_scale = 1.25f;
  int64_t q_tok, q_head, nope_tok, nope_head, out_tok, out_head, kvc_stride, kpe_stride;
  std::vector<T> q, q_nope, q_out, kv_c, k_pe, table;
  std::vector<__nv_fp8_e4m3> q_out_fp8;
  std::vector<float> table_f32;
  std::vector<int64_t> pos, slots;
  std::vector<C> cache, ckv, kpe;

  Problem(int64_t nt, int64_t hq, int64_t n, int64_t r, int64_t l, int64_t p, int64_t pg, int64_t mp, uint32_t seed)
      : NT(nt), Hq(hq), N(n), R(r), L(l), P(p), pages(pg), maxpos(mp), rng(seed) {}

  std::mt19937 rng;
  float nonzero() {
    std::uniform_real_distribution<float> mag(0.25f, 2.0f);
    return (rng() & 1 ? 1.0f : -1.0f) * mag(rng);
  }
  template <typename U>
  void fill(std::vector<U>& v, size_t n) {
    v.resize(n);
    for (auto& e : v) e = elem_of<U>(nonzero());
  }

  void build() {
    // q: fused [NT, Hq, N + R + 3] (q_nope = q, q_pe = q + N), or q_pe [NT, Hq, R] and q_nope [NT, Hq, N + 1].
    q_head = fused_q ? N + R + 3 : R;
    q_tok = Hq * q_head + 2;
    fill(q, NT * q_tok);
    nope_head = fused_q ? q_head : N + 1;
    nope_tok = fused_q ? q_tok : Hq * nope_head;
    if (!fused_q) fill(q_nope, NT * nope_tok);
    out_head = N + R + 1;
    out_tok = Hq * out_head + 5;
    fill(q_out, NT * out_tok);
    fill(q_out_fp8, NT * out_tok);
    kvc_stride = L + R + 2;  // kv_c and k_pe views of one [NT, L + R + 2] projection
    fill(kv_c, NT * kvc_stride);
    kpe_stride = kvc_stride;
    table_f32.resize(maxpos * R);
    std::uniform_real_distribution<double> angle(-3.1, 3.1);
    for (int64_t row = 0; row < maxpos; ++row)
      for (int64_t c = 0; c < R / 2; ++c) {
        const double th = angle(rng);
        table_f32[row * R + c] = static_cast<float>(std::cos(th));
        table_f32[row * R + R / 2 + c] = static_cast<float>(std::sin(th));
      }
    table.resize(table_f32.size());
    for (size_t i = 0; i < table.size(); ++i) table[i] = from_float<T>(table_f32[i]);
    fill(cache, pages * P * (L + R));
    fill(ckv, pages * P * L);
    fill(kpe, pages * P * R);
    // Slots and positions: random ones in [-1, slots + 2) and [-1, maxpos], then the forced cases: no slot,
    // bad slots, a bad position, a slot repeated (the last valid token wins; an invalid one does not count).
    const int64_t S = pages * P;
    pos.resize(NT);
    slots.resize(NT);
    std::uniform_int_distribution<int64_t> rs(-1, S + 1), rp(-1, maxpos);
    for (int64_t t = 0; t < NT; ++t) {
      do slots[t] = rs(rng);
      while (slots[t] == 3 || slots[t] == 5);  // the forced tokens' slots, so that they decide them
      pos[t] = rng() % 6 == 0 ? rp(rng) : static_cast<int64_t>(rng() % maxpos);
    }
    const int64_t forced_slot[] = {-1, S, 3, 3, 5, 5, 5, S + 7, 0};
    const int64_t forced_pos[] = {1, 2, maxpos, 4, 0, maxpos - 1, -1, -1, 3};
    for (int64_t t = 0; t < 9 && t < NT; ++t) slots[t] = forced_slot[t], pos[t] = forced_pos[t];
  }

  MlaHostArgs<T, C, int64_t> args() const {
    MlaHostArgs<T, C, int64_t> a;
    a.tokens = NT, a.query_heads = Hq, a.nope_dim = N, a.rotary_dim = R, a.latent_dim = L, a.style = style;
    a.query_pe = q.data() + (fused_q ? N : 0), a.query_pe_token_stride = q_tok, a.query_pe_head_stride = q_head;
    a.query_nope = N ? (fused_q ? q.data() : q_nope.data()) : nullptr;
    a.query_nope_token_stride = nope_tok, a.query_nope_head_stride = nope_head;
    const bool fp8 = qmode == QMode::kOutFp8 || qmode == QMode::kOutFp8Nope;
    if (qmode != QMode::kInPlace) {
      if (fp8)
        a.query_out_fp8 = q_out_fp8.data();
      else
        a.query_out = q_out.data();
      a.query_out_token_stride = out_tok, a.query_out_head_stride = out_head;
      a.write_query_nope = qmode == QMode::kOutNope || qmode == QMode::kOutFp8Nope;
      a.query_scale = &q_scale;
    }
    a.kv_c = kv_c.data(), a.kv_c_stride = kvc_stride;
    a.k_pe = kv_c.data() + L, a.k_pe_stride = kpe_stride;
    a.cos_sin_cache = t_table ? table.data() : nullptr;
    a.cos_sin_cache_f32 = t_table ? nullptr : table_f32.data();
    a.max_position = maxpos, a.positions = pos.data(), a.slot_mapping = slots.data();
    a.num_pages = pages, a.page_size = P;
    a.caches = split ? reference::mla_split_caches<C>(ckv.data(), kpe.data(), P, L, R)
                     : reference::mla_concat_caches<C>(cache.data(), P, L, R);
    if constexpr (kIsFp8<C>) a.kv_scale = &kv_scale;
    return a;
  }
};

// ------------------------------------------------------------------------------------------------
// The independent formula: written pair by pair from docs/spec.md §2.4 and §6.6, not from cpu_mla.hpp.
// ------------------------------------------------------------------------------------------------

struct Expected {
  std::vector<double> query, cache;  // [NT, Hq, N + R], [S, L + R]
  std::vector<uint8_t> query_fp8, cache_fp8;
  std::vector<int64_t> writer;
  int required = 0, optional = 0;
};

// Wrongness to inject: a rotation by -theta, or the other style.
enum class Fault { kNone, kNegatedSin, kOtherStyle };

template <typename T, typename C>
void rope_pairs(const Problem<T, C>& p, const T* x, int64_t position, double* out, Fault fault) {
  const RotaryStyle style =
      fault != Fault::kOtherStyle
          ? p.style
          : (p.style == RotaryStyle::kInterleaved ? RotaryStyle::kRotateHalf : RotaryStyle::kInterleaved);
  for (int64_t k = 0; k < p.R / 2; ++k) {
    const int64_t a = style == RotaryStyle::kInterleaved ? 2 * k : k;
    const int64_t b = style == RotaryStyle::kInterleaved ? 2 * k + 1 : k + p.R / 2;
    double c, s;
    if (p.t_table)
      c = to_float(p.table[position * p.R + k]), s = to_float(p.table[position * p.R + p.R / 2 + k]);
    else
      c = p.table_f32[position * p.R + k], s = p.table_f32[position * p.R + p.R / 2 + k];
    if (fault == Fault::kNegatedSin) s = -s;
    const double xa = to_float(x[a]), xb = to_float(x[b]);
    out[a] = xa * c - xb * s;
    out[b] = xb * c + xa * s;
  }
}

template <typename T, typename C>
Expected expected(const Problem<T, C>& p, Fault fault = Fault::kNone) {
  Expected e;
  const int64_t W = p.N + p.R, S = p.pages * p.P;
  auto valid = [&](int64_t t) { return p.pos[t] >= 0 && p.pos[t] < p.maxpos; };
  const bool fp8 = p.qmode == QMode::kOutFp8 || p.qmode == QMode::kOutFp8Nope;
  const bool nope = p.qmode == QMode::kOutNope || p.qmode == QMode::kOutFp8Nope;
  e.query.assign(p.NT * p.Hq * W, 0.0);
  e.query_fp8.assign(fp8 ? p.NT * p.Hq * W : 0, 0);
  for (int64_t t = 0; t < p.NT; ++t)
    for (int64_t i = 0; i < p.Hq; ++i) {
      double* row = &e.query[(t * p.Hq + i) * W];
      const T* pe = p.q.data() + t * p.q_tok + i * p.q_head + (p.fused_q ? p.N : 0);
      const T* qn = (p.fused_q ? p.q.data() : p.q_nope.data()) + t * p.nope_tok + i * p.nope_head;
      const int64_t o = t * p.out_tok + i * p.out_head;
      for (int64_t d = 0; d < W; ++d) {
        if (p.qmode == QMode::kInPlace)
          row[d] = d < p.N ? to_float(qn[d]) : to_float(pe[d - p.N]);
        else
          row[d] = fp8 ? double(float(p.q_out_fp8[o + d])) : double(to_float(p.q_out[o + d]));
        if (fp8) {
          uint8_t b;
          std::memcpy(&b, &p.q_out_fp8[o + d], 1);
          e.query_fp8[(t * p.Hq + i) * W + d] = b;
        }
      }
      if (!valid(t)) continue;
      rope_pairs(p, pe, p.pos[t], row + p.N, fault);
      if (nope)
        for (int64_t d = 0; d < p.N; ++d) row[d] = to_float(qn[d]);
      if (fp8)
        for (int64_t d = nope ? 0 : p.N; d < W; ++d)
          e.query_fp8[(t * p.Hq + i) * W + d] = e4m3_code<T>(row[d], p.q_scale);
    }
  // Slots: the last valid token naming a slot, found scanning backwards.
  e.writer.assign(S, -1);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = p.NT - 1; t >= 0; --t)
      if (p.slots[t] == s && valid(t)) {
        e.writer[s] = t;
        break;
      }
  for (int64_t t = 0; t < p.NT; ++t) {
    if (!valid(t)) e.required |= kErrorPositionIdOutOfRange;
    if (p.slots[t] >= S) (valid(t) ? e.required : e.optional) |= kErrorSlotOutOfRange;
  }
  e.cache.assign(S * (p.L + p.R), 0.0);
  e.cache_fp8.assign(kIsFp8<C> ? S * (p.L + p.R) : 0, 0);
  for (int64_t s = 0; s < S; ++s) {
    double* row = &e.cache[s * (p.L + p.R)];
    const int64_t t = e.writer[s];
    const int64_t page = s / p.P, off = s % p.P;
    for (int64_t d = 0; d < p.L + p.R; ++d) {
      const C& old = p.split
                         ? (d < p.L ? p.ckv[(page * p.P + off) * p.L + d] : p.kpe[(page * p.P + off) * p.R + d - p.L])
                         : p.cache[(page * p.P + off) * (p.L + p.R) + d];
      if constexpr (kIsFp8<C>) {
        row[d] = double(float(old));
        std::memcpy(&e.cache_fp8[s * (p.L + p.R) + d], &old, 1);
      } else {
        row[d] = to_float(old);
      }
    }
    if (t < 0) continue;
    for (int64_t d = 0; d < p.L; ++d) row[d] = to_float(p.kv_c[t * p.kvc_stride + d]);
    rope_pairs(p, p.kv_c.data() + t * p.kvc_stride + p.L, p.pos[t], row + p.L, fault);
    if constexpr (kIsFp8<C>)
      for (int64_t d = 0; d < p.L + p.R; ++d) e.cache_fp8[s * (p.L + p.R) + d] = e4m3_code<T>(row[d], p.kv_scale);
  }
  return e;
}

// The number of outputs of the reference that differ from the formula's (values to 1e-12 of their
// sum of |products|, codes exactly), plus one if the writers or the flag's bits differ.
int mismatches(const MlaGold& g, const Expected& e) {
  int bad = 0;
  auto close = [](const Gold& x, double want) {
    return std::fabs(x.value - want) <= 1e-12 * (x.abs_sum + std::fabs(want)) + 1e-300;
  };
  if (g.query.size() != e.query.size() || g.cache.size() != e.cache.size()) return 1 << 20;
  for (size_t i = 0; i < e.query.size(); ++i) bad += !close(g.query[i], e.query[i]);
  for (size_t i = 0; i < e.cache.size(); ++i) bad += !close(g.cache[i], e.cache[i]);
  bad += g.query_fp8 != e.query_fp8;
  bad += g.cache_fp8 != e.cache_fp8;
  bad += g.writer != e.writer;
  bad += g.error_flag.required != e.required || g.error_flag.allowed != (e.required | e.optional);
  return bad;
}

const char* mode_name(QMode m) {
  switch (m) {
    case QMode::kInPlace: return "in place";
    case QMode::kOut: return "out";
    case QMode::kOutNope: return "out + nope";
    case QMode::kOutFp8: return "out fp8";
    default: return "out fp8 + nope";
  }
}

template <typename T, typename C>
void check_all(int64_t NT, int64_t Hq, int64_t N, int64_t R, int64_t L, int64_t P, int64_t pages, int64_t maxpos) {
  uint32_t seed = 1;
  for (RotaryStyle style : {RotaryStyle::kInterleaved, RotaryStyle::kRotateHalf})
    for (bool split : {false, true})
      for (QMode m : {QMode::kInPlace, QMode::kOut, QMode::kOutNope, QMode::kOutFp8, QMode::kOutFp8Nope}) {
        Problem<T, C> p(NT, Hq, N, R, L, P, pages, maxpos, seed++);
        p.style = style, p.split = split, p.qmode = m;
        p.fused_q = seed % 2 == 0, p.t_table = seed % 3 == 0;
        p.build();
        INFO("style " << int(style) << ", split " << split << ", q " << mode_name(m) << ", fused q " << p.fused_q
                      << ", T table " << p.t_table << ", seed " << seed);
        const MlaGold g = reference::cpu_mla(p.args());
        const Expected e = expected(p);
        CHECK(mismatches(g, e) == 0);
        // The problem exercises what it should: a repeated slot, a bad position, a bad slot.
        CHECK(e.writer[5] == 5);
        CHECK(e.writer[3] != 2);
        CHECK((e.required & kErrorPositionIdOutOfRange) != 0);
        CHECK((e.required & kErrorSlotOutOfRange) != 0);
      }
}

}  // namespace

TEST_CASE("MLA reference: a case worked by hand, both layouts", "[mla]") {
  // R = 2, L = 2, N = 1, one head; position 1 rotates by 90 degrees (cos 0, sin 1): (a, b) -> (-b, a).
  const float table[] = {1.0f, 0.0f, 0.0f, 1.0f};  // row 0: cos 1, sin 0; row 1: cos 0, sin 1
  const float q[] = {7.0f, 1.0f, 2.0f};            // fused [q_nope | q_pe]
  const float kv[] = {3.0f, 4.0f, 5.0f, 6.0f};     // [kv_c | k_pe]
  std::vector<float> q_out(3, -1.0f), cache(2 * 4, -9.0f), ckv(2 * 2, -8.0f), kpe(2 * 2, -7.0f);
  const int64_t pos[] = {1}, slot[] = {1};
  for (bool split : {false, true}) {
    MlaHostArgs<float, float, int64_t> a;
    a.tokens = 1, a.query_heads = 1, a.nope_dim = 1, a.rotary_dim = 2, a.latent_dim = 2;
    a.query_pe = q + 1, a.query_pe_token_stride = 3, a.query_pe_head_stride = 3;
    a.query_nope = q, a.query_nope_token_stride = 3, a.query_nope_head_stride = 3;
    a.query_out = q_out.data(), a.query_out_token_stride = 3, a.query_out_head_stride = 3;
    a.write_query_nope = true;
    a.kv_c = kv, a.kv_c_stride = 4, a.k_pe = kv + 2, a.k_pe_stride = 4;
    a.cos_sin_cache_f32 = table, a.max_position = 2, a.positions = pos, a.slot_mapping = slot;
    a.num_pages = 1, a.page_size = 2;
    a.caches = split ? reference::mla_split_caches<float>(ckv.data(), kpe.data(), 2, 2, 2)
                     : reference::mla_concat_caches<float>(cache.data(), 2, 2, 2);
    const MlaGold g = reference::cpu_mla(a);
    REQUIRE(g.query.size() == 3);
    CHECK(g.query[0].value == 7.0);
    CHECK(g.query[1].value == -2.0);
    CHECK(g.query[2].value == 1.0);
    CHECK(g.query[1].abs_sum == 2.0);
    REQUIRE(g.cache.size() == 8);
    const double slot0 = split ? -8.0 : -9.0;
    CHECK(g.cache[0].value == slot0);
    CHECK(g.cache[2].value == (split ? -7.0 : -9.0));
    CHECK(g.cache[4].value == 3.0);
    CHECK(g.cache[5].value == 4.0);
    CHECK(g.cache[6].value == -6.0);
    CHECK(g.cache[7].value == 5.0);
    CHECK(g.writer == std::vector<int64_t>{-1, 0});
    CHECK(g.error_flag.required == 0);
    CHECK(g.error_flag.allowed == 0);
  }
}

TEST_CASE("MLA reference matches the pair-by-pair formula: DeepSeek-V3 sizes (L 512, R 64, N 128), bf16", "[mla]") {
  check_all<__nv_bfloat16, __nv_bfloat16>(12, 3, 128, 64, 512, 4, 3, 16);
  check_all<__nv_bfloat16, __nv_fp8_e4m3>(12, 3, 128, 64, 512, 4, 3, 16);
}

TEST_CASE("MLA reference matches the pair-by-pair formula: small generic sizes, fp16 and fp32", "[mla]") {
  check_all<__half, __half>(14, 2, 3, 6, 10, 3, 4, 9);
  check_all<__half, __nv_fp8_e4m3>(14, 2, 3, 6, 10, 3, 4, 9);
  check_all<float, float>(14, 5, 0, 4, 8, 2, 6, 7);  // N = 0: no q_nope
  check_all<float, __nv_fp8_e4m3>(14, 1, 2, 2, 4, 4, 3, 5);
}

TEST_CASE("MLA reference: the comparison finds a wrong rotation", "[mla]") {
  for (RotaryStyle style : {RotaryStyle::kInterleaved, RotaryStyle::kRotateHalf}) {
    Problem<__nv_bfloat16, __nv_fp8_e4m3> p(12, 2, 4, 8, 16, 4, 3, 10, 77);
    p.style = style, p.qmode = QMode::kOutFp8Nope;
    p.build();
    const MlaGold g = reference::cpu_mla(p.args());
    CHECK(mismatches(g, expected(p)) == 0);
    CHECK(mismatches(g, expected(p, Fault::kNegatedSin)) > 0);
    CHECK(mismatches(g, expected(p, Fault::kOtherStyle)) > 0);
  }
  // And the formula finds a reference given wrong inputs: the other style's gold is not this one's.
  Problem<float, float> p(10, 2, 2, 4, 6, 2, 5, 8, 5);
  p.build();
  const Expected e = expected(p);
  p.style = RotaryStyle::kRotateHalf;
  CHECK(mismatches(reference::cpu_mla(p.args()), e) > 0);
}
