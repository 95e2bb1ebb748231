// Host tests of the float64 CPU reference and its checker on a case small enough to work by hand.
#include <kvrope/reference/cpu_backward.hpp>

#include <vector>

#include "support/catch.hpp"

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
  reference::BackwardOutputs<float> out;
  out.grad_key_states = bhsd<const float>(gks.data(), 2, 1, 2);
  out.grad_value_states = bhsd<const float>(gvs.data(), 2, 1, 2);
  out.grad_cos = bsd<const float>(gcos.data(), 1, 2);
  out.grad_sin = bsd<const float>(gsin.data(), 1, 2);
  out.grad_key_cache_input = bhsd<const float>(gk_in.data(), 2, 2, 2);
  out.grad_value_cache_input = bhsd<const float>(gv_in.data(), 2, 2, 2);
  reference::CheckResult r = reference::check_backward(in, out);
  CHECK(r.ok());
  CHECK(r.checked == 4 + 4 + 2 + 2 + 8 + 8);

  gsin[1] = 20.001f;  // a computed output off by more than the tolerance
  r = reference::check_backward(in, out);
  CHECK(r.mismatches == 1);
  CHECK(r.first_mismatch.find("grad_sin") != std::string::npos);
  gsin[1] = 20;

  gv_in[2] = -0.0f;  // a zeroed row must be +0 bit for bit
  r = reference::check_backward(in, out);
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
