// Host tests of the NVFP4 building block (kvrope/detail/common/nvfp4.cuh, compiled here as host code) against
// the float64 reference (kvrope/reference/cpu_nvfp4.hpp): the e2m1 rounding over dense sweeps of fp32 values
// around every e2m1 value and midpoint, the e4m3 decoding, the fp32 operations' host models, random blocks,
// and blocks worked by hand.
#include <cuda_fp4.h>

#include <kvrope/detail/common/nvfp4.cuh>
#include <kvrope/reference/cpu_nvfp4.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "support/catch.hpp"
#include "support/nvfp4_cases.hpp"

using namespace kvrope;
using detail::nvfp4_e2m1;

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The e2m1 code CUDA's own conversion gives (cuda_fp4.h, host path: RNE, satfinite; NaN -> +6).
uint32_t cuda_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) & 0xF; }

// Checks nvfp4_e2m1 on one value against the definition (reference::e2m1_encode) and, for non-NaN values,
// against CUDA's conversion; counts the values checked.
struct E2m1Checker {
  int64_t checked = 0, mismatches = 0;
  void operator()(float x) {
    ++checked;
    const uint32_t got = nvfp4_e2m1(x), want = reference::e2m1_encode(x);
    const bool ok = got == want && (std::isnan(x) || got == cuda_e2m1(x));
    if (!ok && ++mismatches <= 10) {
      INFO("x = " << x << " (bits 0x" << std::hex << to_bits(x) << ") got " << got << " definition " << want << " cuda "
                  << cuda_e2m1(x));
      CHECK(ok);
    }
  }
};

// The same fp32 value (the same bits), or both NaN.
bool same(float a, float b) { return to_bits(a) == to_bits(b) || (std::isnan(a) && std::isnan(b)); }

std::vector<uint8_t> bytes_of(const detail::Nvfp4Block& b) {
  std::vector<uint8_t> v(9);
  v[0] = static_cast<uint8_t>(b.scale);
  std::memcpy(v.data() + 1, b.packed, 8);
  return v;
}
std::vector<uint8_t> bytes_of(const reference::Nvfp4Block& b) {
  std::vector<uint8_t> v(9);
  v[0] = b.scale;
  std::memcpy(v.data() + 1, b.packed, 8);
  return v;
}

}  // namespace

TEST_CASE("nvfp4_e2m1 rounds as the definition on dense sweeps around every e2m1 value and midpoint", "[host][nvfp4]") {
  E2m1Checker check;
  // Every e2m1 magnitude and every midpoint between neighbours (the ties), both signs, and the 2^16 fp32
  // values on either side of each.
  const float points[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
  for (float p : points)
    for (float s : {1.0f, -1.0f}) {
      float up = s * p, down = s * p;
      check(s * p);
      for (int i = 0; i < 65536; ++i) {
        up = std::nextafter(up, INFINITY), down = std::nextafter(down, -INFINITY);
        check(up), check(down);
      }
    }
  // Every fp32 value whose low 10 mantissa bits are zero (every exponent, subnormals, ±0, ±Inf, NaNs), and
  // random bit patterns.
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 1024) check(from_bits(static_cast<uint32_t>(b)));
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) check(from_bits(rng()));
  CHECK(check.mismatches == 0);
  CHECK(check.checked > 9000000);
}

TEST_CASE("nvfp4_e2m1 on values worked by hand: ties to even, saturation, signed zero, NaN", "[host][nvfp4]") {
  struct Case {
    float x;
    uint32_t code;
  };
  const Case cases[] = {
      {0.0f, 0x0},       {-0.0f, 0x8},      {0.25f, 0x0},       {0.2500001f, 0x1}, {-0.25f, 0x8},     {0.5f, 0x1},
      {0.75f, 0x2},      {0.7499999f, 0x1}, {1.25f, 0x2},       {1.2500001f, 0x3}, {1.75f, 0x4},      {2.5f, 0x4},
      {2.5000002f, 0x5}, {3.5f, 0x6},       {-3.4999998f, 0xD}, {5.0f, 0x6},       {5.0000005f, 0x7}, {6.0f, 0x7},
      {7.0f, 0x7},       {1e30f, 0x7},      {INFINITY, 0x7},    {-INFINITY, 0xF},  {-6.5f, 0xF},      {1e-40f, 0x0},
      {-1e-40f, 0x8},    {-0.1f, 0x8},
  };
  for (const Case& c : cases) {
    INFO("x = " << c.x);
    CHECK(nvfp4_e2m1(c.x) == c.code);
  }
  // NaN of either sign (and any payload) gives 0: the code FlashInfer's comparisons give the canonical NaN a
  // GPU product is. The hardware conversion gives +6 (0x7): nvfp4_e2m1_pair maps NaN to 0 before it.
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7FFFFFFFu, 0xFF800001u, 0x7F800001u}) {
    CHECK(nvfp4_e2m1(from_bits(nan)) == 0x0);
    CHECK(cuda_e2m1(from_bits(nan)) == 0x7);
  }
  // Every code's value encodes back to the code (-0, code 8, included).
  for (uint32_t code = 0; code < 16; ++code) {
    CHECK(nvfp4_e2m1(detail::nvfp4_e2m1_value(code)) == code);
    CHECK(detail::nvfp4_e2m1_value(code) == reference::e2m1_decode(static_cast<uint8_t>(code)));
  }
  CHECK(detail::nvfp4_e2m1_pair(-0.5f, 6.0f) == 0x79);  // even element in the low nibble
  CHECK(detail::nvfp4_e2m1_pair(from_bits(0xFFC00000u), -2.0f) == 0xC0);
}

TEST_CASE("nvfp4_e4m3_value decodes every code as the reference does", "[host][nvfp4]") {
  for (uint32_t code = 0; code < 256; ++code) {
    const double want = reference::fp8_decode(static_cast<uint8_t>(code), reference::Fp8Format::kE4M3);
    const float got = detail::nvfp4_e4m3_value(code);
    INFO("code 0x" << std::hex << code);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(static_cast<double>(got) == want);
      CHECK(std::signbit(got) == std::signbit(want));
    }
  }
}

TEST_CASE("the host models of the fast-math fp32 operations: FTZ, canonical NaN, IEEE rounding", "[host][nvfp4]") {
  const float min_normal = 1.17549435e-38f, sub = from_bits(0x00400000u);
  CHECK(detail::nvfp4_ftz(sub) == 0.0f);
  CHECK(!std::signbit(detail::nvfp4_ftz(sub)));
  CHECK(std::signbit(detail::nvfp4_ftz(-sub)));
  CHECK(detail::nvfp4_ftz(min_normal) == min_normal);
  CHECK(detail::nvfp4_mul(sub, 1e30f) == 0.0f);                      // a subnormal input reads as 0
  CHECK(detail::nvfp4_mul(min_normal, 0.5f) == 0.0f);                // a subnormal result flushes
  CHECK(to_bits(detail::nvfp4_mul(INFINITY, 0.0f)) == 0x7FFFFFFFu);  // the canonical NaN, sign clear
  CHECK(to_bits(detail::nvfp4_mul(from_bits(0xFFC00001u), 2.0f)) == 0x7FFFFFFFu);
  CHECK(detail::nvfp4_mul(1.0f + 0x1p-23f, 1.0f + 0x1p-23f) == 1.0f + 0x1p-22f);  // 1 + 2^-22 + 2^-46: RN
  CHECK(detail::nvfp4_div(1.0f, 3.0f) == 1.0f / 3.0f);
  CHECK(detail::nvfp4_div(sub, 1.0f) == 0.0f);
  CHECK(detail::nvfp4_div(1.0f, sub) == INFINITY);
  CHECK(detail::nvfp4_div(1e30f, 0x1p127f) == 0.0f);  // |b| > 2^126: 0 (PTX div.approx)
  CHECK(std::isnan(detail::nvfp4_div(INFINITY, 0x1p127f)));
  CHECK(detail::nvfp4_rcp(3.0f) == 1.0f / 3.0f);
  CHECK(detail::nvfp4_rcp(sub) == INFINITY);
  CHECK(detail::nvfp4_rcp(0x1p127f) == 0.0f);  // 2^-127 flushes
}

TEST_CASE("nvfp4_quantize_block (host build) equals the float64 reference on random blocks", "[host][nvfp4]") {
  const std::vector<testing::Nvfp4Case> cases = testing::nvfp4_random_cases(2024, 450000, /*extremes=*/true);
  int64_t mismatches = 0;
  int64_t nonzero_scales = 0, saturated = 0, subnormal_scales = 0;
  for (const testing::Nvfp4Case& c : cases) {
    const detail::Nvfp4Block got = detail::nvfp4_quantize_block(c.x, c.g);
    const reference::Nvfp4Block want = reference::nvfp4_quantize_block(c.x, c.g);
    // The block scale's intermediates too: the quotient (before e4m3) and the reciprocal.
    const detail::Nvfp4Scale s = detail::nvfp4_block_scale(detail::nvfp4_amax<16>(c.x), c.g);
    const float q = reference::nvfp4_quotient(reference::nvfp4_amax(c.x), c.g);
    const float r = reference::nvfp4_inverse(reference::nvfp4_amax(c.x),
                                             reference::fp8_decode(want.scale, reference::Fp8Format::kE4M3), c.g);
    const bool ok = bytes_of(got) == bytes_of(want) && same(s.quotient, q) && same(s.inv, r);
    nonzero_scales += want.scale != 0;
    saturated += want.scale == 0x7E;
    subnormal_scales += want.scale != 0 && want.scale < 0x08;
    if (!ok && ++mismatches <= 5) {
      std::ostringstream in;
      for (float v : c.x) in << v << " ";
      INFO("kind " << testing::kNvfp4CaseKindNames[c.kind] << ", g = " << c.g << ", x = " << in.str());
      CHECK(bytes_of(got) == bytes_of(want));
      CHECK(same(s.quotient, q));
      CHECK(same(s.inv, r));
    }
  }
  CHECK(mismatches == 0);
  // The cases reach what they are meant to: live blocks, saturated and subnormal scales.
  CHECK(nonzero_scales > 300000);
  CHECK(saturated > 1000);
  CHECK(subnormal_scales > 1000);
}

TEST_CASE("nvfp4 blocks worked by hand", "[host][nvfp4]") {
  struct Case {
    const char* what;
    float g;
    std::vector<float> x;  // the rest of the 16 are +0
    uint8_t scale;
    std::vector<uint8_t> packed;
  };
  const float nan = from_bits(0xFFC00000u), inf = INFINITY;
  const Case cases[] = {
      // amax 6, g = 1: q = 6 / 6 = 1 (e4m3 0x38), r = 1: each value rounds to e2m1 as it is (0.3 -> 0.5,
      // 2.7 -> 3, -0.75 -> -1 and 5 -> 4, 1.25 -> 1, 1.75 -> 2 ties to even, ±0.1 -> ±0, -0 -> 0x8).
      {"q = 1",
       1.0f,
       {6, -3, 0.5f, 0.3f, 2.7f, -0.75f, 5, 0.1f, -0.1f, 1.5f, -6, 4, 0, -0.0f, 1.25f, 1.75f},
       0x38,
       {0xD7, 0x11, 0xA5, 0x06, 0x38, 0x6F, 0x80, 0x42}},
      // amax 6.375: q = 1.0625, an e4m3 tie between 1 and 1.125: 1 (even). r = 1.
      {"scale tie", 1.0f, {6.375f, -6.375f, 1.0625f, -0.2f}, 0x38, {0xF7, 0x82, 0, 0, 0, 0, 0, 0}},
      // amax 6.75: q = 1.125 (0x39), r = fl(1/1.125), a little above 8/9. x = 1.25·1.125 times r is a little
      // above 1.25, and rounds to 1.25 in fp32: a tie, to 1 (code 2); likewise 5.625 -> 5 -> 4,
      // 0.28125 -> 0.25 -> 0 and 2.8125 -> 2.5 -> 2. Without the product's fp32 rounding each would round up.
      {"product rounded onto a tie",
       1.0f,
       {6.75f, 1.40625f, 5.625f, 0.28125f, 2.8125f, -1.40625f},
       0x39,
       {0x27, 0x06, 0xA4, 0, 0, 0, 0, 0}},
      // g = 0.5, amax 3: 6·g = 3, q = 1, s·g = 0.5, r = 2: y = 2x (0.25 -> 0 and 0.75 -> 1, 5 -> 4 ties).
      {"g = 0.5", 0.5f, {3, 1.5f, -0.5f, 0.125f, 0.375f, 2.5f}, 0x38, {0x57, 0x0A, 0x62, 0, 0, 0, 0, 0}},
      // One huge value: q = 1e30 / 6 saturates to 448 (0x7E); r = 1/448: the others round to ±0.
      {"one huge", 1.0f, {1e30f, 1, -1, 0.001f}, 0x7E, {0x07, 0x08, 0, 0, 0, 0, 0, 0}},
      // ±Inf: amax Inf, q Inf, scale 448; Inf·r = Inf -> ±6. NaN (here with its sign set) -> 0, skipped by amax.
      {"Inf and NaN", 1.0f, {inf, -inf, nan, 2}, 0x7E, {0xF7, 0x00, 0, 0, 0, 0, 0, 0}},
      // amax 6·2^-9: q = 2^-9, the smallest e4m3 subnormal (0x01); r = 512.
      {"subnormal scale", 1.0f, {0.01171875f, -0.005859375f, 0.0009765625f}, 0x01, {0xD7, 0x01, 0, 0, 0, 0, 0, 0}},
      // amax 6·2^-10: q = 2^-10, the e4m3 tie between 0 and 2^-9: 0. Scale 0, r = 0: signed zeros.
      {"scale underflow", 1.0f, {0.005859375f, -0.001f, 0.004f}, 0x00, {0x80, 0x00, 0, 0, 0, 0, 0, 0}},
      // Zero blocks: scale 0, codes 0, or 0x8 for -0.
      {"zeros", 1.0f, {}, 0x00, {0, 0, 0, 0, 0, 0, 0, 0}},
      {"negative zeros",
       1.0f,
       {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, 0},
       0x00,
       {0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x08}},
      // A subnormal global scale reads as 0 (FTZ): scale 0, r = 0, signed zeros.
      {"subnormal g", 1e-39f, {1, -1}, 0x00, {0x80, 0, 0, 0, 0, 0, 0, 0}},
  };
  for (const Case& c : cases) {
    float x[16] = {};
    for (size_t i = 0; i < c.x.size(); ++i) x[i] = c.x[i];
    std::vector<uint8_t> want(9, c.scale);
    std::copy(c.packed.begin(), c.packed.end(), want.begin() + 1);
    INFO(c.what);
    CHECK(bytes_of(detail::nvfp4_quantize_block(x, c.g)) == want);
    CHECK(bytes_of(reference::nvfp4_quantize_block(x, c.g)) == want);
  }
}

TEST_CASE("a block split over two lanes quantizes as the whole", "[host][nvfp4]") {
  // The two-lane layout: each half's amax, combined with fmaxf (the shuffle's), the same scale, and each
  // half's word (nvfp4_pack8) is the whole block's.
  for (const testing::Nvfp4Case& c : testing::nvfp4_random_cases(7, 20000, /*extremes=*/true)) {
    const float amax = fmaxf(detail::nvfp4_amax<8>(c.x), detail::nvfp4_amax<8>(c.x + 8));
    CHECK(to_bits(amax) == to_bits(detail::nvfp4_amax<16>(c.x)));
    const detail::Nvfp4Scale s = detail::nvfp4_block_scale(amax, c.g);
    const detail::Nvfp4Block whole = detail::nvfp4_quantize_block(c.x, c.g);
    CHECK(s.code == whole.scale);
    CHECK(detail::nvfp4_pack8(c.x, s.inv) == whole.packed[0]);
    CHECK(detail::nvfp4_pack8(c.x + 8, s.inv) == whole.packed[1]);
  }
}

TEST_CASE("a block split over four lanes (16 bytes of fp32 each) quantizes as the whole", "[host][nvfp4]") {
  // The append's fp32 layout: four quarters' amax combined (two shuffles of fmaxf), each quarter's 2-byte word
  // (nvfp4_pack<4>) the whole block's bytes 2q and 2q + 1.
  for (const testing::Nvfp4Case& c : testing::nvfp4_random_cases(8, 20000, /*extremes=*/true)) {
    const float amax = fmaxf(fmaxf(detail::nvfp4_amax<4>(c.x), detail::nvfp4_amax<4>(c.x + 4)),
                             fmaxf(detail::nvfp4_amax<4>(c.x + 8), detail::nvfp4_amax<4>(c.x + 12)));
    CHECK(to_bits(amax) == to_bits(detail::nvfp4_amax<16>(c.x)));
    const detail::Nvfp4Scale s = detail::nvfp4_block_scale(amax, c.g);
    const detail::Nvfp4Block whole = detail::nvfp4_quantize_block(c.x, c.g);
    CHECK(s.code == whole.scale);
    for (int q = 0; q < 4; ++q)
      CHECK(detail::nvfp4_pack<4>(c.x + 4 * q, s.inv) == ((whole.packed[q / 2] >> (16 * (q % 2))) & 0xFFFFu));
  }
}

TEST_CASE("nvfp4 rows: reference::nvfp4_quantize_row and nvfp4_dequantize", "[host][nvfp4]") {
  // D = 64: four blocks; what attention reads back is e2m1 · s · g, within half an e2m1 step of x.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> row(64);
  for (float& v : row) v = normal(rng);
  const float g = 0.01f;
  std::vector<uint8_t> codes(32), scales(4);
  reference::nvfp4_quantize_row(row.data(), 64, g, codes.data(), scales.data());
  for (int blk = 0; blk < 4; ++blk) {
    const reference::Nvfp4Block b = reference::nvfp4_quantize_block(row.data() + 16 * blk, g);
    CHECK(scales[blk] == b.scale);
    CHECK(std::memcmp(codes.data() + 8 * blk, b.packed, 8) == 0);
    const double unit = reference::fp8_decode(b.scale, reference::Fp8Format::kE4M3) * g;
    for (int i = 0; i < 16; ++i) {
      const double back = reference::nvfp4_dequantize(codes.data(), scales.data(), g, 16 * blk + i);
      // The e2m1 steps are at most 2 (between 4 and 6): half a step is s·g. The scale rounds amax / 6 to 3
      // mantissa bits, so x·r may exceed 6 by up to 7%: saturating costs less than s·g too.
      CHECK(std::fabs(back - row[16 * blk + i]) <= unit * (1.0 + 1e-6));
    }
  }
}
