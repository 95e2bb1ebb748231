// Host tests of the append's multimodal rotary positions (mRoPE, docs/spec.md §6.2): which stream each pair
// reads, in the reference (reference::mrope_stream) and in the kernels' rule (detail::MropeRule, from
// append_args), against lists built pair by pair from the sections; cpu_append with mRoPE against a
// straightforward formula (both styles and section kinds, partial rotary, the norm, fp32 and T tables,
// int32 and int64 positions, a stream stride that is not T); tokens with a bad position in any stream;
// the checker of verify/ telling mRoPE from ordinary positions; validate() refusing bad sections by name.
// No GPU needed.
#include <kvrope/append.cuh>
#include <kvrope/reference/cpu_append.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "verify/check_append.hpp"

using namespace kvrope;

namespace {

// The stream of each of `pairs` pairs, built as the sections describe it: contiguous, s0 pairs of stream 0,
// then s1 of stream 1, then s2 of stream 2; interleaved, every pair of stream 0 but pairs 3k + 1 (k < s1) of
// stream 1 and 3k + 2 (k < s2) of stream 2 ("THWTHW...TT").
std::vector<int> section_streams(const int64_t (&s)[3], bool interleaved, int64_t pairs) {
  std::vector<int> out;
  if (!interleaved) {
    for (int j = 0; j < 3; ++j) out.insert(out.end(), static_cast<size_t>(s[j]), j);
    return out;
  }
  out.assign(static_cast<size_t>(pairs), 0);
  for (int64_t k = 0; k < s[1] && 3 * k + 1 < pairs; ++k) out[3 * k + 1] = 1;
  for (int64_t k = 0; k < s[2] && 3 * k + 2 < pairs; ++k) out[3 * k + 2] = 2;
  return out;
}

// An append call on host vectors with mRoPE: q [N, Hq, D], k, v [N, H, D], a flat pool of N + 2 slots (P = 1,
// token t in slot t), a table cache [max_position, R] (fp32, or T with t_table), positions [3, N] with
// `stride` elements from one stream to the next (the gaps hold -7, a position no token may read).
template <typename T, typename Pos = int64_t>
struct MropeHost {
  int64_t N, H, Hq, D, R, max_position, stride;
  RotaryStyle style = RotaryStyle::kRotateHalf;
  int64_t section[3] = {0, 0, 0};
  bool interleaved = false, t_table = false, norms = false;
  std::vector<T> q, q_out, k, k_out, v, kc, vc, table, q_weight, k_weight;
  std::vector<float> table_f32;
  std::vector<Pos> pos;
  std::vector<int64_t> slots;

  MropeHost(int64_t n, int64_t h, int64_t hq, int64_t d, int64_t r, int64_t max_pos, int64_t pos_stride, uint32_t seed)
      : N(n), H(h), Hq(hq), D(d), R(r), max_position(max_pos), stride(pos_stride) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    auto fill = [&](std::vector<T>& x, int64_t count) {
      x.resize(static_cast<size_t>(count));
      for (T& e : x) e = from_float<T>(normal(rng));
    };
    fill(q, N * Hq * D);
    fill(q_out, N * Hq * D);
    fill(k, N * H * D);
    fill(k_out, N * H * D);
    fill(v, N * H * D);
    fill(kc, (N + 2) * H * D);
    fill(vc, (N + 2) * H * D);
    fill(q_weight, D);
    fill(k_weight, D);
    table_f32.resize(static_cast<size_t>(max_position * R));
    for (float& x : table_f32) x = normal(rng);
    for (float x : table_f32) table.push_back(from_float<T>(x));
    pos.assign(static_cast<size_t>(2 * stride + N), static_cast<Pos>(-7));
    std::uniform_int_distribution<int64_t> any(0, max_position - 1);
    for (int j = 0; j < 3; ++j)
      for (int64_t t = 0; t < N; ++t) pos[j * stride + t] = static_cast<Pos>(any(rng));
    for (int64_t t = 0; t < N; ++t) slots.push_back(t);
  }

  AppendParams<T, T, Pos> params() {
    AppendParams<T, T, Pos> p;
    p.tokens = N, p.heads = H, p.query_heads = Hq, p.head_dim = D;
    p.rotary_dim = R == D ? 0 : R;
    p.style = style;
    p.query = thd(q.data(), Hq, D);
    p.query_out = thd(q_out.data(), Hq, D);
    p.key = thd(k.data(), H, D);
    p.key_out = thd(k_out.data(), H, D);
    p.value = thd<const T>(v.data(), H, D);
    p.positions = pos.data();
    if (t_table)
      p.cos_sin_cache = table.data();
    else
      p.cos_sin_cache_f32 = table_f32.data();
    p.max_position = max_position;
    if (norms) p.query_norm_weight = q_weight.data(), p.key_norm_weight = k_weight.data();
    p.key_cache = nhd_pages(kc.data(), 1, H, D);
    p.value_cache = nhd_pages(vc.data(), 1, H, D);
    p.page_size = 1;
    p.num_pages = N + 2;
    p.slot_mapping = slots.data();
    for (int j = 0; j < 3; ++j) p.mrope_section[j] = section[j];
    p.mrope_interleaved = interleaved;
    p.position_stream_stride = stride;
    return p;
  }

  double table_at(int64_t row, int64_t col) const {
    return t_table ? static_cast<double>(to_float(table[row * R + col]))
                   : static_cast<double>(table_f32[row * R + col]);
  }

  // The rotated row x of token t, straight from the definition: normed (w the weights) in float64, then for
  // each pair i its elements (i, i + R/2) or (2i, 2i + 1) rotated by the angle in column i of the row of
  // positions[stream(i)][t].
  std::vector<double> direct(const T* x, const std::vector<T>* w, int64_t t) const {
    std::vector<double> y(static_cast<size_t>(D));
    double squares = 0.0;
    for (int64_t d = 0; d < D; ++d) squares += static_cast<double>(to_float(x[d])) * to_float(x[d]);
    const double scale = w ? 1.0 / std::sqrt(squares / static_cast<double>(D) + static_cast<double>(1e-6f)) : 1.0;
    for (int64_t d = 0; d < D; ++d) y[d] = to_float(x[d]) * scale * (w ? to_float((*w)[d]) : 1.0);
    std::vector<double> out = y;
    const std::vector<int> streams = section_streams(section, interleaved, R / 2);
    for (int64_t i = 0; i < R / 2; ++i) {
      const int64_t row = static_cast<int64_t>(pos[streams[i] * stride + t]);
      const double c = table_at(row, i), s = table_at(row, R / 2 + i);
      const int64_t a = style == RotaryStyle::kRotateHalf ? i : 2 * i;
      const int64_t b = style == RotaryStyle::kRotateHalf ? i + R / 2 : 2 * i + 1;
      out[a] = y[a] * c - y[b] * s;
      out[b] = y[b] * c + y[a] * s;
    }
    return out;
  }
};

// |gold - want| within float64 rounding of the sums of products (both are float64 computations).
bool close(const reference::Gold& g, double want) {
  return std::fabs(g.value - want) <= 1e-12 * (g.abs_sum + std::fabs(want)) + 1e-300;
}

}  // namespace

TEST_CASE("mRoPE streams: the reference and the kernels' rule follow the sections pair by pair",
          "[host][reference][append][mrope]") {
  struct Sections {
    int64_t s[3];
    int64_t pairs;
  };
  std::vector<Sections> cases{
      {{16, 24, 24}, 64},  // Qwen2-VL, Qwen2.5-VL (head_dim 128)
      {{24, 20, 20}, 64},  // Qwen3-VL
      {{1, 1, 1}, 3},     {{3, 0, 0}, 3}, {{0, 0, 3}, 3},
      {{0, 2, 1}, 3},     {{2, 3, 3}, 8},  // interleaved: 3 s2 = 9 > 8 pairs
      {{0, 4, 4}, 8},     {{1, 6, 1}, 8},
  };
  std::mt19937 rng(5);
  for (int n = 0; n < 200; ++n) {  // random sections of 1..40 pairs
    Sections c{};
    c.pairs = 1 + static_cast<int64_t>(rng() % 40);
    c.s[0] = static_cast<int64_t>(rng() % (c.pairs + 1));
    c.s[1] = static_cast<int64_t>(rng() % (c.pairs - c.s[0] + 1));
    c.s[2] = c.pairs - c.s[0] - c.s[1];
    cases.push_back(c);
  }
  for (const Sections& c : cases)
    for (const bool interleaved : {false, true}) {
      INFO("sections " << c.s[0] << ", " << c.s[1] << ", " << c.s[2] << (interleaved ? " interleaved" : " contiguous"));
      AppendParams<float> p;
      p.head_dim = p.rotary_dim = 2 * c.pairs;
      for (int j = 0; j < 3; ++j) p.mrope_section[j] = c.s[j];
      p.mrope_interleaved = interleaved;
      REQUIRE(has_mrope(p));
      const detail::MropeRule rule = detail::append_args(p).mrope;
      const std::vector<int> want = section_streams(c.s, interleaved, c.pairs);
      REQUIRE(static_cast<int64_t>(want.size()) == c.pairs);
      int bad_reference = 0, bad_rule = 0;
      for (int64_t i = 0; i < c.pairs; ++i) {
        bad_reference += reference::mrope_stream(p, i) != want[i];
        bad_rule += rule.stream(static_cast<int>(i)) != want[i];
      }
      CHECK(bad_reference == 0);
      CHECK(bad_rule == 0);
    }
  // Qwen3-VL's layout, written out: THW repeated 20 times, then TTTT.
  const std::vector<int> qwen3 = section_streams({24, 20, 20}, true, 64);
  for (int64_t i = 0; i < 60; ++i) CHECK(qwen3[i] == i % 3);
  for (int64_t i = 60; i < 64; ++i) CHECK(qwen3[i] == 0);
  AppendParams<float> none;
  CHECK_FALSE(has_mrope(none));
  CHECK(detail::append_args(none).mrope.kind == detail::MropeKind::kNone);
}

namespace {
// Every unit of rotated rows of chunks of N (unit_place) under the sections of `p`: mrope_unit_stream gives a
// stream only when each of the unit's pairs takes it, and under contiguous sections gives one whenever they do.
template <int N>
void check_unit_streams(const AppendParams<float>& p, RotaryStyle style) {
  const detail::MropeRule rule = detail::append_args(p).mrope;
  const int64_t R = p.rotary_dim;
  const int units = static_cast<int>(R / (2 * N));
  int wrong = 0, missed = 0;
  for (int u = 0; u < units; ++u) {
    const detail::UnitPlace pl = detail::unit_place<N>(style, R, R, units, u);
    std::vector<int> streams;  // the stream of each pair of the unit (as load_pair_angles reads them)
    for (int i = 0; i < N; ++i)
      streams.push_back(rule.stream(pl.cross ? pl.pair_lo + i : i < N / 2 ? pl.pair_lo + i : pl.pair_hi + i - N / 2));
    const bool one = std::all_of(streams.begin(), streams.end(), [&](int s) { return s == streams[0]; });
    const int got = detail::mrope_unit_stream<N>(rule, pl);
    wrong += got >= 0 && (!one || got != streams[0]);
    missed += got < 0 && one && !p.mrope_interleaved;
  }
  CHECK(wrong == 0);
  CHECK(missed == 0);
}
}  // namespace

TEST_CASE("mRoPE: the few-token kernel's stream of a unit is each of its pairs' stream, or none",
          "[host][append][mrope]") {
  const int64_t sections[][4] = {{16, 24, 24, 128}, {24, 20, 20, 128}, {8, 12, 12, 64}, {10, 11, 11, 64},
                                 {0, 32, 0, 64},    {5, 1, 2, 16},     {3, 3, 2, 16}};
  for (const auto& s : sections)
    for (const bool interleaved : {false, true})
      for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved}) {
        INFO("sections " << s[0] << ", " << s[1] << ", " << s[2] << " R " << s[3]
                         << (interleaved ? " interleaved" : " contiguous"));
        AppendParams<float> p;
        p.head_dim = p.rotary_dim = s[3];
        for (int j = 0; j < 3; ++j) p.mrope_section[j] = s[j];
        p.mrope_interleaved = interleaved;
        check_unit_streams<8>(p, style);  // 16-bit T
        check_unit_streams<4>(p, style);  // fp32
        check_unit_streams<2>(p, style);
      }
}

TEMPLATE_TEST_CASE("cpu_append with mRoPE matches the rotation written out: styles, sections, partial rotary, norms",
                   "[host][reference][append][mrope]", float, __nv_bfloat16) {
  using T = TestType;
  struct Case {
    int64_t r;  // R (D = 24)
    int64_t s[3];
    bool interleaved;
  };
  const Case cases[] = {
      {24, {4, 4, 4}, false}, {24, {2, 5, 5}, false}, {24, {4, 4, 4}, true},  {24, {6, 3, 3}, true},
      {16, {2, 3, 3}, false}, {16, {2, 3, 3}, true},  {16, {0, 8, 0}, false}, {8, {1, 1, 2}, true},
  };
  uint32_t seed = 1;
  for (const Case& c : cases)
    for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
      for (const bool norms : {false, true})
        for (const bool t_table : {false, true}) {
          INFO("R " << c.r << " sections " << c.s[0] << ", " << c.s[1] << ", " << c.s[2]
                    << (c.interleaved ? " interleaved" : " contiguous")
                    << (style == RotaryStyle::kInterleaved ? ", GPT-J style" : ", rotate-half")
                    << (norms ? ", norms" : "") << (t_table ? ", T table" : ", fp32 table"));
          // N = 5 tokens, positions 5 + 3 apart (a stream stride that is not N), int32 every other case.
          MropeHost<T> h(5, 2, 3, 24, c.r, 11, 8, seed++);
          h.style = style;
          for (int j = 0; j < 3; ++j) h.section[j] = c.s[j];
          h.interleaved = c.interleaved;
          h.norms = norms;
          h.t_table = t_table;
          const AppendParams<T> p = h.params();
          REQUIRE(validate(p).ok());
          const reference::AppendGold g = reference::cpu_append(p);
          CHECK(g.error_flag.required == 0);
          int bad = 0;
          for (int64_t t = 0; t < h.N; ++t) {
            for (int64_t i = 0; i < h.Hq; ++i) {
              const std::vector<double> want =
                  h.direct(h.q.data() + (t * h.Hq + i) * h.D, norms ? &h.q_weight : nullptr, t);
              for (int64_t d = 0; d < h.D; ++d) bad += !close(g.query[(t * h.Hq + i) * h.D + d], want[d]);
            }
            for (int64_t j = 0; j < h.H; ++j) {
              const std::vector<double> want =
                  h.direct(h.k.data() + (t * h.H + j) * h.D, norms ? &h.k_weight : nullptr, t);
              for (int64_t d = 0; d < h.D; ++d) {
                bad += !close(g.key[(t * h.H + j) * h.D + d], want[d]);
                bad += !close(g.key_cache[(t * h.H + j) * h.D + d], want[d]);  // slot t
              }
            }
          }
          CHECK(bad == 0);
          // The same positions as int32.
          MropeHost<T, int32_t> h32(5, 2, 3, 24, c.r, 11, 8, seed - 1);
          h32.style = style;
          for (int j = 0; j < 3; ++j) h32.section[j] = c.s[j];
          h32.interleaved = c.interleaved;
          h32.norms = norms;
          h32.t_table = t_table;
          const reference::AppendGold g32 = reference::cpu_append(h32.params());
          int differ = 0;
          for (size_t e = 0; e < g.key.size(); ++e) differ += g.key[e].value != g32.key[e].value;
          for (size_t e = 0; e < g.query.size(); ++e) differ += g.query[e].value != g32.query[e].value;
          CHECK(differ == 0);
        }
}

TEST_CASE("cpu_append: mRoPE with three equal streams is the ordinary rotation, any stream stride",
          "[host][reference][append][mrope]") {
  using T = __nv_bfloat16;
  for (const int64_t stride : {int64_t{0}, int64_t{9}})
    for (const bool interleaved : {false, true}) {
      INFO("stride " << stride << (interleaved ? " interleaved" : " contiguous"));
      MropeHost<T> h(9, 2, 4, 32, 32, 20, 9, 77);
      h.section[0] = 4, h.section[1] = 6, h.section[2] = 6;
      h.interleaved = interleaved;
      h.norms = true;
      h.stride = stride;
      for (int j = 1; j < 3; ++j)
        for (int64_t t = 0; t < h.N; ++t) h.pos[j * 9 + t] = h.pos[t];
      const reference::AppendGold m = reference::cpu_append(h.params());
      AppendParams<T> plain = h.params();
      plain.mrope_section[0] = plain.mrope_section[1] = plain.mrope_section[2] = 0;
      plain.mrope_interleaved = false;
      plain.position_stream_stride = 0;
      const reference::AppendGold o = reference::cpu_append(plain);
      int differ = 0;
      for (size_t e = 0; e < m.key.size(); ++e) differ += m.key[e].value != o.key[e].value;
      for (size_t e = 0; e < m.query.size(); ++e) differ += m.query[e].value != o.query[e].value;
      for (size_t e = 0; e < m.key_cache.size(); ++e) differ += m.key_cache[e].value != o.key_cache[e].value;
      CHECK(differ == 0);
    }
}

TEST_CASE("cpu_append: a token with any of its three positions out of range writes nothing",
          "[host][reference][append][mrope]") {
  using T = float;
  MropeHost<T> h(6, 1, 2, 8, 8, 10, 6, 3);
  h.section[0] = 2, h.section[1] = 1, h.section[2] = 1;
  // Token 1: stream 1 at -1; token 3: stream 2 at max_position; token 4: stream 0 far beyond. Tokens 0 and 1
  // name slot 0, tokens 3 and 5 slot 3: the invalid ones do not count as last.
  h.pos[6 + 1] = -1;
  h.pos[12 + 3] = 10;
  h.pos[0 + 4] = 1000;
  h.slots = {0, 0, 2, 3, 4, 3};
  const AppendParams<T> p = h.params();
  for (int64_t t : {0, 2, 5}) CHECK(reference::append_token_valid(p, t));
  for (int64_t t : {1, 3, 4}) CHECK_FALSE(reference::append_token_valid(p, t));
  CHECK(reference::append_table_rows(p, 3).stream[1] == -1);
  CHECK(reference::append_table_row(p, 0) == static_cast<int64_t>(h.pos[0]));
  const reference::AppendGold g = reference::cpu_append(p);
  CHECK(g.error_flag.required == kErrorPositionIdOutOfRange);
  CHECK(g.writer == std::vector<int64_t>{0, -1, 2, 5, -1, -1, -1, -1});
  int kept = 0;
  for (int64_t t : {1, 3, 4})  // query_out and key_out as they were
    for (int64_t d = 0; d < 8; ++d) {
      kept += g.key[t * 8 + d].value == h.k_out[t * 8 + d];
      for (int64_t i = 0; i < 2; ++i) kept += g.query[(t * 2 + i) * 8 + d].value == h.q_out[(t * 2 + i) * 8 + d];
    }
  CHECK(kept == 3 * 8 * 3);
}

TEST_CASE("check_append with mRoPE accepts the reference's rows and refuses ordinary positions' rows",
          "[host][reference][append][mrope][checker]") {
  using T = __nv_bfloat16;
  for (const bool interleaved : {false, true}) {
    INFO((interleaved ? "interleaved" : "contiguous"));
    MropeHost<T> h(7, 2, 2, 16, 16, 12, 10, 21);
    h.section[0] = 2, h.section[1] = 3, h.section[2] = 3;
    h.interleaved = interleaved;
    const AppendParams<T> in = h.params();
    AppendParams<T> plain = in;  // stream 0's positions for every pair
    plain.mrope_section[0] = plain.mrope_section[1] = plain.mrope_section[2] = 0;
    plain.mrope_interleaved = false;
    plain.position_stream_stride = 0;
    for (const bool mrope : {true, false}) {
      const reference::AppendGold g = reference::cpu_append(mrope ? in : plain);
      std::vector<T> k_out(g.key.size());
      for (size_t e = 0; e < k_out.size(); ++e) k_out[e] = reference::detail::round_to<T>(g.key[e].value);
      verify::AppendOutputs<T, T> out;
      out.key_out = thd<const T>(k_out.data(), h.H, h.D);
      const verify::CheckResult r = verify::check_append(in, out);
      INFO(r.first_mismatch);
      CHECK(r.checked == h.N * h.H * h.D);
      CHECK(r.ok() == mrope);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// validate() with mRoPE.
// ---------------------------------------------------------------------------------------------------

namespace {
using VT = __nv_bfloat16;
constexpr int64_t kN = 8, kH = 2, kHq = 4, kD = 64, kMaxPos = 100;

struct Buffers {
  std::vector<VT> q = std::vector<VT>(kN * kHq * kD), k = std::vector<VT>(kN * kH * kD), v = k, k_out = k;
  std::vector<VT> kc = std::vector<VT>(4 * 16 * kH * kD), vc = kc;
  std::vector<float> table = std::vector<float>(kMaxPos * kD);
  std::vector<int64_t> pos = std::vector<int64_t>(3 * kN + 8), slots = std::vector<int64_t>(kN);

  AppendParams<VT> params() {
    AppendParams<VT> p;
    p.tokens = kN, p.heads = kH, p.query_heads = kHq, p.head_dim = kD;
    p.query = thd(q.data(), kHq, kD);
    p.key = thd(k.data(), kH, kD);
    p.key_out = thd(k_out.data(), kH, kD);
    p.value = thd<const VT>(v.data(), kH, kD);
    p.positions = pos.data();
    p.cos_sin_cache_f32 = table.data();
    p.max_position = kMaxPos;
    p.key_cache = nhd_pages(kc.data(), 16, kH, kD);
    p.value_cache = nhd_pages(vc.data(), 16, kH, kD);
    p.page_size = 16;
    p.num_pages = 4;
    p.slot_mapping = slots.data();
    p.mrope_section[0] = 8, p.mrope_section[1] = 12, p.mrope_section[2] = 12;
    p.position_stream_stride = kN + 4;
    return p;
  }
};

void expect(const AppendParams<VT>& p, StatusCode code, const char* field, const char* other = nullptr) {
  const Status s = validate(p);
  INFO("got " << to_string(s.code) << " / " << (s.field ? s.field : "(none)") << " / "
              << (s.other ? s.other : "(none)"));
  CHECK(s.code == code);
  CHECK(std::string(s.field ? s.field : "") == std::string(field ? field : ""));
  if (other) CHECK(std::string(s.other ? s.other : "") == std::string(other));
}
}  // namespace

TEST_CASE("append validate with mRoPE: valid sections pass, bad ones are refused by name",
          "[host][validate][append][mrope]") {
  Buffers buf;
  auto p = buf.params();
  expect(p, StatusCode::kSuccess, nullptr);
  p.mrope_interleaved = true;
  expect(p, StatusCode::kSuccess, nullptr);
  p.position_stream_stride = 0;  // one stream for all three
  expect(p, StatusCode::kSuccess, nullptr);
  p = buf.params();
  p.mrope_section[0] = 32, p.mrope_section[1] = p.mrope_section[2] = 0;  // one stream: still mRoPE
  expect(p, StatusCode::kSuccess, nullptr);
  p = buf.params();
  p.rotary_dim = 32;  // partial rotary: the sections cover R/2 = 16 pairs
  p.mrope_section[0] = 4, p.mrope_section[1] = 6, p.mrope_section[2] = 6;
  expect(p, StatusCode::kSuccess, nullptr);
  p = buf.params();
  p.tokens = 0;
  expect(p, StatusCode::kSuccess, nullptr);  // the sections are checked on an empty call too

  struct Case {
    void (*change)(AppendParams<VT>&);
    StatusCode code;
    const char* field;
    const char* other;
  };
  const Case cases[] = {
      {[](AppendParams<VT>& p) { p.mrope_section[1] = -1, p.mrope_section[2] = 25; }, StatusCode::kInvalidSize,
       "mrope_section", nullptr},
      {[](AppendParams<VT>& p) { p.mrope_section[0] = 9; }, StatusCode::kInvalidSize, "mrope_section", nullptr},
      {[](AppendParams<VT>& p) { p.mrope_section[2] = 11; }, StatusCode::kInvalidSize, "mrope_section", nullptr},
      {[](AppendParams<VT>& p) { p.rotary_dim = 32; }, StatusCode::kInvalidSize, "mrope_section", nullptr},
      {[](AppendParams<VT>& p) { p.mrope_section[0] = int64_t{1} << 62, p.mrope_section[1] = -(int64_t{1} << 62); },
       StatusCode::kInvalidSize, "mrope_section", nullptr},
      {[](AppendParams<VT>& p) { p.tokens = 0, p.mrope_section[0] = 7; }, StatusCode::kInvalidSize, "mrope_section",
       nullptr},
      {[](AppendParams<VT>& p) { p.position_stream_stride = -1; }, StatusCode::kInvalidStride, "position_stream_stride",
       nullptr},
      {[](AppendParams<VT>& p) { p.positions = nullptr; }, StatusCode::kNullPointer, "positions", nullptr},
      {[](AppendParams<VT>& p) {
         p.mrope_section[0] = p.mrope_section[1] = p.mrope_section[2] = 0;
         p.mrope_interleaved = true;
         p.position_stream_stride = 0;
       },
       StatusCode::kConflictingFields, "mrope_interleaved", "mrope_section"},
      {[](AppendParams<VT>& p) { p.mrope_section[0] = p.mrope_section[1] = p.mrope_section[2] = 0; },
       StatusCode::kConflictingFields, "position_stream_stride", "mrope_section"},
  };
  for (const Case& c : cases) {
    p = buf.params();
    c.change(p);
    expect(p, c.code, c.field, c.other);
  }
  // The streams are an input of three rows: an output over the third one is caught, one just past it is not.
  std::vector<VT> arena(1024 + kN * kH * kD);
  p = buf.params();
  p.key_out = thd(arena.data() + 1024, kH, kD);
  p.positions = reinterpret_cast<const int64_t*>(arena.data() + 1024) - 2 * p.position_stream_stride;
  expect(p, StatusCode::kAliasedBuffers, "key_out", "positions");
  p.positions -= kN;
  expect(p, StatusCode::kSuccess, nullptr);
}
