// Host tests of the float64 CPU reference of the backward and its checker (verify/) on cases small enough to work by
// hand, with both rotary styles, partial rotary and table gradients summed over the batch.
#include <kvrope/reference/cpu_backward.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "verify/check_backward.hpp"

using namespace kvrope;

namespace {
// B = 1, H = 2, S = 1, S_max = 2, D = 2 (h = 1), cache_position = [1].
struct Tiny {
  std::vector<float> gk{1, 2, 3, 4, 5, 6, 7, 8};  // [head][row][d]
  std::vector<float> gv{9, 10, 11, 12, 13, 14, 15, 16};
  std::vector<float> key{1, -1, 2, 0.5f};                  // [head][token][d]
  std::vector<float> cos{0.5f, 0.25f}, sin{0.75f, -0.5f};  // [token][d]
  std::vector<int64_t> pos{1};

  BackwardParams<float> params() {
    BackwardParams<float> p;
    p.batch = 1, p.heads = 2, p.seq_len = 1, p.cache_len = 2, p.head_dim = 2;
    p.grad_key_cache = bhsd<const float>(gk.data(), 2, 2, 2);
    p.grad_value_cache = bhsd<const float>(gv.data(), 2, 2, 2);
    p.key_states = bhsd<const float>(key.data(), 2, 1, 2);
    p.cos = bsd<const float>(cos.data(), 1, 2);
    p.sin = bsd<const float>(sin.data(), 1, 2);
    p.cache_position = pos.data();
    return p;
  }
};

std::vector<double> values(const std::vector<reference::Gold>& g) {
  std::vector<double> v;
  for (const auto& x : g) v.push_back(x.value);
  return v;
}
}  // namespace

TEST_CASE("cpu_backward on a case worked by hand", "[host][reference]") {
  Tiny tiny;
  const reference::BackwardGold g = reference::cpu_backward(tiny.params());
  // g = gK rows 1: head 0 [3, 4], head 1 [7, 8].
  // grad_key_states: [3*.5 + 4*(-.5), 4*.25 - 3*.75] and [7*.5 + 8*(-.5), 8*.25 - 7*.75]
  CHECK(values(g.grad_key_states) == std::vector<double>{-0.5, -1.25, -0.5, -3.25});
  CHECK(g.grad_value_states == std::vector<double>{11, 12, 15, 16});
  // grad_cos = sum_j g*k = [3*1 + 7*2, 4*(-1) + 8*.5]; grad_sin = sum_j g*rot(k), rot(k) = [-k1, k0]
  CHECK(values(g.grad_cos) == std::vector<double>{17, 0});
  CHECK(values(g.grad_sin) == std::vector<double>{3 * 1 + 7 * -0.5, 4 * 1 + 8 * 2});
  CHECK(g.grad_key_cache_input == std::vector<double>{1, 2, 0, 0, 5, 6, 0, 0});
  CHECK(g.grad_value_cache_input == std::vector<double>{9, 10, 0, 0, 13, 14, 0, 0});
  // A (the sum of absolute products) of grad_cos[0]: |3*1| + |7*2|.
  CHECK(g.grad_cos[0].abs_sum == 17);
  CHECK(g.grad_cos[1].abs_sum == 8);
}

TEST_CASE("check_backward accepts the right outputs and names the first wrong one", "[host][reference]") {
  Tiny tiny;
  const BackwardParams<float> in = tiny.params();
  std::vector<float> gks{-0.5f, -1.25f, -0.5f, -3.25f}, gvs{11, 12, 15, 16}, gcos{17, 0}, gsin{-0.5f, 20};
  std::vector<float> gk_in{1, 2, 0, 0, 5, 6, 0, 0}, gv_in{9, 10, 0, 0, 13, 14, 0, 0};
  verify::BackwardOutputs<float> out;
  out.grad_key_states = bhsd<const float>(gks.data(), 2, 1, 2);
  out.grad_value_states = bhsd<const float>(gvs.data(), 2, 1, 2);
  out.grad_cos = bsd<const float>(gcos.data(), 1, 2);
  out.grad_sin = bsd<const float>(gsin.data(), 1, 2);
  out.grad_key_cache_input = bhsd<const float>(gk_in.data(), 2, 2, 2);
  out.grad_value_cache_input = bhsd<const float>(gv_in.data(), 2, 2, 2);
  verify::CheckResult r = verify::check_backward(in, out);
  CHECK(r.ok());
  CHECK(r.checked == 4 + 4 + 2 + 2 + 8 + 8);

  gsin[1] = 20.001f;  // a computed output off by more than the tolerance
  r = verify::check_backward(in, out);
  CHECK(r.mismatches == 1);
  CHECK(r.first_mismatch.find("grad_sin") != std::string::npos);
  gsin[1] = 20;

  gv_in[2] = -0.0f;  // a zeroed row must be +0 bit for bit
  r = verify::check_backward(in, out);
  CHECK(r.mismatches == 1);
  CHECK(r.first_mismatch.find("grad_value_cache_input") != std::string::npos);
}

TEST_CASE("positions wrap and out-of-range tokens are detected", "[host][reference]") {
  Tiny tiny;
  tiny.pos = {-1};  // the same row as 1
  CHECK(reference::cache_row(tiny.params(), 0) == 1);
  CHECK(reference::positions_in_range(tiny.params()));
  tiny.pos = {2};
  CHECK(reference::cache_row(tiny.params(), 0) == -1);
  CHECK_FALSE(reference::positions_in_range(tiny.params()));
  tiny.pos = {-3};
  CHECK_FALSE(reference::positions_in_range(tiny.params()));
}

namespace {
// B = 1, H = 1, S = 1, S_max = 1, D = 8, R = 4: g = gK row 0 = [1, ..., 8], k = [2, -1, 1, 3, 0, 0, 0, 0],
// cos = [.5, .25, -1, 2], sin = [.75, -.5, .125, 1].
struct Partial {
  std::vector<float> gk{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> gv{9, 10, 11, 12, 13, 14, 15, 16};
  std::vector<float> key{2, -1, 1, 3, 0, 0, 0, 0};
  std::vector<float> cos{0.5f, 0.25f, -1, 2}, sin{0.75f, -0.5f, 0.125f, 1};
  std::vector<int64_t> pos{0};

  BackwardParams<float> params(RotaryStyle style) {
    BackwardParams<float> p;
    p.batch = 1, p.heads = 1, p.seq_len = 1, p.cache_len = 1, p.head_dim = 8, p.rotary_dim = 4;
    p.style = style;
    p.grad_key_cache = bhsd<const float>(gk.data(), 1, 1, 8);
    p.grad_value_cache = bhsd<const float>(gv.data(), 1, 1, 8);
    p.key_states = bhsd<const float>(key.data(), 1, 1, 8);
    p.cos = bsd<const float>(cos.data(), 1, 4);
    p.sin = bsd<const float>(sin.data(), 1, 4);
    p.cache_position = pos.data();
    return p;
  }
};
}  // namespace

TEST_CASE("cpu_backward with both styles and partial rotary, worked by hand", "[host][reference]") {
  Partial partial;
  // interleaved, pairs (0, 1), (2, 3): gx[a] = g[a] cos[a] + g[b] sin[b], gx[b] = g[b] cos[b] - g[a] sin[a]
  //   [1*.5 + 2*(-.5), 2*.25 - 1*.75, 3*(-1) + 4*1, 4*2 - 3*.125], then g[4..7] passed through
  // grad_sin: [-g0 k1, g1 k0, -g2 k3, g3 k2]
  const reference::BackwardGold il = reference::cpu_backward(partial.params(RotaryStyle::kInterleaved));
  CHECK(values(il.grad_key_states) == std::vector<double>{-0.5, -0.25, 1, 7.625, 5, 6, 7, 8});
  CHECK(values(il.grad_cos) == std::vector<double>{2, -2, 3, 12});
  CHECK(values(il.grad_sin) == std::vector<double>{1, 4, -9, 4});
  CHECK(il.grad_key_states[0].abs_sum == 1.5);
  CHECK(il.grad_key_states[5].abs_sum == 0);  // a pass-through element is a copy
  // rotate-half, pairs (0, 2), (1, 3):
  //   [1*.5 + 3*.125, 2*.25 + 4*1, 3*(-1) - 1*.75, 4*2 - 2*(-.5)]; grad_sin: [-g0 k2, -g1 k3, g2 k0, g3 k1]
  const reference::BackwardGold rh = reference::cpu_backward(partial.params(RotaryStyle::kRotateHalf));
  CHECK(values(rh.grad_key_states) == std::vector<double>{0.875, 4.5, -3.75, 9, 5, 6, 7, 8});
  CHECK(values(rh.grad_cos) == std::vector<double>{2, -2, 3, 12});
  CHECK(values(rh.grad_sin) == std::vector<double>{-1, -6, 6, -4});
  CHECK(values(rh.grad_cos_batch_sum) == values(rh.grad_cos));  // B = 1

  // The checker: the pass-through elements are copies, exact to the bit.
  const BackwardParams<float> in = partial.params(RotaryStyle::kRotateHalf);
  std::vector<float> gks{0.875f, 4.5f, -3.75f, 9, 5, 6, 7, 8}, gvs{9, 10, 11, 12, 13, 14, 15, 16};
  std::vector<float> gcos{2, -2, 3, 12}, gsin{-1, -6, 6, -4}, gk_in(8, 0.0f), gv_in(8, 0.0f);
  verify::BackwardOutputs<float> out;
  out.grad_key_states = bhsd<const float>(gks.data(), 1, 1, 8);
  out.grad_value_states = bhsd<const float>(gvs.data(), 1, 1, 8);
  out.grad_cos = bsd<const float>(gcos.data(), 1, 4);
  out.grad_sin = bsd<const float>(gsin.data(), 1, 4);
  out.grad_key_cache_input = bhsd<const float>(gk_in.data(), 1, 1, 8);
  out.grad_value_cache_input = bhsd<const float>(gv_in.data(), 1, 1, 8);
  verify::CheckResult r = verify::check_backward(in, out);
  INFO(r.first_mismatch);
  CHECK(r.ok());
  CHECK(r.checked == 8 + 8 + 4 + 4 + 8 + 8);
  gks[6] = std::nextafter(7.0f, 8.0f);
  r = verify::check_backward(in, out);
  CHECK(r.mismatches == 1);
  CHECK(r.first_mismatch.find("grad_key_states") != std::string::npos);
}

TEST_CASE("table gradients of batch_stride 0 hold the sum over the batch", "[host][reference]") {
  const int64_t B = 3, H = 2, S = 3, L = 4, D = 8, R = 4;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> gk(B * H * L * D), gv(gk.size()), key(B * H * S * D), cos(B * S * R), sin(cos.size());
  for (auto* buf : {&gk, &gv, &key, &cos, &sin})
    for (float& x : *buf) x = normal(rng);
  std::vector<int64_t> pos{2, -4, 3};
  for (RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved}) {
    INFO("style " << static_cast<int>(style));
    BackwardParams<float> in;
    in.batch = B, in.heads = H, in.seq_len = S, in.cache_len = L, in.head_dim = D, in.rotary_dim = R;
    in.style = style;
    in.grad_key_cache = bhsd<const float>(gk.data(), H, L, D);
    in.grad_value_cache = bhsd<const float>(gv.data(), H, L, D);
    in.key_states = bhsd<const float>(key.data(), H, S, D);
    in.cos = bsd<const float>(cos.data(), S, R);
    in.sin = bsd<const float>(sin.data(), S, R);
    in.cache_position = pos.data();
    const reference::BackwardGold g = reference::cpu_backward(in);
    for (int64_t i = 0; i < S * R; ++i) {
      double cos_sum = 0, sin_sum = 0, abs_sum = 0;
      for (int64_t b = 0; b < B; ++b) {
        cos_sum += g.grad_cos[b * S * R + i].value;
        sin_sum += g.grad_sin[b * S * R + i].value;
        abs_sum += g.grad_cos[b * S * R + i].abs_sum;
      }
      CHECK(g.grad_cos_batch_sum[i].value == Catch::Approx(cos_sum).epsilon(1e-12));
      CHECK(g.grad_sin_batch_sum[i].value == Catch::Approx(sin_sum).epsilon(1e-12));
      CHECK(g.grad_cos_batch_sum[i].abs_sum == Catch::Approx(abs_sum).epsilon(1e-12));
    }

    // Outputs rounded from the reference; the table gradients as one [S, R] table each (batch_stride 0).
    auto round = [](const std::vector<reference::Gold>& x) {
      std::vector<float> out;
      for (const auto& e : x) out.push_back(static_cast<float>(e.value));
      return out;
    };
    auto round_d = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    std::vector<float> gks = round(g.grad_key_states), gvs = round_d(g.grad_value_states);
    std::vector<float> gk_in = round_d(g.grad_key_cache_input), gv_in = round_d(g.grad_value_cache_input);
    std::vector<float> gcos = round(g.grad_cos_batch_sum), gsin = round(g.grad_sin_batch_sum);
    verify::BackwardOutputs<float> out;
    out.grad_key_states = bhsd<const float>(gks.data(), H, S, D);
    out.grad_value_states = bhsd<const float>(gvs.data(), H, S, D);
    out.grad_key_cache_input = bhsd<const float>(gk_in.data(), H, L, D);
    out.grad_value_cache_input = bhsd<const float>(gv_in.data(), H, L, D);
    out.grad_cos = bsd<const float>(gcos.data(), S, R, true);
    out.grad_sin = bsd<const float>(gsin.data(), S, R, true);
    verify::CheckResult r = verify::check_backward(in, out);
    INFO(r.first_mismatch);
    CHECK(r.ok());
    CHECK(r.checked == 2 * B * H * S * D + 2 * S * R + 2 * B * H * L * D);  // each summed table checked once

    // Batch 0's own gradient is not the sum.
    std::vector<float> cos0 = round(g.grad_cos);
    out.grad_cos = bsd<const float>(cos0.data(), S, R, true);
    r = verify::check_backward(in, out);
    CHECK(r.mismatches > 0);
    CHECK(r.first_mismatch.find("grad_cos") != std::string::npos);
    // ... but it is what a per-batch output holds.
    out.grad_cos = bsd<const float>(cos0.data(), S, R);
    r = verify::check_backward(in, out);
    CHECK(r.ok());
  }
}
