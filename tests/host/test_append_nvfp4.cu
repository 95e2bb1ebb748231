// Host tests of the append's NVFP4 caches (docs/spec.md §6.4): the float64 reference on blocks worked by hand,
// validate() (what the format needs, each refusal naming its field), and the checker of verify/ (right blocks
// pass, a wrong byte or scale is found and named, the GPU's approximations are taken from the oracle). No GPU
// needed.
#include <kvrope/append.cuh>
#include <kvrope/reference/cpu_append.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "verify/check_append.hpp"

using namespace kvrope;
using C4 = nvfp4_e2m1x2;

namespace {

// An NVFP4 append problem on host vectors: q [N, Hq, D], k, v [N, H, D] contiguous, code caches [pages, P, H,
// D / 2] and block scales [pages, P, H, D / 16] (NHD, or HND), the identity rotation unless set.
template <typename T>
struct Host4 {
  int64_t N, H, Hq, D, R, P, pages, max_position;
  RotaryStyle style = RotaryStyle::kRotateHalf;
  bool hnd = false, with_k_out = true, key_in_place = false, per_head = false;
  std::vector<T> q, k, k_out, v, k_weight;
  std::vector<float> table_f32, k_scale, v_scale;
  std::vector<int64_t> pos, slots;
  std::vector<C4> kc, vc;
  std::vector<__nv_fp8_e4m3> ks, vs;

  Host4(int64_t n, int64_t h, int64_t hq, int64_t d, int64_t r, int64_t p, int64_t pg)
      : N(n), H(h), Hq(hq), D(d), R(r), P(p), pages(pg), max_position(n + 2) {
    const T zero = from_float<T>(0.0f);
    q.assign(N * Hq * D, zero);
    k.assign(N * H * D, zero);
    k_out = v = k;
    kc.assign(pages * P * H * D / 2, C4{0x5A});
    vc.assign(kc.size(), C4{0xA5});
    ks.assign(pages * P * H * D / 16, __nv_fp8_e4m3{});
    for (auto& s : ks) std::memset(&s, 0x33, 1);
    vs = ks;
    table_f32.assign(max_position * R, 0.0f);
    for (int64_t row = 0; row < max_position; ++row)
      for (int64_t c = 0; c < R / 2; ++c) table_f32[row * R + c] = 1.0f;  // cos 1, sin 0
    pos.assign(N, 0);
    slots.assign(N, -1);
  }
  template <typename U>
  PagedCache<U> view(U* data, int64_t row) const {
    return hnd ? hnd_pages(data, P, H, row) : nhd_pages(data, P, H, row);
  }
  AppendParams<T, C4> params() {
    AppendParams<T, C4> p;
    p.tokens = N, p.heads = H, p.query_heads = Hq, p.head_dim = D;
    p.rotary_dim = R == D ? 0 : R;
    p.style = style;
    p.query = thd(q.data(), Hq, D);
    p.key = thd(k.data(), H, D);
    if (with_k_out) p.key_out = thd(k_out.data(), H, D);
    p.key_in_place = key_in_place;
    p.value = thd<const T>(v.data(), H, D);
    p.positions = pos.data();
    p.cos_sin_cache_f32 = table_f32.data();
    p.max_position = max_position;
    p.key_norm_weight = k_weight.empty() ? nullptr : k_weight.data();
    p.key_cache = view(kc.data(), D / 2);
    p.value_cache = view(vc.data(), D / 2);
    p.key_block_scales = view(ks.data(), D / 16);
    p.value_block_scales = view(vs.data(), D / 16);
    p.page_size = P;
    p.num_pages = pages;
    p.slot_mapping = slots.data();
    p.key_scale = k_scale.empty() ? nullptr : k_scale.data();
    p.value_scale = v_scale.empty() ? nullptr : v_scale.data();
    p.scale_per_head = per_head;
    return p;
  }
};

std::vector<uint8_t> bytes(const uint8_t* p, size_t n) { return std::vector<uint8_t>(p, p + n); }

// Every e2m1 magnitude and its negative: with amax 6 and s·g = 1 the codes are 0 .. 15 in order.
const float kLadder[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
const std::vector<uint8_t> kLadderCodes{0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE};

}  // namespace

TEST_CASE("cpu_append: NVFP4 caches hold the blocks of the key in T and of v under the head's global scale",
          "[host][reference][append][nvfp4]") {
  using T = __nv_bfloat16;
  // One token, H = 2, D = 32 (two blocks), identity rotation; slot 1 of two pages of one slot. Block 0 of
  // k and v is the ladder; block 1 is eight 3s and eight -1s (amax 3).
  //   g = 1: q = 6 / 6 = 1, scale 1.0 (0x38), r = 1: the ladder's codes; block 1: q = 0.5 (0x30), r = 2:
  //   3 -> 6 (0x7), -1 -> -2 (0xC): bytes 0x77 x 4, 0xCC x 4.
  //   g = 0.5 (head 1 with per-head scales): q = 6 / 3 = 2 (0x40), r = 1 / (2 * 0.5) = 1: the same codes;
  //   block 1: q = 1 (0x38), r = 2: the same codes.
  for (const bool per_head : {false, true}) {
    INFO((per_head ? "scales [H]" : "one scale"));
    Host4<T> h(1, 2, 0, 32, 32, 1, 2);
    for (int64_t j = 0; j < 2; ++j)
      for (int i = 0; i < 16; ++i) {
        h.k[j * 32 + i] = h.v[j * 32 + i] = from_float<T>(kLadder[i]);
        h.k[j * 32 + 16 + i] = h.v[j * 32 + 16 + i] = from_float<T>(i < 8 ? 3.0f : -1.0f);
      }
    h.k_scale = h.v_scale = per_head ? std::vector<float>{1.0f, 0.5f} : std::vector<float>{1.0f};
    h.per_head = per_head;
    h.slots = {1};
    const reference::AppendGold g = reference::cpu_append(h.params());
    REQUIRE(g.key_nvfp4.size() == 2 * 2 * 16);
    REQUIRE(g.key_nvfp4_scales.size() == 2 * 2 * 2);
    for (int64_t j = 0; j < 2; ++j) {
      INFO("head " << j);
      const int64_t r = 1 * 2 + j;  // slot 1
      const bool half = per_head && j == 1;
      for (const auto* codes : {&g.key_nvfp4, &g.value_nvfp4}) {
        // The key's -0 (element 8) rotates to +0: -0 * 1 - (-1) * 0 (its partner, element 24, is -1).
        std::vector<uint8_t> want = kLadderCodes;
        if (codes == &g.key_nvfp4) want[4] = 0x90;
        CHECK(bytes(codes->data() + r * 16, 8) == want);
        CHECK(bytes(codes->data() + r * 16 + 8, 8) ==
              std::vector<uint8_t>{0x77, 0x77, 0x77, 0x77, 0xCC, 0xCC, 0xCC, 0xCC});
      }
      for (const auto* scales : {&g.key_nvfp4_scales, &g.value_nvfp4_scales}) {
        CHECK(int((*scales)[r * 2]) == (half ? 0x40 : 0x38));
        CHECK(int((*scales)[r * 2 + 1]) == (half ? 0x38 : 0x30));
      }
      // Before quantization: the values themselves.
      CHECK(g.key_cache[r * 32 + 7].value == 6.0);
      CHECK(g.value_cache[r * 32 + 17] == 3.0);
    }
    // Slot 0 is not written: its bytes as they were, its values decoded (0x5A: codes 0xA (-1) and 0x5 (3);
    // scale 0x33 = 1.375 * 2^-1).
    CHECK(bytes(g.key_nvfp4.data(), 16) == std::vector<uint8_t>(16, 0x5A));
    CHECK(bytes(g.value_nvfp4_scales.data(), 2) == std::vector<uint8_t>(2, 0x33));
    CHECK(g.key_cache[0].value == -1.0 * 0.6875);
    CHECK(g.key_cache[1].value == 3.0 * 0.6875);
  }
}

TEST_CASE("cpu_append: an NVFP4 row is nvfp4_quantize_row of the rotated key rounded to T, in every layout",
          "[host][reference][append][nvfp4]") {
  using T = __half;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (const bool hnd : {false, true})
    for (const bool norm : {false, true}) {
      INFO((hnd ? "HND" : "NHD") << (norm ? ", k normed" : ""));
      Host4<T> h(5, 2, 1, 64, 32, 2, 4);  // R = 32: blocks 2 and 3 pass through
      h.hnd = hnd;
      h.style = RotaryStyle::kInterleaved;
      for (auto* b : {&h.q, &h.k, &h.v}) {
        for (T& x : *b) x = from_float<T>(normal(rng));
      }
      for (float& x : h.table_f32) x = normal(rng);
      if (norm) {
        h.k_weight.resize(64);
        for (T& x : h.k_weight) x = from_float<T>(normal(rng));
      }
      h.k_scale = {0.02f};
      h.v_scale = {3.0f};
      h.slots = {6, 2, 6, -1, 100};  // slot 6 twice (token 2 wins), a padding slot, one out of range
      h.pos = {0, 1, 2, 3, 4};
      const AppendParams<T, C4> in = h.params();
      const reference::AppendGold g = reference::cpu_append(in);
      CHECK(g.error_flag.required == kErrorSlotOutOfRange);
      for (const auto& [slot, t] : {std::pair<int64_t, int64_t>{6, 2}, {2, 1}})
        for (int64_t j = 0; j < 2; ++j) {
          std::vector<float> key(64), value(64);
          for (int64_t d = 0; d < 64; ++d) {
            key[d] = to_float(reference::detail::round_to<T>(g.key[(t * 2 + j) * 64 + d].value));
            value[d] = to_float(h.v[(t * 2 + j) * 64 + d]);
          }
          std::vector<uint8_t> codes(32), scales(4);
          reference::nvfp4_quantize_row(key.data(), 64, 0.02f, codes.data(), scales.data());
          const int64_t r = slot * 2 + j;
          CHECK(bytes(g.key_nvfp4.data() + r * 32, 32) == codes);
          CHECK(bytes(g.key_nvfp4_scales.data() + r * 4, 4) == scales);
          reference::nvfp4_quantize_row(value.data(), 64, 3.0f, codes.data(), scales.data());
          CHECK(bytes(g.value_nvfp4.data() + r * 32, 32) == codes);
          CHECK(bytes(g.value_nvfp4_scales.data() + r * 4, 4) == scales);
        }
      // Unwritten slots keep their bytes.
      CHECK(bytes(g.value_nvfp4.data() + 0, 64) == std::vector<uint8_t>(64, 0xA5));
    }
}

// ---------------------------------------------------------------------------------------------------
// check_append on NVFP4 caches.
// ---------------------------------------------------------------------------------------------------

namespace {

// What a correct call leaves, from the reference (its correctly rounded blocks).
template <typename T>
struct Made4 {
  std::vector<T> q, k, k_out, v;
  std::vector<C4> kc, vc;
  std::vector<__nv_fp8_e4m3> ks, vs;
  verify::AppendOutputs<T, C4> out;
};

template <typename T>
Made4<T> make_outputs4(Host4<T>& h, const reference::AppendGold& g) {
  Made4<T> m;
  m.q.clear();
  for (const auto& e : g.query) m.q.push_back(reference::detail::round_to<T>(e.value));  // q in place
  m.k = h.k;
  m.k_out = h.k_out;
  for (size_t i = 0; i < g.key.size(); ++i) {
    const T r = reference::detail::round_to<T>(g.key[i].value);
    if (h.with_k_out) m.k_out[i] = r;
    if (h.key_in_place) m.k[i] = r;
  }
  m.v = h.v;
  m.kc = h.kc, m.vc = h.vc, m.ks = h.ks, m.vs = h.vs;
  const int64_t half = h.D / 2, blocks = h.D / 16;
  PagedCache<C4> kc = h.view(m.kc.data(), half), vc = h.view(m.vc.data(), half);
  PagedCache<__nv_fp8_e4m3> ks = h.view(m.ks.data(), blocks), vs = h.view(m.vs.data(), blocks);
  for (int64_t s = 0; s < h.pages * h.P; ++s)
    for (int64_t j = 0; j < h.H; ++j) {
      const int64_t r = s * h.H + j;
      std::memcpy(kc.row(s / h.P, s % h.P, j), g.key_nvfp4.data() + r * half, half);
      std::memcpy(vc.row(s / h.P, s % h.P, j), g.value_nvfp4.data() + r * half, half);
      std::memcpy(ks.row(s / h.P, s % h.P, j), g.key_nvfp4_scales.data() + r * blocks, blocks);
      std::memcpy(vs.row(s / h.P, s % h.P, j), g.value_nvfp4_scales.data() + r * blocks, blocks);
    }
  m.out.query = thd<const T>(m.q.data(), h.Hq, h.D);
  m.out.key = thd<const T>(m.k.data(), h.H, h.D);
  if (h.with_k_out) m.out.key_out = thd<const T>(m.k_out.data(), h.H, h.D);
  m.out.value = thd<const T>(m.v.data(), h.H, h.D);
  m.out.key_cache = h.template view<const C4>(m.kc.data(), half);
  m.out.value_cache = h.template view<const C4>(m.vc.data(), half);
  m.out.key_block_scales = h.template view<const __nv_fp8_e4m3>(m.ks.data(), blocks);
  m.out.value_block_scales = h.template view<const __nv_fp8_e4m3>(m.vs.data(), blocks);
  return m;
}

Host4<__nv_bfloat16> random_host4(int key_mode, uint64_t seed) {
  Host4<__nv_bfloat16> h(6, 2, 2, 64, 64, 2, 4);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  for (auto* b : {&h.q, &h.k, &h.v})
    for (auto& x : *b) x = from_float<__nv_bfloat16>(normal(rng));
  for (float& x : h.table_f32) x = normal(rng);
  for (auto& c : h.kc) c.bits = static_cast<uint8_t>(rng());
  for (auto& c : h.vc) c.bits = static_cast<uint8_t>(rng());
  h.with_k_out = key_mode == 0;
  h.key_in_place = key_mode == 1;
  h.k_scale = {0.01f, 0.2f};
  h.v_scale = {1.0f, 0.003f};
  h.per_head = true;
  h.hnd = true;
  h.slots = {3, -1, 3, 0, 8, 6};
  h.pos = {0, 1, 2, 3, 4, 99};  // token 5 invalid
  return h;
}

uint8_t& byte_of(const PagedCache<C4>& c, int64_t page, int64_t off, int64_t j, int64_t i) {
  return c.row(page, off, j)[i].bits;
}
uint8_t& byte_of(const PagedCache<__nv_fp8_e4m3>& c, int64_t page, int64_t off, int64_t j, int64_t i) {
  return reinterpret_cast<uint8_t*>(c.row(page, off, j))[i];
}

}  // namespace

TEST_CASE("check_append on NVFP4 caches: every block byte of a written row, the others unchanged",
          "[host][reference][append][checker][nvfp4]") {
  using T = __nv_bfloat16;
  for (int key_mode = 0; key_mode < 3; ++key_mode) {  // 0: key_out, 1: key in place, 2: neither
    INFO("key mode " << key_mode);
    Host4<T> h = random_host4(key_mode, 21);
    const AppendParams<T, C4> in = h.params();
    const reference::AppendGold g = reference::cpu_append(in);
    Made4<T> m = make_outputs4(h, g);
    verify::CheckResult r = verify::check_append(in, m.out);
    INFO(r.first_mismatch);
    REQUIRE(r.ok());
    CHECK(reference::slot_writers(in) == std::vector<int64_t>{3, -1, -1, 2, -1, -1, -1, -1});
    const PagedCache<C4> kc = h.view(m.kc.data(), 32), vc = h.view(m.vc.data(), 32);
    const PagedCache<__nv_fp8_e4m3> ks = h.view(m.ks.data(), 4), vs = h.view(m.vs.data(), 4);
    struct Case {
      uint8_t* byte;
      const char* name;
      bool caught_loosely;  // (key mode 2: a key block within one step of the reference's passes)
    };
    const Case cases[] = {
        {&byte_of(vc, 1, 1, 0, 5), "value_cache", true},         // slot 3, written
        {&byte_of(vs, 0, 0, 1, 2), "value_block_scales", true},  // slot 0, written
        {&byte_of(kc, 2, 0, 1, 0), "key_cache", true},           // slot 4, unwritten
        {&byte_of(ks, 3, 1, 0, 3), "key_block_scales", true},    // slot 7, unwritten
        {&byte_of(kc, 1, 1, 1, 9), "key_cache", false},          // slot 3, written
        {&byte_of(ks, 0, 0, 0, 1), "key_block_scales", false},   // slot 0, written
    };
    for (const Case& c : cases) {
      INFO("changed: " << c.name);
      const uint8_t saved = *c.byte;
      *c.byte = static_cast<uint8_t>(saved ^ 0x01);  // one step in the low nibble's code, or in the scale
      r = verify::check_append(in, m.out);
      const bool expect_caught = key_mode != 2 || c.caught_loosely;
      CHECK((r.mismatches >= 1) == expect_caught);
      if (expect_caught) CHECK(r.first_mismatch.find(c.name) != std::string::npos);
      *c.byte = static_cast<uint8_t>(saved ^ 0x22);  // two steps in both nibbles, or the scale two codes off
      if (key_mode == 2 && !c.caught_loosely) {
        r = verify::check_append(in, m.out);
        CHECK(r.mismatches >= 1);
        CHECK(r.first_mismatch.find("key_cache") != std::string::npos);
      }
      *c.byte = saved;
    }
  }
}

TEST_CASE("check_append on NVFP4 caches asks the oracle once for every block's quotient and reciprocal",
          "[host][reference][append][checker][nvfp4]") {
  using T = __nv_bfloat16;
  Host4<T> h = random_host4(0, 22);
  const AppendParams<T, C4> in = h.params();
  const reference::AppendGold g = reference::cpu_append(in);
  Made4<T> m = make_outputs4(h, g);
  int calls = 0;
  size_t asked = 0;
  // The correctly rounded answers: the reference's blocks pass.
  const verify::Nvfp4Oracle exact = [&](const std::vector<std::array<float, 2>>& q) {
    ++calls;
    asked = q.size();
    std::vector<reference::Nvfp4Approx> out;
    for (const auto& [amax, gs] : q) {
      const float quotient = reference::nvfp4_quotient(amax, gs);
      const double s = reference::fp8_decode(reference::fp8_encode(quotient, reference::Fp8Format::kE4M3),
                                             reference::Fp8Format::kE4M3);
      out.push_back({quotient, reference::nvfp4_inverse(amax, s, gs)});
    }
    return out;
  };
  verify::CheckResult r = verify::check_append(in, m.out, exact);
  INFO(r.first_mismatch);
  CHECK(r.ok());
  CHECK(calls == 1);
  // Two written slots, two heads, k and v, four blocks each: at most 32 (amax, g) pairs (bf16 blocks may share
  // their amax).
  CHECK(asked > 16);
  CHECK(asked <= 2 * 2 * 2 * 4);
  // An oracle whose reciprocal is 0: every code is a signed zero, so the reference's blocks fail.
  const verify::Nvfp4Oracle zero = [&](const std::vector<std::array<float, 2>>& q) {
    std::vector<reference::Nvfp4Approx> out = exact(q);
    for (auto& a : out) a.inv = 0.0f;
    return out;
  };
  r = verify::check_append(in, m.out, zero);
  CHECK(r.mismatches > 0);
}

// ---------------------------------------------------------------------------------------------------
// validate() for NVFP4 caches.
// ---------------------------------------------------------------------------------------------------

namespace {
constexpr int64_t kN = 8, kH = 2, kHq = 4, kP = 16, kPages = 4, kMaxPos = 100;

// Host buffers standing in for device memory (validate() never dereferences them), aligned to 16 bytes.
template <typename T>
struct Buffers4 {
  int64_t D;
  std::vector<uint4> q, q_out, k, v, k_out, kc, vc, ks, vs, other, table_f32, weight;
  std::vector<int64_t> pos = std::vector<int64_t>(kN), slots = std::vector<int64_t>(kN);
  std::vector<float> scales = std::vector<float>(kH);
  template <typename U>
  static U* as(std::vector<uint4>& v) {
    return reinterpret_cast<U*>(v.data());
  }
  // n bytes and 1 KiB of slack (a stride made odd reaches past the rows).
  static std::vector<uint4> bytes(int64_t n) { return std::vector<uint4>(static_cast<size_t>((n + 15) / 16 + 64)); }

  explicit Buffers4(int64_t d) : D(d) {
    const int64_t t = sizeof(T);
    q = q_out = bytes(kN * kHq * D * t);
    k = v = k_out = bytes(kN * kH * D * t);
    kc = vc = bytes(kPages * kP * kH * D / 2);
    ks = vs = bytes(kPages * kP * kH * D / 16);
    table_f32 = bytes(kMaxPos * D * 4);
    weight = bytes(D * t);
  }
  AppendParams<T, C4> params() {
    AppendParams<T, C4> p;
    p.tokens = kN, p.heads = kH, p.query_heads = kHq, p.head_dim = D;
    p.query = thd(as<T>(q), kHq, D);
    p.key = thd(as<T>(k), kH, D);
    p.key_out = thd(as<T>(k_out), kH, D);
    p.value = thd<const T>(as<T>(v), kH, D);
    p.positions = pos.data();
    p.cos_sin_cache_f32 = as<float>(table_f32);
    p.max_position = kMaxPos;
    p.key_cache = nhd_pages(as<C4>(kc), kP, kH, D / 2);
    p.value_cache = hnd_pages(as<C4>(vc), kP, kH, D / 2);
    p.key_block_scales = nhd_pages(as<__nv_fp8_e4m3>(ks), kP, kH, D / 16);
    p.value_block_scales = hnd_pages(as<__nv_fp8_e4m3>(vs), kP, kH, D / 16);
    p.page_size = kP;
    p.num_pages = kPages;
    p.slot_mapping = slots.data();
    return p;
  }
};

template <typename T, typename C>
void expect4(const AppendParams<T, C>& p, StatusCode code, const char* field, const char* other = nullptr) {
  const Status s = validate(p);
  INFO("got " << to_string(s.code) << " / " << (s.field ? s.field : "(none)") << " / "
              << (s.other ? s.other : "(none)"));
  CHECK(s.code == code);
  CHECK(std::string(s.field ? s.field : "") == std::string(field ? field : ""));
  if (other) CHECK(std::string(s.other ? s.other : "") == std::string(other));
}
}  // namespace

TEMPLATE_TEST_CASE("append validate, NVFP4 caches: valid calls pass", "[host][validate][append][nvfp4]", __nv_bfloat16,
                   __half, float) {
  using T = TestType;
  for (const int64_t d : {int64_t{64}, int64_t{96}, int64_t{128}, int64_t{256}}) {
    INFO("D = " << d);
    Buffers4<T> buf(d);
    auto p = buf.params();
    expect4(p, StatusCode::kSuccess, nullptr);
    p.key_scale = p.value_scale = buf.scales.data();  // the global scales
    expect4(p, StatusCode::kSuccess, nullptr);
    p.scale_per_head = true;
    expect4(p, StatusCode::kSuccess, nullptr);
    p.rotary_dim = 32;  // a partial rotary of whole blocks
    p.style = RotaryStyle::kInterleaved;
    p.key_norm_weight = p.query_norm_weight = Buffers4<T>::template as<T>(buf.weight);
    expect4(p, StatusCode::kSuccess, nullptr);
    p.query_out_fp8 = {Buffers4<T>::template as<__nv_fp8_e4m3>(buf.q_out), kHq * d, d};
    expect4(p, StatusCode::kSuccess, nullptr);
    p = buf.params();
    p.key_out = {};
    p.key_in_place = true;
    expect4(p, StatusCode::kSuccess, nullptr);
  }
  // The largest head dim: 64 chunks of 16 bytes.
  Buffers4<T> big(64 * 16 / sizeof(T));
  expect4(big.params(), StatusCode::kSuccess, nullptr);
}

TEMPLATE_TEST_CASE("append validate, NVFP4 caches: what the format needs, each refusal naming its field",
                   "[host][validate][append][nvfp4]", __nv_bfloat16, __half, float) {
  using T = TestType;
  constexpr StatusCode kNo = StatusCode::kUnsupportedByCacheFormat;
  // D and R multiples of 32 (D even otherwise fine: 48, 80, 112), D at most 64 chunks of 16 bytes.
  for (const int64_t d : {int64_t{48}, int64_t{80}, int64_t{112}, int64_t{16}}) {
    Buffers4<T> buf(d);
    expect4(buf.params(), kNo, "head_dim");
  }
  {
    Buffers4<T> buf(64 * 16 / sizeof(T) + 32);
    expect4(buf.params(), kNo, "head_dim");
  }
  Buffers4<T> buf(128);
  auto p = buf.params();
  for (const int64_t r : {int64_t{16}, int64_t{48}, int64_t{2}, int64_t{120}}) {
    p.rotary_dim = r;
    expect4(p, kNo, "rotary_dim");
  }
  // An empty call needs no alignment, but its shape is still the format's.
  p = buf.params();
  p.tokens = 0;
  p.query.data += 1;
  expect4(p, StatusCode::kSuccess, nullptr);
  p.head_dim = 80;
  expect4(p, kNo, "head_dim");
  // The vector path: every row 16-byte aligned, the cache rows to a chunk's codes.
  struct Case {
    void (*change)(AppendParams<T, C4>&);
    const char* field;
  };
  const Case cases[] = {
      {[](AppendParams<T, C4>& p) { p.query.data += 1; }, "query"},
      {[](AppendParams<T, C4>& p) { p.key.token_stride += 1; }, "key"},
      {[](AppendParams<T, C4>& p) { p.value.data += 2; }, "value"},
      {[](AppendParams<T, C4>& p) { p.key_out.data += 2; }, "key_out"},
      {[](AppendParams<T, C4>& p) { p.key_norm_weight = p.key.data + 1; }, "key_norm_weight"},
      {[](AppendParams<T, C4>& p) { p.key_cache.data += 1; }, "key_cache"},
      {[](AppendParams<T, C4>& p) { p.value_cache.page_stride += 1; }, "value_cache"},
  };
  for (const Case& c : cases) {
    INFO(c.field);
    p = buf.params();
    c.change(p);
    expect4(p, kNo, c.field);
  }
  // A cache row aligned to 2 bytes is enough for fp32's 4-value chunks (2 bytes of codes), not for 8.
  p = buf.params();
  p.key_cache.data += 2;
  if (sizeof(T) == 4)
    expect4(p, StatusCode::kSuccess, nullptr);
  else
    expect4(p, kNo, "key_cache");
  // Block scales are bytes: any alignment.
  p = buf.params();
  p.key_block_scales.data += 1;
  p.value_block_scales.page_stride += 3;
  expect4(p, StatusCode::kSuccess, nullptr);
}

TEST_CASE("append validate, NVFP4 caches: the block scales are required, disjoint and NVFP4's only",
          "[host][validate][append][nvfp4]") {
  using T = __nv_bfloat16;
  Buffers4<T> buf(64);
  auto p = buf.params();
  p.key_block_scales.data = nullptr;
  expect4(p, StatusCode::kNullPointer, "key_block_scales");
  p = buf.params();
  p.value_block_scales.data = nullptr;
  expect4(p, StatusCode::kNullPointer, "value_block_scales");
  p = buf.params();
  p.key_block_scales.offset_stride = 2;  // rows of 4 bytes, 2 apart
  expect4(p, StatusCode::kOverlappingRows, "key_block_scales.offset_stride");
  p = buf.params();
  p.value_block_scales.page_stride = -1;
  expect4(p, StatusCode::kInvalidStride, "value_block_scales.page_stride");
  p = buf.params();
  p.key_block_scales.data = reinterpret_cast<__nv_fp8_e4m3*>(p.key_cache.data) + 8;  // inside the codes
  expect4(p, StatusCode::kAliasedBuffers, "key_block_scales", "key_cache");
  p = buf.params();
  p.value_block_scales = p.key_block_scales;
  expect4(p, StatusCode::kAliasedBuffers, "value_block_scales", "key_block_scales");
  p = buf.params();
  // Key rows of D bytes (twice a code row) reach into value_cache: both inside one buffer, so that no other
  // buffer the heap put after the key cache's is reached (validate named the table on some runs).
  std::vector<uint4> wide = Buffers4<T>::bytes(2 * kPages * kP * kH * 64);
  p.key_cache = nhd_pages(Buffers4<T>::template as<C4>(wide), kP, kH, 64);
  p.value_cache = nhd_pages(p.key_cache.data + kPages * kP * kH * 32, kP, kH, 32);
  expect4(p, StatusCode::kAliasedBuffers, "value_cache", "key_cache");
  // No heads: no cache rows, so no block scales needed.
  p = buf.params();
  p.heads = 0;
  p.key = p.key_out = {};
  p.value = {};
  p.key_block_scales = p.value_block_scales = {};
  p.key_cache = p.value_cache = {};
  expect4(p, StatusCode::kSuccess, nullptr);

  // Block scales for a cache that has none: conflicting.
  std::vector<T> kc(kPages * kP * kH * 64), vc = kc;
  std::vector<__nv_fp8_e4m3> sf(kPages * kP * kH * 4);
  AppendParams<T, T> t;
  t.tokens = kN, t.heads = kH, t.query_heads = 0, t.head_dim = 64;
  t.key = thd(Buffers4<T>::as<T>(buf.k), kH, 64);
  t.value = thd<const T>(Buffers4<T>::as<T>(buf.v), kH, 64);
  t.positions = buf.pos.data();
  t.cos_sin_cache_f32 = Buffers4<T>::as<float>(buf.table_f32);
  t.max_position = kMaxPos;
  t.key_cache = nhd_pages(kc.data(), kP, kH, 64);
  t.value_cache = nhd_pages(vc.data(), kP, kH, 64);
  t.page_size = kP;
  t.num_pages = kPages;
  t.slot_mapping = buf.slots.data();
  expect4(t, StatusCode::kSuccess, nullptr);
  t.key_block_scales = nhd_pages(sf.data(), kP, kH, 4);
  expect4(t, StatusCode::kConflictingFields, "key_block_scales", "key_cache");
  t.key_block_scales = {};
  t.value_block_scales = nhd_pages(sf.data(), kP, kH, 4);
  expect4(t, StatusCode::kConflictingFields, "value_block_scales", "value_cache");
  CHECK(std::string(to_string(StatusCode::kUnsupportedByCacheFormat)).find("NVFP4") != std::string::npos);
}
