// Host tests of the float64 CPU reference of the forward (docs/spec.md §2) and its checker (verify/) on cases small
// enough to work by hand, the host side of the naive GPU forward (validation, workspace), and the adjoint test of the
// forward and backward references in float64 (§2.8).
#include <kvrope/reference/cpu_backward.hpp>
#include <kvrope/reference/cpu_forward.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "verify/naive/naive_forward.cuh"
#include "support/catch.hpp"
#include "verify/check_forward.hpp"

using namespace kvrope;

namespace {

// A forward problem on contiguous BHSD host vectors. Per-token tables [B, S, R] unless `cache` or `cache_f32`
// is filled (a table cache [max_position, R] indexed by `ids`).
template <typename T, typename Pos = int64_t>
struct Host {
  int64_t B, H, S, L, D, R, Hq;
  RotaryStyle style = RotaryStyle::kRotateHalf;
  std::vector<T> k, v, key_cache, value_cache, key_out, q, q_out, cos, sin, cache;
  std::vector<float> cache_f32;
  std::vector<Pos> pos, ids;
  int64_t max_position = 0, ids_batch_stride = 0;
  bool broadcast_tables = false;  // cos / sin of batch_stride 0
  bool with_key_out = true, with_q_out = false;

  Host(int64_t b, int64_t h, int64_t s, int64_t l, int64_t d, int64_t r, int64_t hq = 0)
      : B(b), H(h), S(s), L(l), D(d), R(r), Hq(hq) {
    const T zero = from_float<T>(0.0f);
    k.assign(B * H * S * D, zero);
    v = key_out = k;
    key_cache.assign(B * H * L * D, zero);
    value_cache = key_cache;
    q.assign(B * Hq * S * D, zero);
    q_out = q;
    cos.assign(B * S * R, zero);
    sin = cos;
    pos.assign(S, 0);
  }

  ForwardParams<T, Pos> params() {
    ForwardParams<T, Pos> p;
    p.batch = B, p.heads = H, p.seq_len = S, p.cache_len = L, p.head_dim = D;
    p.rotary_dim = R == D ? 0 : R;  // 0 means R = D
    p.style = style;
    p.key_states = bhsd<const T>(k.data(), H, S, D);
    p.value_states = bhsd<const T>(v.data(), H, S, D);
    p.key_cache = bhsd(key_cache.data(), H, L, D);
    p.value_cache = bhsd(value_cache.data(), H, L, D);
    p.cache_position = pos.data();
    if (with_key_out) p.key_out = bhsd(key_out.data(), H, S, D);
    p.query_heads = Hq;
    p.query = bhsd(q.data(), Hq, S, D);
    if (with_q_out) p.query_out = bhsd(q_out.data(), Hq, S, D);
    if (!cache.empty() || !cache_f32.empty()) {
      p.cos_sin_cache = cache.empty() ? nullptr : cache.data();
      p.cos_sin_cache_f32 = cache_f32.empty() ? nullptr : cache_f32.data();
      p.max_position = max_position;
      p.position_ids = ids.data();
      p.position_ids_batch_stride = ids_batch_stride;
    } else {
      p.cos = bsd<const T>(cos.data(), S, R, broadcast_tables);
      p.sin = bsd<const T>(sin.data(), S, R, broadcast_tables);
    }
    return p;
  }
};

// Index of [b, j, s, d] in a contiguous [B, J, N, D] tensor.
int64_t at4(int64_t J, int64_t N, int64_t D, int64_t b, int64_t j, int64_t s, int64_t d) {
  return ((b * J + j) * N + s) * D + d;
}

std::vector<double> values(const std::vector<reference::Gold>& g, size_t begin, size_t count) {
  std::vector<double> out;
  for (size_t i = begin; i < begin + count; ++i) out.push_back(g[i].value);
  return out;
}

template <typename T>
std::vector<T> rounded(const std::vector<reference::Gold>& g) {
  std::vector<T> out;
  for (const auto& x : g) out.push_back(from_float<T>(static_cast<float>(x.value)));
  return out;
}
template <typename T>
std::vector<T> rounded(const std::vector<double>& g) {
  std::vector<T> out;
  for (double x : g) out.push_back(from_float<T>(static_cast<float>(x)));
  return out;
}

// The next representable bf16 above x (one bit of the mantissa).
__nv_bfloat16 next_up(__nv_bfloat16 x) {
  __nv_bfloat16_raw raw = x;
  raw.x = static_cast<unsigned short>(raw.x + 1);
  return __nv_bfloat16(raw);
}

// x = [1, 2, ..., D]; cos = [.5, .25, -1, 2], sin = [.75, -.5, .125, 1] over R = 4 (exact in float and bf16).
constexpr float kCos[4] = {0.5f, 0.25f, -1.0f, 2.0f};
constexpr float kSin[4] = {0.75f, -0.5f, 0.125f, 1.0f};

}  // namespace

TEST_CASE("cpu_forward on cases worked by hand: both styles, R = D and R = D / 2", "[host][reference][forward]") {
  struct Case {
    RotaryStyle style;
    int64_t D, R;
    std::vector<double> rotated;  // RoPE([1, ..., D])
    double abs_sum0, abs_sum3;    // A of elements 0 and 3
  };
  // rotate-half, R = 4: pairs (0, 2), (1, 3)        interleaved: pairs (0, 1), (2, 3)
  //   out0 = 1*.5 - 3*.75 = -1.75                     out0 = 1*.5 - 2*.75 = -1
  //   out1 = 2*.25 - 4*(-.5) = 2.5                    out1 = 2*.25 + 1*(-.5) = 0
  //   out2 = 3*(-1) + 1*.125 = -2.875                 out2 = 3*(-1) - 4*.125 = -3.5
  //   out3 = 4*2 + 2*1 = 10                           out3 = 4*2 + 3*1 = 11
  // With D = 8 and R = 4, elements 4..7 pass through.
  const Case cases[] = {
      {RotaryStyle::kRotateHalf, 4, 4, {-1.75, 2.5, -2.875, 10}, 0.5 + 2.25, 8 + 2},
      {RotaryStyle::kInterleaved, 4, 4, {-1, 0, -3.5, 11}, 0.5 + 1.5, 8 + 3},
      {RotaryStyle::kRotateHalf, 8, 4, {-1.75, 2.5, -2.875, 10, 5, 6, 7, 8}, 0.5 + 2.25, 8 + 2},
      {RotaryStyle::kInterleaved, 8, 4, {-1, 0, -3.5, 11, 5, 6, 7, 8}, 0.5 + 1.5, 8 + 3},
  };
  for (const Case& c : cases) {
    INFO("style " << static_cast<int>(c.style) << ", D " << c.D << ", R " << c.R);
    // B = 1, H = 1, S = 1, S_max = 2, Hq = 1 (q = 2 x, rotated in place), cache_position = [1].
    Host<float> h(1, 1, 1, 2, c.D, c.R, 1);
    h.style = c.style;
    for (int64_t d = 0; d < c.D; ++d) {
      h.k[d] = static_cast<float>(d + 1);
      h.v[d] = static_cast<float>(100 + d);
      h.q[d] = static_cast<float>(2 * (d + 1));
      h.key_cache[d] = h.key_cache[c.D + d] = 9;
      h.value_cache[d] = h.value_cache[c.D + d] = 99;
    }
    for (int64_t e = 0; e < c.R; ++e) h.cos[e] = kCos[e], h.sin[e] = kSin[e];
    h.pos = {1};
    const reference::ForwardGold g = reference::cpu_forward(h.params());

    CHECK(values(g.key_cache, c.D, c.D) == c.rotated);                    // row 1 written
    CHECK(values(g.key_cache, 0, c.D) == std::vector<double>(c.D, 9.0));  // row 0 untouched
    CHECK(values(g.key_out, 0, c.D) == c.rotated);
    std::vector<double> v_row, twice;
    for (int64_t d = 0; d < c.D; ++d) v_row.push_back(100.0 + d), twice.push_back(2 * c.rotated[d]);
    CHECK(std::vector<double>(g.value_cache.begin() + c.D, g.value_cache.end()) == v_row);
    CHECK(std::vector<double>(g.value_cache.begin(), g.value_cache.begin() + c.D) == std::vector<double>(c.D, 99.0));
    CHECK(values(g.query, 0, c.D) == twice);
    CHECK(g.key_out[0].abs_sum == c.abs_sum0);
    CHECK(g.key_out[3].abs_sum == c.abs_sum3);
    CHECK(g.key_cache[0].abs_sum == 0);                 // an untouched row is a copy
    if (c.D > c.R) CHECK(g.key_out[c.R].abs_sum == 0);  // a pass-through element is a copy
    CHECK(g.error_flag == 0);
  }
}

TEST_CASE("cpu_forward with a table cache in fp32 and in T, position ids [S] and [B, S]",
          "[host][reference][forward]") {
  using T = __nv_bfloat16;
  // B = 2, H = 1, S = 1, S_max = 2, D = 8, R = 4, max_position = 3. Row 2 of the table cache: cos [.5, -1],
  // sin [.75, .25] (one angle a pair); row 0: the identity.
  const float table[3][4] = {{1, 1, 0, 0}, {3, 3, 3, 3}, {0.5f, -1, 0.75f, 0.25f}};
  // rotate-half, pairs (0, 2) angle 0 and (1, 3) angle 1:       interleaved, pairs (0, 1) angle 0, (2, 3) angle 1:
  //   out0 = 1*.5 - 3*.75 = -1.75,  out2 = 3*.5 + 1*.75 = 2.25    out0 = 1*.5 - 2*.75 = -1,  out1 = 2*.5 + 1*.75 = 1.75
  //   out1 = 2*(-1) - 4*.25 = -3,   out3 = 4*(-1) + 2*.25 = -3.5  out2 = 3*(-1) - 4*.25 = -4, out3 = 4*(-1) + 3*.25 =
  //   -3.25
  const std::vector<double> rotate_half{-1.75, -3, 2.25, -3.5, 5, 6, 7, 8};
  const std::vector<double> interleaved{-1, 1.75, -4, -3.25, 5, 6, 7, 8};
  const std::vector<double> identity{1, 2, 3, 4, 5, 6, 7, 8};
  for (RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
    for (bool f32 : {false, true})
      for (bool per_batch_ids : {false, true}) {
        INFO("style " << static_cast<int>(style) << (f32 ? ", fp32 cache" : ", bf16 cache")
                      << (per_batch_ids ? ", ids [B, S]" : ", ids [S]"));
        Host<T, int32_t> h(2, 1, 1, 2, 8, 4);
        h.style = style;
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t d = 0; d < 8; ++d) h.k[b * 8 + d] = from_float<T>(static_cast<float>(d + 1));
        for (int r = 0; r < 3; ++r)
          for (int c = 0; c < 4; ++c) {
            if (f32)
              h.cache_f32.push_back(table[r][c]);
            else
              h.cache.push_back(from_float<T>(table[r][c]));
          }
        h.max_position = 3;
        h.ids = per_batch_ids ? std::vector<int32_t>{2, 0} : std::vector<int32_t>{2};
        h.ids_batch_stride = per_batch_ids ? 1 : 0;
        h.pos = {0};
        const reference::ForwardGold g = reference::cpu_forward(h.params());
        const std::vector<double>& want = style == RotaryStyle::kRotateHalf ? rotate_half : interleaved;
        CHECK(values(g.key_out, 0, 8) == want);
        CHECK(values(g.key_out, 8, 8) == (per_batch_ids ? identity : want));  // batch 1: id 0 or id 2
        CHECK(values(g.key_cache, 0, 8) == want);                             // batch 0, row 0
        CHECK(values(g.key_cache, 16, 8) == (per_batch_ids ? identity : want));
        CHECK(g.error_flag == 0);
      }
}

TEST_CASE("cpu_forward: the last token naming a row wins, negative positions wrap", "[host][reference][forward]") {
  // S = 3, S_max = 3, D = R = 2, identity tables: cache_position [2, 0, -1] (-1 is row 2): row 2 gets token 2.
  Host<float> h(1, 1, 3, 3, 2, 2);
  for (int64_t t = 0; t < 3; ++t) {
    h.k[t * 2] = h.k[t * 2 + 1] = static_cast<float>(t + 1);
    h.v[t * 2] = h.v[t * 2 + 1] = static_cast<float>(10 * (t + 1));
    h.cos[t * 2] = h.cos[t * 2 + 1] = 1;
  }
  h.key_cache.assign(6, -7.0f);
  h.value_cache.assign(6, -8.0f);
  h.pos = {2, 0, -1};
  const ForwardParams<float> p = h.params();
  CHECK(reference::row_writers(p, 0) == std::vector<int64_t>{1, -1, 2});
  const reference::ForwardGold g = reference::cpu_forward(p);
  CHECK(values(g.key_cache, 0, 6) == std::vector<double>{2, 2, -7, -7, 3, 3});
  CHECK(g.value_cache == std::vector<double>{20, 20, -8, -8, 30, 30});
  CHECK(values(g.key_out, 0, 6) == std::vector<double>{1, 1, 2, 2, 3, 3});  // every token's key_out is written
  CHECK(g.error_flag == 0);
}

TEST_CASE("cpu_forward: an out-of-range cache_position writes no cache row but key_out and q",
          "[host][reference][forward]") {
  for (int64_t position : {2, -3, 1000}) {
    INFO("cache_position " << position);
    // S_max = 2, D = R = 2, cos = 0, sin = 1: RoPE([a, b]) = [-b, a].
    Host<float> h(1, 1, 1, 2, 2, 2, 1);
    h.k = {1, 2};
    h.v = {3, 4};
    h.q = {5, 6};
    h.sin = {1, 1};
    h.key_cache = {-1, -1, -1, -1};
    h.value_cache = {-2, -2, -2, -2};
    h.pos = {position};
    const ForwardParams<float> p = h.params();
    CHECK(reference::cache_row(p, 0) == -1);
    CHECK_FALSE(reference::positions_in_range(p));
    const reference::ForwardGold g = reference::cpu_forward(p);
    CHECK(values(g.key_cache, 0, 4) == std::vector<double>(4, -1.0));
    CHECK(g.value_cache == std::vector<double>(4, -2.0));
    CHECK(values(g.key_out, 0, 2) == std::vector<double>{-2, 1});
    CHECK(values(g.query, 0, 2) == std::vector<double>{-6, 5});
    CHECK(g.error_flag == kErrorPositionOutOfRange);
  }
}

TEST_CASE("cpu_forward: a position id out of range writes nothing at all for that token",
          "[host][reference][forward]") {
  for (int32_t bad : {3, -1}) {
    for (bool q_out : {false, true}) {
      INFO("position id " << bad << (q_out ? ", query_out" : ", q in place"));
      // S = 2, both tokens name row 1; token 1's id is out of range: row 1 keeps token 0's keys and values.
      Host<float, int32_t> h(1, 1, 2, 2, 2, 2, 1);
      h.with_q_out = q_out;
      h.k = {1, 2, 3, 4};
      h.v = {5, 6, 7, 8};
      h.q = {9, 10, 11, 12};
      h.key_out = {-1, -1, -1, -1};
      h.q_out = {-3, -3, -3, -3};
      h.key_cache = {-5, -5, -5, -5};
      h.value_cache = {-6, -6, -6, -6};
      h.cache_f32 = {1, 0, 0, 1, 1, 0};  // rows of [cos, sin]: row 1 rotates [a, b] to [-b, a]
      h.max_position = 3;
      h.ids = {1, bad};
      h.pos = {1, 1};
      const ForwardParams<float, int32_t> p = h.params();
      CHECK(reference::token_valid(p, 0, 0));
      CHECK_FALSE(reference::token_valid(p, 0, 1));
      const reference::ForwardGold g = reference::cpu_forward(p);
      CHECK(values(g.key_cache, 0, 4) == std::vector<double>{-5, -5, -2, 1});
      CHECK(g.value_cache == std::vector<double>{-6, -6, 5, 6});
      CHECK(values(g.key_out, 0, 4) == std::vector<double>{-2, 1, -1, -1});
      CHECK(values(g.query, 0, 4) ==
            (q_out ? std::vector<double>{-10, 9, -3, -3} : std::vector<double>{-10, 9, 11, 12}));
      CHECK(g.error_flag == kErrorPositionIdOutOfRange);
    }
  }
}

TEST_CASE("check_forward accepts the right outputs and names the first wrong one", "[host][reference][forward]") {
  using T = __nv_bfloat16;
  // B = 2, H = 2, S = 4, S_max = 6, D = 8, R = 4, interleaved, Hq = 3 into query_out; row 3 twice, -1 is row 5.
  const int64_t B = 2, H = 2, S = 4, L = 6, D = 8, R = 4, Hq = 3;
  Host<T> h(B, H, S, L, D, R, Hq);
  h.style = RotaryStyle::kInterleaved;
  h.with_q_out = true;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (auto* buf : {&h.k, &h.v, &h.q, &h.key_cache, &h.value_cache, &h.key_out, &h.q_out, &h.cos, &h.sin})
    for (T& x : *buf) x = from_float<T>(normal(rng));
  h.pos = {3, -1, 3, 0};
  const ForwardParams<T> in = h.params();
  const reference::ForwardGold g = reference::cpu_forward(in);

  std::vector<T> kc = rounded<T>(g.key_cache), vc = rounded<T>(g.value_cache), ko = rounded<T>(g.key_out),
                 qo = rounded<T>(g.query);
  verify::ForwardOutputs<T> out;
  out.key_cache = bhsd<const T>(kc.data(), H, L, D);
  out.value_cache = bhsd<const T>(vc.data(), H, L, D);
  out.key_out = bhsd<const T>(ko.data(), H, S, D);
  out.query = bhsd<const T>(qo.data(), Hq, S, D);
  verify::CheckResult r = verify::check_forward(in, out);
  INFO(r.first_mismatch);
  CHECK(r.ok());
  CHECK(r.checked == 2 * B * H * L * D + B * H * S * D + B * Hq * S * D);
  // Row 3 holds token 2, row 5 token 1, row 0 token 3; rows 1, 2 and 4 are the old cache.
  CHECK(reference::row_writers(in, 1) == std::vector<int64_t>{3, -1, -1, 2, -1, 1});

  struct Case {
    T* element;
    bool one_bit;  // a change of one bit (a copy must be exact) or of +1 (beyond the tolerance)
    const char* name;
  };
  for (const Case c :
       {Case{&kc[at4(H, L, D, 1, 0, 3, 1)], false, "key_cache"},  // rotated
        Case{&kc[at4(H, L, D, 0, 1, 5, 6)], true, "key_cache"},   // pass-through
        Case{&kc[at4(H, L, D, 1, 1, 2, 0)], true, "key_cache"},   // an untouched row
        Case{&vc[at4(H, L, D, 0, 0, 0, 3)], true, "value_cache"},
        Case{&vc[at4(H, L, D, 1, 1, 4, 7)], true, "value_cache"}, Case{&ko[at4(H, S, D, 1, 1, 3, 2)], false, "key_out"},
        Case{&ko[at4(H, S, D, 0, 0, 1, 5)], true, "key_out"}, Case{&qo[at4(Hq, S, D, 1, 2, 0, 3)], false, "query"},
        Case{&qo[at4(Hq, S, D, 0, 1, 2, 4)], true, "query"}}) {
    const T saved = *c.element;
    *c.element = c.one_bit ? next_up(saved) : from_float<T>(to_float(saved) + 1.0f);
    r = verify::check_forward(in, out);
    CHECK(r.mismatches == 1);
    CHECK(r.first_mismatch.find(c.name) != std::string::npos);
    *c.element = saved;
  }

  // Without key_out (and with q in place), those outputs are not checked.
  Host<T> h2 = h;
  h2.with_key_out = false;
  h2.with_q_out = false;
  const ForwardParams<T> in2 = h2.params();
  const reference::ForwardGold g2 = reference::cpu_forward(in2);
  CHECK(g2.key_out.empty());
  std::vector<T> kc2 = rounded<T>(g2.key_cache), q2 = rounded<T>(g2.query);
  out.key_cache = bhsd<const T>(kc2.data(), H, L, D);
  out.query = bhsd<const T>(q2.data(), Hq, S, D);
  r = verify::check_forward(in2, out);
  CHECK(r.ok());
  CHECK(r.checked == 2 * B * H * L * D + B * Hq * S * D);
}

TEST_CASE("naive_forward validates on the host and sizes its workspace", "[host][reference][forward]") {
  using T = __nv_bfloat16;
  Host<T> h(2, 3, 5, 7, 8, 4, 2);
  ForwardParams<T> p = h.params();
  // An int a cache row of each batch (rounded up to 256 bytes), and the rotated keys when key_out is null.
  CHECK(reference::naive_forward_workspace_bytes(p) == 256);
  p.key_out = {};
  CHECK(reference::naive_forward_workspace_bytes(p) == 256 + 2 * 3 * 5 * 8 * sizeof(T));
  p = h.params();
  CHECK(validate(p).ok());

  // Each of these fails before any launch (kvrope::validate's checks, then the workspace's).
  auto fails = [](const ForwardParams<T>& bad, StatusCode code, const char* field) {
    const Status s = reference::naive_forward(bad, nullptr, 0);
    CHECK(s.code == code);
    CHECK(std::string(s.field ? s.field : "") == field);
  };
  ForwardParams<T> bad = p;
  bad.rotary_dim = 3;
  fails(bad, StatusCode::kInvalidRotaryDim, "rotary_dim");
  bad.rotary_dim = 10;
  fails(bad, StatusCode::kInvalidRotaryDim, "rotary_dim");
  bad = p;
  bad.cos_sin_cache_f32 = reinterpret_cast<const float*>(h.cos.data());  // two table sources
  CHECK_FALSE(reference::naive_forward(bad, nullptr, 0).ok());
  bad = p;
  bad.cos = {};  // no table source
  bad.sin = {};
  fails(bad, StatusCode::kNullPointer, "cos");
  bad.cos_sin_cache = h.cos.data();  // a table cache without position ids
  fails(bad, StatusCode::kNullPointer, "position_ids");
  bad = p;
  bad.value_cache.seq_stride = -1;
  fails(bad, StatusCode::kInvalidStride, "value_cache.seq_stride");
  fails(p, StatusCode::kInvalidSize, "workspace_bytes");  // 256 bytes needed
}

TEST_CASE("the forward and backward references are adjoint in float64", "[host][reference][forward][adjoint]") {
  // <forward(k), g> = <k, backward(g)> for the keys, and the table gradients are the derivatives of
  // <forward(k), g> with respect to cos and sin (it is linear in them): per token as sums, and element by element
  // by perturbation. g is the gradient at the cache rows the tokens wrote (distinct rows).
  const int64_t B = 2, H = 3, S = 5, L = 7, D = 16;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
    for (int64_t R : {D, D / 2, int64_t{2}})
      for (bool broadcast : {false, true}) {
        INFO("style " << static_cast<int>(style) << ", R " << R << (broadcast ? ", tables of batch_stride 0" : ""));
        Host<float> h(B, H, S, L, D, R);
        h.style = style;
        h.broadcast_tables = broadcast;
        for (auto* buf : {&h.k, &h.v, &h.key_cache, &h.value_cache, &h.cos, &h.sin})
          for (float& x : *buf) x = normal(rng);
        h.pos = {4, 0, -1, 2, 5};
        std::vector<float> gk(B * H * L * D), gv(gk.size());
        for (float& x : gk) x = normal(rng);
        for (float& x : gv) x = normal(rng);

        const ForwardParams<float> fp = h.params();
        BackwardParams<float> bp;
        bp.batch = B, bp.heads = H, bp.seq_len = S, bp.cache_len = L, bp.head_dim = D;
        bp.rotary_dim = R;
        bp.style = style;
        bp.key_states = fp.key_states;
        bp.cos = fp.cos;
        bp.sin = fp.sin;
        bp.cache_position = h.pos.data();
        bp.grad_key_cache = bhsd<const float>(gk.data(), H, L, D);
        bp.grad_value_cache = bhsd<const float>(gv.data(), H, L, D);
        const reference::BackwardGold bg = reference::cpu_backward(bp);

        // <key_cache rows p, gK rows p> for a forward with the tables as they are in `h`, per token (rotated
        // elements only) and in all.
        auto functional = [&](std::vector<double>* per_token) {
          const reference::ForwardGold fg = reference::cpu_forward(h.params());
          double total = 0;
          if (per_token) per_token->assign(B * S, 0.0);
          for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < S; ++t) {
              const int64_t r = reference::cache_row(fp, t);
              for (int64_t j = 0; j < H; ++j)
                for (int64_t d = 0; d < D; ++d) {
                  const double y = fg.key_cache[at4(H, L, D, b, j, r, d)].value * gk[at4(H, L, D, b, j, r, d)];
                  total += y;
                  if (per_token && d < R) (*per_token)[b * S + t] += y;
                }
            }
          return total;
        };

        // The keys: <RoPE(k), g> = <k, RoPE^T(g)>.
        std::vector<double> per_token;
        const double lhs = functional(&per_token);
        double rhs = 0, scale = 0;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t j = 0; j < H; ++j)
            for (int64_t t = 0; t < S; ++t)
              for (int64_t d = 0; d < D; ++d) {
                const int64_t i = at4(H, S, D, b, j, t, d);
                const double y = h.k[i] * bg.grad_key_states[i].value;
                rhs += y;
                scale += std::fabs(y);
              }
        CHECK(std::fabs(lhs - rhs) <= 1e-12 * scale);

        // The tables, token by token: sum over rotated elements of RoPE(k) g = sum of cos grad_cos + sin grad_sin.
        // With tables of batch_stride 0 the table gradient is summed over the batch (so is the functional).
        const int64_t tables = broadcast ? 1 : B;
        for (int64_t b = 0; b < tables; ++b)
          for (int64_t t = 0; t < S; ++t) {
            double f = 0, fscale = 0, via_grads = 0;
            for (int64_t bb = broadcast ? 0 : b; bb < (broadcast ? B : b + 1); ++bb) {
              f += per_token[bb * S + t];
              fscale += std::fabs(per_token[bb * S + t]);
            }
            for (int64_t e = 0; e < R; ++e) {
              const int64_t i = (b * S + t) * R + e;
              const reference::Gold gc = broadcast ? bg.grad_cos_batch_sum[t * R + e] : bg.grad_cos[i];
              const reference::Gold gs = broadcast ? bg.grad_sin_batch_sum[t * R + e] : bg.grad_sin[i];
              via_grads += h.cos[i] * gc.value + h.sin[i] * gs.value;
              fscale += std::fabs(h.cos[i]) * gc.abs_sum + std::fabs(h.sin[i]) * gs.abs_sum;
            }
            INFO("b " << b << ", t " << t);
            CHECK(std::fabs(f - via_grads) <= 1e-9 * fscale);
          }

        // Element by element: adding 1 to a table entry changes the functional by its gradient exactly (linear).
        int64_t bad = 0;
        for (int table = 0; table < 2; ++table) {
          std::vector<float>& entries = table == 0 ? h.cos : h.sin;
          for (int64_t i = 0; i < tables * S * R; ++i) {
            const float saved = entries[i];
            entries[i] = saved + 1.0f;
            const double delta = static_cast<double>(entries[i]) - saved;
            const double derivative = (functional(nullptr) - lhs) / delta;
            entries[i] = saved;
            const std::vector<reference::Gold>& grad =
                broadcast ? (table == 0 ? bg.grad_cos_batch_sum : bg.grad_sin_batch_sum)
                          : (table == 0 ? bg.grad_cos : bg.grad_sin);
            if (std::fabs(derivative - grad[i].value) > 1e-9 * (scale + grad[i].abs_sum)) ++bad;
          }
        }
        CHECK(bad == 0);
      }
}
