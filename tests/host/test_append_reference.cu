// Host tests of the append op's float64 reference (docs/spec.md §6) on cases worked by hand: each option
// (styles, partial rotary, the norms, the slots' rules, fp8 caches), the fp8 encoder against CUDA's own
// host conversion, the checker of verify/ (right outputs pass, one wrong element is found and named), and
// validate() for the append (each rejected argument names its field). No GPU needed.
#include <kvrope/append.cuh>
#include <kvrope/reference/cpu_append.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fp8_cases.hpp"
#include "verify/check_append.hpp"

using namespace kvrope;
using reference::fp8_decode;
using reference::fp8_encode;
using reference::Fp8Format;

namespace {

template <typename C>
C cache_elem(double x) {
  if constexpr (kIsFp8<C>) {
    const uint8_t b = fp8_encode(static_cast<float>(x), reference::fp8_format_of<C>());
    C c;
    std::memcpy(&c, &b, 1);
    return c;
  } else {
    return from_float<C>(static_cast<float>(x));
  }
}

// An append problem on host vectors: q [N, Hq, D], k, v [N, H, D] contiguous, caches [pages, P, H, D]
// (NHD) or [pages, H, P, D] (HND), a table cache [max_position, R] in fp32 (or in T with t_table) that is
// the identity unless set.
template <typename T, typename C = T, typename Pos = int64_t>
struct Host {
  int64_t N, H, Hq, D, R, P, pages, max_position;
  RotaryStyle style = RotaryStyle::kRotateHalf;
  bool hnd = false, t_table = false, with_q_out = false, with_k_out = true, key_in_place = false;
  bool plus_one = false, per_head = false;
  float eps = 1e-6f;
  std::vector<T> q, q_out, k, k_out, v, table, q_weight, k_weight;
  std::vector<float> table_f32, k_scale, v_scale;
  std::vector<Pos> pos;
  std::vector<int64_t> slots;
  std::vector<C> kc, vc;

  Host(int64_t n, int64_t h, int64_t hq, int64_t d, int64_t r, int64_t p, int64_t pg, int64_t maxpos)
      : N(n), H(h), Hq(hq), D(d), R(r), P(p), pages(pg), max_position(maxpos) {
    const T zero = from_float<T>(0.0f);
    q.assign(N * Hq * D, zero);
    q_out = q;
    k.assign(N * H * D, zero);
    k_out = v = k;
    kc.assign(pages * P * H * D, cache_elem<C>(-9.0));
    vc.assign(pages * P * H * D, cache_elem<C>(-8.0));
    table_f32.assign(max_position * R, 0.0f);
    for (int64_t row = 0; row < max_position; ++row)
      for (int64_t c = 0; c < R / 2; ++c) table_f32[row * R + c] = 1.0f;  // cos 1, sin 0
    pos.assign(N, 0);
    slots.assign(N, -1);
  }
  // Row `row` of the table: cos, then sin, one a pair.
  void set_angle(int64_t row, std::vector<float> cos, std::vector<float> sin) {
    for (int64_t c = 0; c < R / 2; ++c) table_f32[row * R + c] = cos[c], table_f32[row * R + R / 2 + c] = sin[c];
  }

  template <typename U>
  PagedCache<U> cache_view(U* data) const {
    return hnd ? hnd_pages(data, P, H, D) : nhd_pages(data, P, H, D);
  }

  AppendParams<T, C, Pos> params() {
    AppendParams<T, C, Pos> p;
    p.tokens = N, p.heads = H, p.query_heads = Hq, p.head_dim = D;
    p.rotary_dim = R == D ? 0 : R;
    p.style = style;
    p.query = thd(q.data(), Hq, D);
    if (with_q_out) p.query_out = thd(q_out.data(), Hq, D);
    p.key = thd(k.data(), H, D);
    if (with_k_out) p.key_out = thd(k_out.data(), H, D);
    p.key_in_place = key_in_place;
    p.value = thd<const T>(v.data(), H, D);
    p.positions = pos.data();
    if (t_table) {
      table.clear();
      for (float x : table_f32) table.push_back(from_float<T>(x));
      p.cos_sin_cache = table.data();
    } else {
      p.cos_sin_cache_f32 = table_f32.data();
    }
    p.max_position = max_position;
    p.query_norm_weight = q_weight.empty() ? nullptr : q_weight.data();
    p.key_norm_weight = k_weight.empty() ? nullptr : k_weight.data();
    p.norm_eps = eps;
    p.norm_weight_plus_one = plus_one;
    p.key_cache = cache_view(kc.data());
    p.value_cache = cache_view(vc.data());
    p.page_size = P;
    p.num_pages = pages;
    p.slot_mapping = slots.data();
    p.key_scale = k_scale.empty() ? nullptr : k_scale.data();
    p.value_scale = v_scale.empty() ? nullptr : v_scale.data();
    p.scale_per_head = per_head;
    return p;
  }
};

template <typename T>
std::vector<T> floats(std::initializer_list<double> xs) {
  std::vector<T> out;
  for (double x : xs) out.push_back(from_float<T>(static_cast<float>(x)));
  return out;
}

std::vector<double> values(const std::vector<reference::Gold>& g, size_t begin, size_t count) {
  std::vector<double> out;
  for (size_t i = begin; i < begin + count; ++i) out.push_back(g[i].value);
  return out;
}
std::vector<double> values(const std::vector<double>& g, size_t begin, size_t count) {
  return std::vector<double>(g.begin() + begin, g.begin() + begin + count);
}

// The next representable T above x.
template <typename T>
T next_up(T x) {
  return verify::detail::next_value(x, true);
}

// x = [1, ..., 8]; row 1 of the table: cos [.5, -1], sin [.75, .25] (R = 4, one angle a pair).
//   rotate-half, pairs (0, 2) angle 0, (1, 3) angle 1:      interleaved, pairs (0, 1) angle 0, (2, 3) angle 1:
//   out0 = 1*.5 - 3*.75 = -1.75,  out2 = 3*.5 + 1*.75 = 2.25   out0 = 1*.5 - 2*.75 = -1,  out1 = 2*.5 + 1*.75 = 1.75
//   out1 = 2*(-1) - 4*.25 = -3,   out3 = 4*(-1) + 2*.25 = -3.5 out2 = 3*(-1) - 4*.25 = -4, out3 = -4 + 3*.25 = -3.25
const std::vector<double> kRotateHalf{-1.75, -3, 2.25, -3.5, 5, 6, 7, 8};
const std::vector<double> kInterleaved{-1, 1.75, -4, -3.25, 5, 6, 7, 8};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The fp8 encoder.
// ---------------------------------------------------------------------------------------------------

TEST_CASE("fp8_encode on values worked by hand: RNE, ties, subnormals, saturation, NaN, signed zero",
          "[host][reference][append][fp8]") {
  struct Case {
    float x;
    uint8_t e4m3, e5m2;
  };
  const Case cases[] = {
      {1.0f, 0x38, 0x3C},
      {-1.0f, 0xB8, 0xBC},
      {0.5f, 0x30, 0x38},
      {1.5f, 0x3C, 0x3E},
      {1.0625f, 0x38, 0x3C},              // e4m3: the tie between 1 and 1.125 goes to 1 (even)
      {1.1875f, 0x3A, 0x3D},              // e4m3: the tie between 1.125 and 1.25 goes to 1.25 (even); e5m2: 1.25
      {1.125f, 0x39, 0x3C},               // e5m2: the tie between 1 and 1.25 goes to 1
      {1.375f, 0x3B, 0x3E},               // e5m2: the tie between 1.25 and 1.5 goes to 1.5
      {448.0f, 0x7E, 0x5F},               // e4m3's largest finite value; e5m2: 448 = 1.75 * 2^8
      {464.0f, 0x7E, 0x5F},               // halfway to 480 (not a value of e4m3): satfinite
      {1.0e6f, 0x7E, 0x7B},               // beyond both: the largest finite values
      {-1.0e6f, 0xFE, 0xFB},              //
      {57344.0f, 0x7E, 0x7B},             // e5m2's largest finite value
      {61440.0f, 0x7E, 0x7B},             // e5m2: halfway to 2^16 (Inf): satfinite
      {HUGE_VALF, 0x7E, 0x7B},            // infinity saturates too
      {-HUGE_VALF, 0xFE, 0xFB},           //
      {0.015625f, 0x08, 0x24},            // 2^-6: e4m3's smallest normal
      {0.013671875f, 0x07, 0x23},         // 7 * 2^-9: e4m3's largest subnormal; e5m2: 1.75 * 2^-7
      {0.001953125f, 0x01, 0x18},         // 2^-9: e4m3's smallest subnormal
      {0.0009765625f, 0x00, 0x14},        // 2^-10: e4m3 tie between 0 and 2^-9 -> 0 (even)
      {0.00146484375f, 0x01, 0x16},       // 1.5 * 2^-10 -> 2^-9
      {0.0029296875f, 0x02, 0x1A},        // 1.5 * 2^-9: tie between 1 and 2 (x 2^-9) -> 2 (even)
      {1.52587890625e-05f, 0x00, 0x01},   // 2^-16: e5m2's smallest subnormal
      {7.62939453125e-06f, 0x00, 0x00},   // 2^-17: e5m2 tie -> 0
      {-7.62939453125e-06f, 0x80, 0x80},  // a negative underflow keeps its sign
      {0.0f, 0x00, 0x00},
      {-0.0f, 0x80, 0x80},
      {std::nanf(""), 0x7F, 0x7F},
      {-std::nanf(""), 0x7F, 0x7F},
  };
  for (const Case& c : cases) {
    INFO("x = " << c.x);
    CHECK(int(fp8_encode(c.x, Fp8Format::kE4M3)) == int(c.e4m3));
    CHECK(int(fp8_encode(c.x, Fp8Format::kE5M2)) == int(c.e5m2));
  }
  CHECK(fp8_decode(0x7E, Fp8Format::kE4M3) == 448.0);
  CHECK(std::isnan(fp8_decode(0x7F, Fp8Format::kE4M3)));
  CHECK(std::isnan(fp8_decode(0xFF, Fp8Format::kE4M3)));  // the 0xFF poison is NaN in both formats
  CHECK(std::isnan(fp8_decode(0xFF, Fp8Format::kE5M2)));
  CHECK(fp8_decode(0x7B, Fp8Format::kE5M2) == 57344.0);
  CHECK(fp8_decode(0x7C, Fp8Format::kE5M2) == HUGE_VAL);
  CHECK(fp8_decode(0x01, Fp8Format::kE4M3) == std::ldexp(1.0, -9));
  CHECK(fp8_decode(0x83, Fp8Format::kE5M2) == -3 * std::ldexp(1.0, -16));
}

TEST_CASE("fp8_decode and fp8_encode are inverse on every finite code", "[host][reference][append][fp8]") {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
    for (int code = 0; code < 256; ++code) {
      const double v = fp8_decode(static_cast<uint8_t>(code), f);
      if (!std::isfinite(v)) continue;
      INFO("format " << int(f) << " code " << code);
      CHECK(int(fp8_encode(static_cast<float>(v), f)) == code);
    }
}

TEST_CASE("fp8_encode matches CUDA's host __nv_cvt_float_to_fp8 (satfinite) on a dense sample of fp32",
          "[host][reference][append][fp8]") {
  std::vector<float> xs;
  auto from_bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  // Every fp32 with an exponent from 2^-30 (below both formats' subnormals) to 2^20 (beyond both maxima),
  // its top 12 mantissa bits in every pattern and the low 11 bits 0 (exact ties and values of both formats
  // fall there), 1, or all ones (just above and just below them).
  for (uint32_t exponent = 127 - 30; exponent <= 127 + 20; ++exponent)
    for (uint32_t top = 0; top < 4096; ++top)
      for (uint32_t low : {0u, 1u, 2u, 0x3FFu, 0x400u, 0x7FEu, 0x7FFu})
        for (uint32_t sign : {0u, 1u}) xs.push_back(from_bits(sign << 31 | exponent << 23 | top << 11 | low));
  // The midpoints of consecutive codes of both formats and their fp32 neighbours.
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
    for (int code = 0; code < 127; ++code) {
      const double a = fp8_decode(static_cast<uint8_t>(code), f), b = fp8_decode(static_cast<uint8_t>(code + 1), f);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const float mid = static_cast<float>((a + b) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, HUGE_VALF)})
        xs.push_back(x), xs.push_back(-x);
    }
  // fp32's own extremes: subnormals, the largest finite, infinities.
  for (uint32_t b : {0x00000001u, 0x00000002u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0x7F800000u, 0x00000000u})
    xs.push_back(from_bits(b)), xs.push_back(from_bits(b | 0x80000000u));
  // And random fp32 bit patterns over the whole range.
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(static_cast<uint32_t>(rng()));
    if (!std::isnan(x)) xs.push_back(x);
  }
  int64_t bad_e4m3 = 0, bad_e5m2 = 0;
  float first_e4m3 = 0, first_e5m2 = 0;
  for (float x : xs) {
    const uint8_t want4 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    const uint8_t want5 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    if (fp8_encode(x, Fp8Format::kE4M3) != want4 && bad_e4m3++ == 0) first_e4m3 = x;
    if (fp8_encode(x, Fp8Format::kE5M2) != want5 && bad_e5m2++ == 0) first_e5m2 = x;
  }
  INFO(xs.size() << " inputs; first e4m3 mismatch at " << first_e4m3 << ", first e5m2 mismatch at " << first_e5m2);
  CHECK(xs.size() > 2000000);
  CHECK(bad_e4m3 == 0);
  CHECK(bad_e5m2 == 0);
}

TEST_CASE("quantize divides in fp32 (one rounding), then encodes", "[host][reference][append][fp8]") {
  // Over every positive bf16 value in [2^-31, 2^17) and a scale that is not a power of two, quantize is the
  // fp32 quotient encoded. The float64 quotient encoded differs for some inputs (16 of them at this scale):
  // the spec's rounding is observable, and the reference must not use the float64 one.
  const float scale = 0.7f;
  int64_t differs = 0, wrong = 0;
  for (uint32_t b = 0x3000; b < 0x4800; ++b) {
    __nv_bfloat16_raw raw;
    raw.x = static_cast<unsigned short>(b);
    const __nv_bfloat16 x(raw);
    const float f32 = to_float(x) / scale;
    const uint8_t q = reference::quantize<__nv_fp8_e4m3>(x, scale);
    wrong += q != fp8_encode(f32, Fp8Format::kE4M3);
    const double f64 = static_cast<double>(to_float(x)) / static_cast<double>(scale);
    const uint8_t direct = __nv_cvt_double_to_fp8(f64, __NV_SATFINITE, __NV_E4M3);
    differs += direct != q;
  }
  CHECK(reference::quantize<__nv_fp8_e5m2>(from_float<float>(-3.0f), 2.0f) == fp8_encode(-1.5f, Fp8Format::kE5M2));
  CHECK(reference::scale_of(nullptr, false, 3) == 1.0f);
  const float per_head[] = {0.5f, 2.0f};
  CHECK(reference::scale_of(per_head, true, 1) == 2.0f);
  CHECK(reference::scale_of(per_head, false, 1) == 0.5f);
  CHECK(wrong == 0);
  CHECK(differs > 0);
}

TEST_CASE("the GPU's fp8 quotient, an fp64 product by 1 / scale, rounds as fp32's division does",
          "[host][reference][append][fp8]") {
  // detail::scaled_quotient (append/formats.cuh): float(x) * inverse in fp64, rounded to fp32, with inverse
  // within 2 units of fp64 of 1 / scale (the GPU's reciprocal is an estimate refined by Newton steps). Equal to
  // the fp32 quotient bit for bit wherever that is at least fp32's least normal; below it (2^-130 / 2^20 is a
  // tie that rounds to 0, the product past it to 2^-149), the fp8 codes agree (zero).
  // Every bf16 and fp16 value and random fp32 ones (exponents over 2^-30 .. 2^30), under 48 scales.
  const std::vector<float> scales = testing::fp8_store_scales(48, 54);
  std::vector<float> xs = testing::fp8_store_values(1 << 14, 55);
  for (const __nv_bfloat16 x : testing::every_16bit_value<__nv_bfloat16>()) xs.push_back(to_float(x));
  for (const __half x : testing::every_16bit_value<__half>()) xs.push_back(to_float(x));
  int64_t compared = 0, wrong = 0;
  for (const float scale : scales) {
    const double exact = 1.0 / static_cast<double>(scale);
    double inverses[5] = {exact, std::nextafter(exact, 0.0), std::nextafter(exact, 2 * exact), 0, 0};
    inverses[3] = std::nextafter(inverses[1], 0.0);
    inverses[4] = std::nextafter(inverses[2], 2 * exact);
    for (const float x : xs) {
      if (std::isnan(x)) continue;
      const volatile float q = x / scale;  // (volatile: one fp32 rounding, whatever the host flags)
      for (const double inverse : inverses) {
        const float p = detail::scaled_quotient(x, inverse);
        const bool same = std::fabs(q) < FLT_MIN  // (subnormal, or zero from a subnormal quotient)
                              ? fp8_encode(p, Fp8Format::kE4M3) == fp8_encode(q, Fp8Format::kE4M3) &&
                                    fp8_encode(p, Fp8Format::kE5M2) == fp8_encode(q, Fp8Format::kE5M2)
                              : std::memcmp(&p, const_cast<const float*>(&q), sizeof(float)) == 0;
        if (!same && ++wrong <= 4) UNSCOPED_INFO("x " << x << " scale " << scale << ": " << p << " against " << q);
        ++compared;
      }
    }
  }
  INFO(compared << " quotients compared");
  CHECK(wrong == 0);
}

// ---------------------------------------------------------------------------------------------------
// cpu_append.
// ---------------------------------------------------------------------------------------------------

TEST_CASE("cpu_append on cases worked by hand: both styles, partial rotary, table cache in fp32 and T",
          "[host][reference][append]") {
  for (RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
    for (bool t_table : {false, true})
      for (bool q_out : {false, true}) {
        INFO("style " << int(style) << (t_table ? ", T table" : ", fp32 table") << (q_out ? ", query_out" : ""));
        // N = 1, H = 1, Hq = 2 (q = 2 k and 3 k), D = 8, R = 4, P = 2, 2 pages; position 1, slot 3 (page 1,
        // offset 1).
        Host<float> h(1, 1, 2, 8, 4, 2, 2, 3);
        h.style = style;
        h.t_table = t_table;
        h.with_q_out = q_out;
        for (int64_t d = 0; d < 8; ++d) {
          h.k[d] = static_cast<float>(d + 1);
          h.v[d] = static_cast<float>(100 + d);
          h.q[d] = 2 * h.k[d];
          h.q[8 + d] = 3 * h.k[d];
        }
        h.q_out.assign(16, -5.0f);
        h.k_out.assign(8, -6.0f);
        h.set_angle(1, {0.5f, -1.0f}, {0.75f, 0.25f});
        h.pos = {1};
        h.slots = {3};
        const reference::AppendGold g = reference::cpu_append(h.params());
        const std::vector<double>& want = style == RotaryStyle::kRotateHalf ? kRotateHalf : kInterleaved;
        std::vector<double> twice, thrice, v_row;
        for (int64_t d = 0; d < 8; ++d) twice.push_back(2 * want[d]), thrice.push_back(3 * want[d]);
        for (int64_t d = 0; d < 8; ++d) v_row.push_back(100.0 + d);
        CHECK(values(g.query, 0, 8) == twice);
        CHECK(values(g.query, 8, 8) == thrice);
        CHECK(values(g.key, 0, 8) == want);
        CHECK(g.writer == std::vector<int64_t>{-1, -1, -1, 0});  // slot 3 holds token 0
        CHECK(values(g.key_cache, 3 * 8, 8) == want);
        CHECK(values(g.value_cache, 3 * 8, 8) == v_row);
        for (int64_t s = 0; s < 3; ++s) {
          CHECK(values(g.key_cache, s * 8, 8) == std::vector<double>(8, -9.0));
          CHECK(values(g.value_cache, s * 8, 8) == std::vector<double>(8, -8.0));
        }
        // A: element 0 (rotate-half) is 1 * .5 - 3 * .75; (interleaved) 1 * .5 - 2 * .75. Copies: 0.
        CHECK(g.key[0].abs_sum == (style == RotaryStyle::kRotateHalf ? 0.5 + 2.25 : 0.5 + 1.5));
        CHECK(g.key[5].abs_sum == 0.0);
        CHECK(g.key_cache[0].abs_sum == 0.0);
        CHECK(g.error_flag.required == 0);
        CHECK(g.error_flag.allowed == 0);
        CHECK(g.key_fp8.empty());
      }
}

TEST_CASE("cpu_append: the RMSNorm of q, of k or both, with w or 1 + w, over all D elements",
          "[host][reference][append][norm]") {
  // D = 6, R = 4 (elements 4, 5 pass through, normed). x = 2 [1, -1, 1, -1, 1, -1]: mean(x^2) = 4.
  // eps = 0: x / 2 = [1, -1, 1, -1, 1, -1]; w = [1, 2, 3, 4, 5, 6]: y = [1, -2, 3, -4, 5, -6];
  // 1 + w: y = [2, -3, 4, -5, 6, -7]. Row 1 rotates by a quarter turn (cos 0, sin 1): rotate-half pairs
  // (0, 2), (1, 3): out = [-y2, -y3, y0, y1, y4, y5].
  for (bool plus_one : {false, true})
    for (int which = 1; which <= 3; ++which) {  // 1: q, 2: k, 3: both
      INFO((plus_one ? "1 + w" : "w") << ", norm of " << (which == 1 ? "q" : which == 2 ? "k" : "q and k"));
      Host<float> h(1, 1, 1, 6, 4, 1, 1, 2);
      h.eps = 0.0f;
      h.plus_one = plus_one;
      h.k = {2, -2, 2, -2, 2, -2};
      h.q = h.k;
      h.v = {1, 1, 1, 1, 1, 1};
      std::vector<float> w{1, 2, 3, 4, 5, 6};
      if (which & 1) h.q_weight = w;
      if (which & 2) h.k_weight = w;
      h.set_angle(1, {0, 0}, {1, 1});
      h.pos = {1};
      h.slots = {0};
      const reference::AppendGold g = reference::cpu_append(h.params());
      const std::vector<double> normed =
          plus_one ? std::vector<double>{-4, 5, 2, -3, 6, -7} : std::vector<double>{-3, 4, 1, -2, 5, -6};
      const std::vector<double> plain{-2, 2, 2, -2, 2, -2};
      CHECK(values(g.query, 0, 6) == ((which & 1) ? normed : plain));
      CHECK(values(g.key, 0, 6) == ((which & 2) ? normed : plain));
      CHECK(values(g.key_cache, 0, 6) == ((which & 2) ? normed : plain));
      CHECK(values(g.value_cache, 0, 6) == std::vector<double>(6, 1.0));  // v is never normed
      // A of a normed output: the rotation's |products| of the normed values, widened by 2 + D / 16.
      const double widen = reference::norm_abs_sum_factor(6);
      CHECK(widen == 2.0 + 6.0 / 16.0);
      if (which & 2) {
        CHECK(g.key[0].abs_sum == std::fabs(normed[0]) * widen);  // |y0 cos| + |y2 sin| = |y2| = |out0|
        CHECK(g.key[4].abs_sum == std::fabs(normed[4]) * widen);  // a normed pass-through element
      } else {
        CHECK(g.key[4].abs_sum == 0.0);  // a plain copy
      }
    }
  // eps counts: x = [1, 1, 1, 1], eps = 3: x / sqrt(1 + 3) = 1/2 (identity rotation, w = 1).
  Host<float> h(1, 1, 0, 4, 4, 1, 1, 1);
  h.eps = 3.0f;
  h.k = {1, 1, 1, 1};
  h.k_weight = {1, 1, 1, 1};
  h.slots = {0};
  CHECK(values(reference::cpu_append(h.params()).key, 0, 4) == std::vector<double>(4, 0.5));
}

TEST_CASE("cpu_append: slots: last writer wins, negative slots write no row, out-of-range slots set bit 4",
          "[host][reference][append]") {
  // P = 2, 3 pages (slots 0..5), D = R = 2, identity table, H = 1, Hq = 1. Tokens:
  //   0: slot 4          1: slot -1 (padding)   2: slot 4 (again: wins over token 0)
  //   3: slot 6 (out of range)   4: slot 1, position out of range   5: slot 1   6: slot 0, bad position
  Host<float> h(7, 1, 1, 2, 2, 2, 3, 4);
  for (int64_t t = 0; t < 7; ++t) {
    h.k[2 * t] = h.k[2 * t + 1] = static_cast<float>(t + 1);
    h.v[2 * t] = h.v[2 * t + 1] = static_cast<float>(10 * (t + 1));
    h.q[2 * t] = h.q[2 * t + 1] = static_cast<float>(100 * (t + 1));
  }
  h.k_out.assign(14, -1.0f);
  h.slots = {4, -1, 4, 6, 1, 1, 0};
  h.pos = {0, 1, 2, 3, 4, 3, -1};  // max_position 4: tokens 4 and 6 are invalid
  const AppendParams<float> p = h.params();
  CHECK(reference::append_token_valid(p, 3));
  CHECK_FALSE(reference::append_token_valid(p, 4));
  CHECK_FALSE(reference::append_token_valid(p, 6));
  CHECK(reference::slot_writers(p) == std::vector<int64_t>{-1, 5, -1, -1, 2, -1});
  const reference::AppendGold g = reference::cpu_append(p);
  CHECK(values(g.key_cache, 0, 12) == std::vector<double>{-9, -9, 6, 6, -9, -9, -9, -9, 3, 3, -9, -9});
  CHECK(values(g.value_cache, 0, 12) == std::vector<double>{-8, -8, 60, 60, -8, -8, -8, -8, 30, 30, -8, -8});
  // Every valid token writes q and key_out, the padding and out-of-range-slot ones too; invalid ones nothing.
  CHECK(values(g.key, 0, 14) == std::vector<double>{1, 1, 2, 2, 3, 3, 4, 4, -1, -1, 6, 6, -1, -1});
  CHECK(values(g.query, 0, 14) == std::vector<double>{100, 100, 200, 200, 300, 300, 400, 400, 500, 500, 600, 600, 700,
                                                      700});  // in place: invalid tokens keep q
  CHECK(g.error_flag.required == (kErrorPositionIdOutOfRange | kErrorSlotOutOfRange));
  CHECK(g.error_flag.accepts(kErrorPositionIdOutOfRange | kErrorSlotOutOfRange));
  CHECK_FALSE(g.error_flag.accepts(kErrorPositionIdOutOfRange));
  CHECK_FALSE(g.error_flag.accepts(kErrorPositionIdOutOfRange | kErrorSlotOutOfRange | kErrorPositionOutOfRange));

  // Only invalid tokens have an out-of-range slot: bit 4 may be set, need not be.
  h.slots = {0, 1, 2, 3, 99, 5, 6};
  const reference::AppendFlag f = reference::expected_append_flag(h.params());
  CHECK(f.required == kErrorPositionIdOutOfRange);
  CHECK(f.accepts(kErrorPositionIdOutOfRange));
  CHECK(f.accepts(kErrorPositionIdOutOfRange | kErrorSlotOutOfRange));
  // The last token naming a slot is invalid: the earlier valid one keeps it.
  h.slots = {0, 1, 2, 3, 5, 4, 5};
  h.pos = {0, 1, 2, 3, 0, 3, 9};
  CHECK(reference::slot_writers(h.params()) == std::vector<int64_t>{0, 1, 2, 3, 5, 4});
  // No KV heads: no slot is read (slot_mapping is not required), only positions.
  Host<float> q_only(2, 0, 1, 2, 2, 2, 1, 4);
  q_only.pos = {0, 9};
  q_only.slots = {99, 99};
  const reference::AppendFlag fq = reference::expected_append_flag(q_only.params());
  CHECK(fq.required == kErrorPositionIdOutOfRange);
  CHECK(fq.allowed == kErrorPositionIdOutOfRange);
  // No token: no bit.
  Host<float> empty(0, 1, 1, 2, 2, 2, 1, 1);
  CHECK(reference::expected_append_flag(empty.params()).allowed == 0);
}

TEST_CASE("cpu_append: HND pages and a flat pool address the same slots", "[host][reference][append]") {
  // H = 2, D = R = 2, P = 2, 2 pages; token 0 at slot 1, token 1 at slot 2; identity rotation.
  for (bool hnd : {false, true}) {
    INFO((hnd ? "HND" : "NHD"));
    Host<float> h(2, 2, 0, 2, 2, 2, 2, 1);
    h.hnd = hnd;
    h.k = {1, 2, 3, 4, 5, 6, 7, 8};  // [t][h][d]
    h.v = {9, 10, 11, 12, 13, 14, 15, 16};
    h.slots = {1, 2};
    // Previous content: each element its own address, so a wrong address shows.
    for (size_t i = 0; i < h.kc.size(); ++i)
      h.kc[i] = -static_cast<float>(i), h.vc[i] = -100.0f - static_cast<float>(i);
    const AppendParams<float> p = h.params();
    const reference::AppendGold g = reference::cpu_append(p);
    // Slot order [slot][h][d]: slot 0 and 3 unwritten (their previous content, from the layout's addresses).
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t d = 0; d < 2; ++d) {
          const float before = p.key_cache.row(s / 2, s % 2, j)[d];
          const double got = g.key_cache[(s * 2 + j) * 2 + d].value;
          if (s == 1 || s == 2)
            CHECK(got == h.k[((s - 1) * 2 + j) * 2 + d]);
          else
            CHECK(got == before);
        }
    CHECK(p.key_cache.row(1, 0, 1) == h.kc.data() + (hnd ? 1 * 8 + 1 * 4 + 0 * 2 : 1 * 8 + 0 * 4 + 1 * 2));
  }
}

TEST_CASE("cpu_append: fp8 caches hold fp8_satfinite(x / scale), per tensor or per head",
          "[host][reference][append][fp8]") {
  // v = [1, 3, 600, -0.001] with scale 2: [0.5, 1.5, 300, -0.0005] in e4m3:
  //   0.5 = 2^-1: 0x30;   1.5: 0x3C;   300 = 9.375 * 32 -> 9 * 32 = 288 = 1.125 * 2^8: 0x79;
  //   -0.0005 = -0.256 * 2^-9 -> -0: 0x80.
  // k (identity rotation) = [448, -1000, 0.25, 3.5], scale 0.5: [896 -> 448: 0x7E, -2000 -> -448: 0xFE,
  //   0.5: 0x30, 7 = 1.75 * 2^2: 0x4E].
  for (bool per_head : {false, true}) {
    INFO((per_head ? "scales [H]" : "one scale"));
    Host<float, __nv_fp8_e4m3> h(1, 2, 0, 4, 4, 1, 2, 1);
    h.k = {448, -1000, 0.25f, 3.5f, 1, 1, 1, 1};
    h.v = {1, 3, 600, -0.001f, 1, 1, 1, 1};
    h.k_scale = per_head ? std::vector<float>{0.5f, 4.0f} : std::vector<float>{0.5f};
    h.v_scale = per_head ? std::vector<float>{2.0f, 0.25f} : std::vector<float>{2.0f};
    h.per_head = per_head;
    h.slots = {1};
    const reference::AppendGold g = reference::cpu_append(h.params());
    // Slot 1, head 0.
    CHECK(std::vector<uint8_t>(g.key_fp8.begin() + 8, g.key_fp8.begin() + 12) ==
          std::vector<uint8_t>{0x7E, 0xFE, 0x30, 0x4E});
    CHECK(std::vector<uint8_t>(g.value_fp8.begin() + 8, g.value_fp8.begin() + 12) ==
          std::vector<uint8_t>{0x30, 0x3C, 0x79, 0x80});
    // Head 1: k = 1 over 0.5 (2: 0x40) or 4 (0.25: 0x28); v = 1 over 2 (0.5: 0x30) or 0.25 (4: 0x48).
    CHECK(int(g.key_fp8[12]) == (per_head ? 0x28 : 0x40));
    CHECK(int(g.value_fp8[12]) == (per_head ? 0x48 : 0x30));
    // Slot 0 unwritten: its previous codes (-9: 0xD1, -8: 0xD0).
    CHECK(int(g.key_fp8[0]) == int(fp8_encode(-9.0f, Fp8Format::kE4M3)));
    CHECK(int(g.value_fp8[0]) == 0xD0);
    CHECK(g.key_cache[8].value == 448.0);  // before quantization, unscaled
  }
  // Without scales: 1.
  Host<__nv_bfloat16, __nv_fp8_e5m2> h(1, 1, 0, 2, 2, 1, 1, 1);
  h.k = floats<__nv_bfloat16>({3, -70000});
  h.v = floats<__nv_bfloat16>({0.1, 1e-7});
  h.slots = {0};
  const reference::AppendGold g = reference::cpu_append(h.params());
  CHECK(g.key_fp8 == std::vector<uint8_t>{0x42, 0xFB});  // 3 = 1.5 * 2: 0x42; -70000 saturates
  CHECK(int(g.value_fp8[0]) == int(fp8_encode(to_float(from_float<__nv_bfloat16>(0.1f)), Fp8Format::kE5M2)));
  CHECK(int(g.value_fp8[1]) == 0x00);  // 1e-7 underflows
}

// ---------------------------------------------------------------------------------------------------
// check_append.
// ---------------------------------------------------------------------------------------------------

namespace {

// Outputs made by rounding the reference: what a correct call leaves.
template <typename T, typename C>
struct Made {
  std::vector<T> q, q_out, k, k_out, v;
  std::vector<C> kc, vc;
  verify::AppendOutputs<T, C> out;
};

template <typename T, typename C, typename Pos>
Made<T, C> make_outputs(Host<T, C, Pos>& h, const reference::AppendGold& g) {
  Made<T, C> m;
  auto rounded = [](const std::vector<reference::Gold>& x) {
    std::vector<T> out;
    for (const auto& e : x) out.push_back(reference::detail::round_to<T>(e.value));
    return out;
  };
  const bool q_in_place = !h.with_q_out;
  m.q = q_in_place ? rounded(g.query) : h.q;
  m.q_out = q_in_place ? h.q_out : rounded(g.query);
  m.k = h.key_in_place ? rounded(g.key) : h.k;
  m.k_out = h.with_k_out ? rounded(g.key) : h.k_out;
  m.v = h.v;
  m.kc = h.kc;
  m.vc = h.vc;
  PagedCache<C> kc = h.cache_view(m.kc.data()), vc = h.cache_view(m.vc.data());
  for (int64_t s = 0; s < h.pages * h.P; ++s)
    for (int64_t j = 0; j < h.H; ++j)
      for (int64_t d = 0; d < h.D; ++d) {
        const int64_t o = (s * h.H + j) * h.D + d;
        C* krow = kc.row(s / h.P, s % h.P, j);
        C* vrow = vc.row(s / h.P, s % h.P, j);
        if constexpr (kIsFp8<C>) {
          std::memcpy(&krow[d], &g.key_fp8[o], 1);
          std::memcpy(&vrow[d], &g.value_fp8[o], 1);
        } else {
          krow[d] = reference::detail::round_to<C>(g.key_cache[o].value);
          vrow[d] = reference::detail::round_to<C>(g.value_cache[o]);
        }
      }
  m.out.query = thd<const T>(m.q.data(), h.Hq, h.D);
  if (h.with_q_out) m.out.query_out = thd<const T>(m.q_out.data(), h.Hq, h.D);
  m.out.key = thd<const T>(m.k.data(), h.H, h.D);
  if (h.with_k_out) m.out.key_out = thd<const T>(m.k_out.data(), h.H, h.D);
  m.out.value = thd<const T>(m.v.data(), h.H, h.D);
  m.out.key_cache = h.template cache_view<const C>(m.kc.data());
  m.out.value_cache = h.template cache_view<const C>(m.vc.data());
  return m;
}

// A random problem: N = 6 tokens (slot 3 twice, a padding slot, an out-of-range slot, an invalid
// position), H = 2, Hq = 3, D = 8, R = 4, P = 2, 4 pages, random normal inputs.
template <typename T, typename C>
Host<T, C> random_host(RotaryStyle style, bool norms, uint64_t seed) {
  Host<T, C> h(6, 2, 3, 8, 4, 2, 4, 5);
  h.style = style;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  for (auto* b : {&h.q, &h.k, &h.v, &h.q_out, &h.k_out})
    for (T& x : *b) x = from_float<T>(normal(rng));
  for (float& x : h.table_f32) x = normal(rng);
  for (size_t i = 0; i < h.kc.size(); ++i) h.kc[i] = cache_elem<C>(normal(rng)), h.vc[i] = cache_elem<C>(normal(rng));
  if (norms) {
    h.q_weight = h.k_weight = std::vector<T>(8);
    for (T& x : h.q_weight) x = from_float<T>(normal(rng));
    for (T& x : h.k_weight) x = from_float<T>(normal(rng));
  }
  h.slots = {3, -1, 3, 0, 8, 6};
  h.pos = {0, 1, 2, 3, 4, 7};  // token 5 invalid
  return h;
}

template <typename T>
T bump(T x, bool one_bit) {
  return one_bit ? next_up(x) : from_float<T>(to_float(x) + 1.0f);
}
template <typename C>
void bump_code(C& c, int by) {
  uint8_t b = reference::fp8_bits(c);
  b = static_cast<uint8_t>(b + by);
  std::memcpy(&c, &b, 1);
}

}  // namespace

TEST_CASE("check_append accepts the right outputs and names the first wrong one (cache in T)",
          "[host][reference][append][checker]") {
  using T = __nv_bfloat16;
  for (bool norms : {false, true}) {
    INFO((norms ? "with norms" : "without norms"));
    Host<T, T> h = random_host<T, T>(RotaryStyle::kInterleaved, norms, 11);
    h.with_q_out = true;
    h.hnd = true;
    const AppendParams<T, T> in = h.params();
    const reference::AppendGold g = reference::cpu_append(in);
    Made<T, T> m = make_outputs(h, g);
    verify::CheckResult r = verify::check_append(in, m.out);
    INFO(r.first_mismatch);
    CHECK(r.ok());
    // q (unchanged) and query_out, k, key_out, v: 5 rows of tokens; both caches: 8 slots.
    CHECK(r.checked == 6 * 3 * 8 * 2 + 6 * 2 * 8 * 3 + 2 * 8 * 2 * 8);
    // Slot 3 holds token 2 (the last of two), slot 0 token 3; slot 6 nothing (token 5's position is out of
    // range), slot 8 does not exist.
    CHECK(reference::slot_writers(in) == std::vector<int64_t>{3, -1, -1, 2, -1, -1, -1, -1});

    const int64_t H = 2, Hq = 3, D = 8;
    auto tok = [&](int64_t heads, int64_t t, int64_t j, int64_t d) { return (t * heads + j) * D + d; };
    PagedCache<T> kc = h.cache_view(m.kc.data()), vc = h.cache_view(m.vc.data());
    struct Case {
      T* element;
      bool one_bit;
      const char* name;
    };
    std::vector<Case> cases{
        {&m.q_out[tok(Hq, 0, 1, 1)], false, "query_out"},  // rotated
        {&m.q[tok(Hq, 2, 0, 0)], true, "query"},           // q must stay as it was
        {&m.k_out[tok(H, 4, 1, 2)], false, "key_out"},     // a token whose slot is out of range
        {&m.k_out[tok(H, 5, 0, 0)], true, "key_out"},      // an invalid token keeps the old key_out
        {&m.k[tok(H, 1, 1, 7)], true, "key"},              // k not in place: unchanged
        {&m.v[tok(H, 3, 0, 3)], true, "value"},
        {&kc.row(1, 1, 0)[1], false, "key_cache"},  // slot 3, rotated
        {&kc.row(2, 0, 1)[2], true, "key_cache"},   // slot 4: unwritten
        {&vc.row(0, 0, 1)[5], true, "value_cache"},
        {&vc.row(3, 1, 0)[0], true, "value_cache"},  // slot 7: unwritten
    };
    if (!norms) {
      cases.push_back({&m.q_out[tok(Hq, 1, 2, 6)], true, "query_out"});  // a pass-through element: a copy
      cases.push_back({&kc.row(0, 0, 1)[7], true, "key_cache"});
    }
    for (const Case& c : cases) {
      INFO("changed: " << c.name);
      const T saved = *c.element;
      *c.element = bump(saved, c.one_bit);
      r = verify::check_append(in, m.out);
      CHECK(r.mismatches >= 1);
      CHECK(r.first_mismatch.find(c.name) != std::string::npos);
      *c.element = saved;
    }
    // The cache must hold the key exactly as written to key_out: both changed by one bit, consistently
    // within tolerance, the cache is still caught.
    T& in_cache = kc.row(1, 1, 1)[0];
    const T saved = in_cache;
    in_cache = next_up(in_cache);
    r = verify::check_append(in, m.out);
    CHECK(r.mismatches == 1);
    CHECK(r.first_mismatch.find("key_cache") != std::string::npos);
    in_cache = saved;
  }
}

TEST_CASE("check_append on fp8 caches: the code of the call's own key, or of a key within tolerance",
          "[host][reference][append][checker][fp8]") {
  using T = __nv_bfloat16;
  using C = __nv_fp8_e4m3;
  for (int key_mode = 0; key_mode < 3; ++key_mode) {  // 0: key_out, 1: key in place, 2: neither
    INFO("key mode " << key_mode);
    Host<T, C> h = random_host<T, C>(RotaryStyle::kRotateHalf, key_mode == 1, 12);
    h.with_k_out = key_mode == 0;
    h.key_in_place = key_mode == 1;
    h.k_scale = {0.75f, 1.5f};
    h.v_scale = {0.5f, 3.0f};
    h.per_head = true;
    const AppendParams<T, C> in = h.params();
    const reference::AppendGold g = reference::cpu_append(in);
    Made<T, C> m = make_outputs(h, g);
    verify::CheckResult r = verify::check_append(in, m.out);
    INFO(r.first_mismatch);
    CHECK(r.ok());
    PagedCache<C> kc = h.cache_view(m.kc.data()), vc = h.cache_view(m.vc.data());
    for (C* c :
         {&kc.row(1, 1, 1)[0], &kc.row(1, 1, 0)[3], &kc.row(0, 0, 1)[6], &vc.row(1, 1, 0)[2], &kc.row(2, 1, 1)[2]}) {
      const C saved = *c;
      bump_code(*c, 2);  // two codes off: never within tolerance
      r = verify::check_append(in, m.out);
      CHECK(r.mismatches == 1);
      *c = saved;
    }
    if (key_mode != 2) {
      // With the key visible, one code off is caught too: the code must be that of the written key.
      C& c = kc.row(1, 1, 0)[1];
      const C saved = c;
      bump_code(c, 1);
      r = verify::check_append(in, m.out);
      CHECK(r.mismatches == 1);
      c = saved;
      // And the key the call wrote (a neighbour of gold, within tolerance) is what the code must follow.
      // Token 2, head 0, element 1, moved to its other neighbour of gold (still within tolerance).
      T& written = key_mode == 0 ? m.k_out[(2 * 2 + 0) * 8 + 1] : m.k[(2 * 2 + 0) * 8 + 1];
      const T kept = written;
      written = verify::detail::next_value(kept, to_float(kept) < g.key[(2 * 2 + 0) * 8 + 1].value);
      const uint8_t want = reference::quantize<C>(written, 0.75f);
      std::memcpy(&c, &want, 1);
      r = verify::check_append(in, m.out);
      CHECK(r.ok());
      written = kept;
      c = saved;
    }
  }
}

TEST_CASE("fp8_within_tolerance: the codes of the keys in T within tolerance of gold, signed zeros included",
          "[host][reference][append][fp8]") {
  using T = __nv_bfloat16;
  using verify::detail::fp8_within_tolerance;
  // gold 1, A 1: the bf16 keys within 2^-7 + 2^-21 of 1 are 1 - 2^-8 .. 1 + 2^-7: all e4m3 1.0 (0x38).
  CHECK(fp8_within_tolerance<__nv_fp8_e4m3, T>(0x38, {1.0, 1.0}, 1.0f));
  CHECK_FALSE(fp8_within_tolerance<__nv_fp8_e4m3, T>(0x37, {1.0, 1.0}, 1.0f));
  CHECK_FALSE(fp8_within_tolerance<__nv_fp8_e4m3, T>(0x39, {1.0, 1.0}, 1.0f));
  // gold 1.0625 (the e4m3 tie between 1 and 1.125), A 0: the keys 1.0625 - 2^-7 .. 1.0625 + 2^-7 (one bf16
  // ulp) encode to 1 (the tie, to even, and below) or 1.125 (above): both accepted, nothing further.
  CHECK(fp8_within_tolerance<__nv_fp8_e4m3, T>(0x38, {1.0625, 0.0}, 1.0f));
  CHECK(fp8_within_tolerance<__nv_fp8_e4m3, T>(0x39, {1.0625, 0.0}, 1.0f));
  CHECK_FALSE(fp8_within_tolerance<__nv_fp8_e4m3, T>(0x37, {1.0625, 0.0}, 1.0f));
  CHECK_FALSE(fp8_within_tolerance<__nv_fp8_e4m3, T>(0x3A, {1.0625, 0.0}, 1.0f));
  // gold -6e-6 with A 18 (a normed row): keys from about -1.5e-5 to +2.6e-6, so e5m2 -2^-16, -0 and +0.
  const reference::Gold tiny{-6e-6, 18.0};
  CHECK(fp8_within_tolerance<__nv_fp8_e5m2, T>(0x81, tiny, 1.0f));
  CHECK(fp8_within_tolerance<__nv_fp8_e5m2, T>(0x80, tiny, 1.0f));
  CHECK(fp8_within_tolerance<__nv_fp8_e5m2, T>(0x00, tiny, 1.0f));
  CHECK_FALSE(fp8_within_tolerance<__nv_fp8_e5m2, T>(0x01, tiny, 1.0f));
  CHECK_FALSE(fp8_within_tolerance<__nv_fp8_e5m2, T>(0x82, tiny, 1.0f));
  // A tiny positive gold with no spread: only +0.
  CHECK(fp8_within_tolerance<__nv_fp8_e5m2, T>(0x00, {1e-7, 0.0}, 1.0f));
  CHECK_FALSE(fp8_within_tolerance<__nv_fp8_e5m2, T>(0x80, {1e-7, 0.0}, 1.0f));
  // The scale divides: gold 3 over 2 is e4m3 1.5 (0x3C).
  CHECK(fp8_within_tolerance<__nv_fp8_e4m3, T>(0x3C, {3.0, 3.0}, 2.0f));
}

TEST_CASE("check_append: the norm's tolerance, widened by 2 + D / 16, and no more", "[host][reference][append]") {
  // fp32, D = 64, a normed k: an error of 3/4 of the bound passes, 4/3 of it fails.
  Host<float, float> h(1, 1, 0, 64, 64, 1, 1, 1);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (float& x : h.k) x = normal(rng);
  h.k_weight.resize(64);
  for (float& x : h.k_weight) x = normal(rng);
  h.set_angle(0, std::vector<float>(32, 0.6f), std::vector<float>(32, 0.8f));
  h.slots = {0};
  const AppendParams<float> in = h.params();
  const reference::AppendGold g = reference::cpu_append(in);
  Made<float, float> m = make_outputs(h, g);
  REQUIRE(verify::check_append(in, m.out).ok());
  const reference::Gold& e = g.key[5];
  const double bound = verify::ulp<float>(e.value) + std::ldexp(e.abs_sum, -21);
  CHECK(e.abs_sum >= (2 + 64 / 16.0) * std::fabs(e.value));  // the widening is there
  for (double f : {0.75, 4.0 / 3.0}) {
    const float v = static_cast<float>(e.value + f * bound);
    m.k_out[5] = v;
    m.kc[5] = v;
    CHECK(verify::check_append(in, m.out).ok() == (f < 1));
  }
}

// ---------------------------------------------------------------------------------------------------
// validate() for the append.
// ---------------------------------------------------------------------------------------------------

namespace {
using VT = __nv_bfloat16;
constexpr int64_t kN = 8, kH = 2, kHq = 4, kD = 64, kP = 16, kPages = 4, kMaxPos = 100;

// Host buffers standing in for device memory: validate() never dereferences them.
struct Buffers {
  std::vector<VT> q = std::vector<VT>(kN * kHq * kD), q_out = q;
  std::vector<VT> k = std::vector<VT>(kN * kH * kD), v = k, k_out = k;
  std::vector<VT> kc = std::vector<VT>(kPages * kP * kH * kD), vc = kc;
  std::vector<__nv_fp8_e4m3> kc8 = std::vector<__nv_fp8_e4m3>(kc.size()), vc8 = kc8;
  std::vector<VT> table = std::vector<VT>(kMaxPos * kD), weight = std::vector<VT>(kD);
  std::vector<float> table_f32 = std::vector<float>(kMaxPos * kD), scales = std::vector<float>(kH);
  std::vector<int64_t> pos = std::vector<int64_t>(kN), slots = std::vector<int64_t>(kN);
  std::vector<int> flag = std::vector<int>(1);

  template <typename C>
  AppendParams<VT, C> base(C* kcache, C* vcache) {
    AppendParams<VT, C> p;
    p.tokens = kN, p.heads = kH, p.query_heads = kHq, p.head_dim = kD;
    p.query = thd(q.data(), kHq, kD);
    p.key = thd(k.data(), kH, kD);
    p.key_out = thd(k_out.data(), kH, kD);
    p.value = thd<const VT>(v.data(), kH, kD);
    p.positions = pos.data();
    p.cos_sin_cache_f32 = table_f32.data();
    p.max_position = kMaxPos;
    p.key_cache = nhd_pages(kcache, kP, kH, kD);
    p.value_cache = nhd_pages(vcache, kP, kH, kD);
    p.page_size = kP;
    p.num_pages = kPages;
    p.slot_mapping = slots.data();
    p.error_flag = flag.data();
    return p;
  }
  AppendParams<VT> params() { return base(kc.data(), vc.data()); }
  AppendParams<VT, __nv_fp8_e4m3> fp8() { return base(kc8.data(), vc8.data()); }
};

template <typename C>
void expect(const AppendParams<VT, C>& p, StatusCode code, const char* field, const char* other = nullptr) {
  const Status s = validate(p);
  INFO("got " << to_string(s.code) << " / " << (s.field ? s.field : "(none)") << " / "
              << (s.other ? s.other : "(none)"));
  CHECK(s.code == code);
  CHECK(std::string(s.field ? s.field : "") == std::string(field ? field : ""));
  if (other) CHECK(std::string(s.other ? s.other : "") == std::string(other));
}
}  // namespace

TEST_CASE("append validate: valid calls pass with every option", "[host][validate][append]") {
  Buffers buf;
  auto p = buf.params();
  expect(p, StatusCode::kSuccess, nullptr);  // q in place, key_out
  p.query_out = thd(buf.q_out.data(), kHq, kD);
  expect(p, StatusCode::kSuccess, nullptr);
  p.key_out = {};
  expect(p, StatusCode::kSuccess, nullptr);  // no k out
  p.key_in_place = true;
  expect(p, StatusCode::kSuccess, nullptr);
  p.query_norm_weight = p.key_norm_weight = buf.weight.data();
  p.norm_weight_plus_one = true;
  p.rotary_dim = 32;
  p.style = RotaryStyle::kInterleaved;
  expect(p, StatusCode::kSuccess, nullptr);
  p.cos_sin_cache_f32 = nullptr;
  p.cos_sin_cache = buf.table.data();
  p.key_cache = hnd_pages(buf.kc.data(), kP, kH, kD);
  p.value_cache = {buf.vc.data(), kP * kH * kD, kD, kP * kD};  // HND as strides
  expect(p, StatusCode::kSuccess, nullptr);
  p = buf.params();
  p.query_heads = 0;
  p.query = {};
  expect(p, StatusCode::kSuccess, nullptr);  // no q
  auto f = buf.fp8();
  expect(f, StatusCode::kSuccess, nullptr);  // scales null: 1
  f.key_scale = f.value_scale = buf.scales.data();
  expect(f, StatusCode::kSuccess, nullptr);
  f.scale_per_head = true;
  expect(f, StatusCode::kSuccess, nullptr);
  // An empty call needs no pointer.
  AppendParams<VT> empty;
  empty.head_dim = kD;
  empty.heads = kH;
  empty.query_heads = kHq;
  empty.page_size = kP;
  expect(empty, StatusCode::kSuccess, nullptr);
}

TEST_CASE("append validate: sizes, rotation, norm_eps", "[host][validate][append]") {
  Buffers buf;
  struct Case {
    void (*change)(AppendParams<VT>&);
    StatusCode code;
    const char* field;
  };
  const Case cases[] = {
      {[](AppendParams<VT>& p) { p.tokens = -1; }, StatusCode::kInvalidSize, "tokens"},
      {[](AppendParams<VT>& p) { p.heads = -1; }, StatusCode::kInvalidSize, "heads"},
      {[](AppendParams<VT>& p) { p.query_heads = -2; }, StatusCode::kInvalidSize, "query_heads"},
      {[](AppendParams<VT>& p) { p.max_position = -1; }, StatusCode::kInvalidSize, "max_position"},
      {[](AppendParams<VT>& p) { p.page_size = -16; }, StatusCode::kInvalidSize, "page_size"},
      {[](AppendParams<VT>& p) { p.page_size = 0; }, StatusCode::kInvalidSize, "page_size"},
      {[](AppendParams<VT>& p) { p.num_pages = -1; }, StatusCode::kInvalidSize, "num_pages"},
      {[](AppendParams<VT>& p) { p.head_dim = 0; }, StatusCode::kInvalidHeadDim, "head_dim"},
      {[](AppendParams<VT>& p) { p.head_dim = 63; }, StatusCode::kInvalidHeadDim, "head_dim"},
      {[](AppendParams<VT>& p) { p.rotary_dim = 66; }, StatusCode::kInvalidRotaryDim, "rotary_dim"},
      {[](AppendParams<VT>& p) { p.rotary_dim = 5; }, StatusCode::kInvalidRotaryDim, "rotary_dim"},
      {[](AppendParams<VT>& p) { p.rotary_dim = -2; }, StatusCode::kInvalidRotaryDim, "rotary_dim"},
      {[](AppendParams<VT>& p) { p.style = static_cast<RotaryStyle>(2); }, StatusCode::kInvalidStyle, "style"},
      {[](AppendParams<VT>& p) { p.norm_eps = -1e-6f; }, StatusCode::kInvalidSize, "norm_eps"},
      {[](AppendParams<VT>& p) { p.norm_eps = std::nanf(""); }, StatusCode::kInvalidSize, "norm_eps"},
  };
  for (const Case& c : cases) {
    auto p = buf.params();
    c.change(p);
    expect(p, c.code, c.field);
  }
}

TEST_CASE("append validate: required pointers and non-negative strides", "[host][validate][append]") {
  Buffers buf;
  struct Case {
    void (*change)(AppendParams<VT>&);
    StatusCode code;
    const char* field;
  };
  const Case cases[] = {
      {[](AppendParams<VT>& p) { p.query.data = nullptr; }, StatusCode::kNullPointer, "query"},
      {[](AppendParams<VT>& p) { p.key.data = nullptr; }, StatusCode::kNullPointer, "key"},
      {[](AppendParams<VT>& p) { p.value.data = nullptr; }, StatusCode::kNullPointer, "value"},
      {[](AppendParams<VT>& p) { p.positions = nullptr; }, StatusCode::kNullPointer, "positions"},
      {[](AppendParams<VT>& p) { p.slot_mapping = nullptr; }, StatusCode::kNullPointer, "slot_mapping"},
      {[](AppendParams<VT>& p) { p.cos_sin_cache_f32 = nullptr; }, StatusCode::kNullPointer, "cos_sin_cache"},
      {[](AppendParams<VT>& p) { p.key_cache.data = nullptr; }, StatusCode::kNullPointer, "key_cache"},
      {[](AppendParams<VT>& p) { p.value_cache.data = nullptr; }, StatusCode::kNullPointer, "value_cache"},
      {[](AppendParams<VT>& p) { p.query.token_stride = -1; }, StatusCode::kInvalidStride, "query.token_stride"},
      {[](AppendParams<VT>& p) { p.query.head_stride = -kD; }, StatusCode::kInvalidStride, "query.head_stride"},
      {[](AppendParams<VT>& p) { p.key.head_stride = -kD; }, StatusCode::kInvalidStride, "key.head_stride"},
      {[](AppendParams<VT>& p) { p.value.token_stride = -1; }, StatusCode::kInvalidStride, "value.token_stride"},
      {[](AppendParams<VT>& p) { p.key_out.token_stride = -1; }, StatusCode::kInvalidStride, "key_out.token_stride"},
      {[](AppendParams<VT>& p) { p.key_cache.page_stride = -1; }, StatusCode::kInvalidStride, "key_cache.page_stride"},
      {[](AppendParams<VT>& p) { p.value_cache.offset_stride = -1; }, StatusCode::kInvalidStride,
       "value_cache.offset_stride"},
      {[](AppendParams<VT>& p) { p.value_cache.head_stride = -1; }, StatusCode::kInvalidStride,
       "value_cache.head_stride"},
  };
  for (const Case& c : cases) {
    auto p = buf.params();
    c.change(p);
    expect(p, c.code, c.field);
  }
  auto p = buf.params();
  p.query_out = thd(buf.q_out.data(), kHq, kD);
  p.query_out.head_stride = -1;
  expect(p, StatusCode::kInvalidStride, "query_out.head_stride");
  p = buf.params();
  p.key_out = {};
  p.key_in_place = true;
  p.key.data = nullptr;  // key in place is an output: still required
  expect(p, StatusCode::kNullPointer, "key");
}

TEST_CASE("append validate: fields that exclude each other", "[host][validate][append]") {
  Buffers buf;
  auto p = buf.params();
  p.cos_sin_cache = buf.table.data();  // both table sources
  expect(p, StatusCode::kConflictingFields, "cos_sin_cache", "cos_sin_cache_f32");
  p = buf.params();
  p.key_in_place = true;  // with key_out
  expect(p, StatusCode::kConflictingFields, "key_in_place", "key_out");
  p = buf.params();
  p.key_scale = buf.scales.data();  // a scale for a cache in T
  expect(p, StatusCode::kConflictingFields, "key_scale", "key_cache");
  p = buf.params();
  p.value_scale = buf.scales.data();
  expect(p, StatusCode::kConflictingFields, "value_scale", "value_cache");
}

TEST_CASE("append validate: outputs overlap nothing; a fused qkv buffer's views pass in place",
          "[host][validate][append]") {
  Buffers buf;
  auto p = buf.params();
  p.key_cache.offset_stride = kD / 2;  // its rows overlap
  expect(p, StatusCode::kOverlappingRows, "key_cache.offset_stride");
  p = buf.params();
  p.query_out = thd(buf.k.data(), kHq, kD);  // q's output over k
  expect(p, StatusCode::kAliasedBuffers, "query_out", "key");
  p = buf.params();
  p.value_cache = p.key_cache;  // one cache for both
  expect(p, StatusCode::kAliasedBuffers, "value_cache", "key_cache");
  p = buf.params();
  p.key_out = thd(buf.kc.data() + kD, kH, kD);  // key_out inside the key cache
  expect(p, StatusCode::kAliasedBuffers, "key_cache", "key_out");
  p = buf.params();
  p.query = thd(buf.v.data(), kH, kD);  // q in place over v
  p.query_heads = kH;
  expect(p, StatusCode::kAliasedBuffers, "query", "value");
  p = buf.params();
  p.error_flag = reinterpret_cast<int*>(buf.k_out.data());  // the flag inside key_out
  expect(p, StatusCode::kAliasedBuffers, "error_flag", "key_out");

  // q, k, v as views of one projection qkv [N, (Hq + 2 H) D]: q and k rotated in place, v read. Hq = 2 H
  // (grouped queries) and Hq = H.
  for (int64_t hq : {kHq, kH}) {
    INFO("Hq = " << hq);
    const int64_t row = (hq + 2 * kH) * kD;
    std::vector<VT> qkv(kN * row);
    p = buf.params();
    p.query_heads = hq;
    p.query = {qkv.data(), row, kD};
    p.key = {qkv.data() + hq * kD, row, kD};
    p.value = {qkv.data() + (hq + kH) * kD, row, kD};
    p.key_out = {};
    p.key_in_place = true;
    expect(p, StatusCode::kSuccess, nullptr);
    p.key_in_place = false;  // k read only
    expect(p, StatusCode::kSuccess, nullptr);
    p.key_out = thd(buf.k_out.data(), kH, kD);
    p.query_out = thd(buf.q_out.data(), hq, kD);
    expect(p, StatusCode::kSuccess, nullptr);
    // But an output view that takes v's place is caught.
    p.query_out = {};
    p.key_out = {qkv.data() + (hq + kH) * kD, row, kD};
    expect(p, StatusCode::kAliasedBuffers, "key_out", "value");
  }
}

TEST_CASE("append: the slot error has a bit and a status of its own", "[host][validate][append]") {
  CHECK(kErrorSlotOutOfRange == 4);
  CHECK((kErrorSlotOutOfRange & (kErrorPositionOutOfRange | kErrorPositionIdOutOfRange)) == 0);
  CHECK(std::string(to_string(StatusCode::kSlotOutOfRange)) == "slot out of range");
}
