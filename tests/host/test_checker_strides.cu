// Host test of the float64 reference and its checker (verify/check_backward.hpp) on strided layouts (BSHD with padding,
// a broadcast table, repeated and negative positions): outputs made by rounding the reference into the strided output
// views pass; one wrong element in any output is found and named.
#include <kvrope/reference/cpu_backward.hpp>

#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "verify/check_backward.hpp"

using namespace kvrope;

namespace {
using T = __nv_bfloat16;
constexpr int64_t B = 2, H = 3, S = 5, L = 9, D = 8, kPad = 3;

// [B, H, len, D] as BSHD with kPad elements after every row and every token.
HeadRows<T> padded(std::vector<T>& buf, int64_t len) {
  const int64_t head = D + kPad, seq = H * head + kPad;
  buf.assign(static_cast<size_t>(B * len * seq), __float2bfloat16(0.0f));
  return {buf.data(), len * seq, head, seq};
}
}  // namespace

TEST_CASE("check_backward on padded BSHD views with a broadcast table", "[host][reference]") {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<T> gk_buf, gv_buf, key_buf, gks_buf, gvs_buf, gk_in_buf, gv_in_buf;
  HeadRows<T> gk = padded(gk_buf, L), gv = padded(gv_buf, L), key = padded(key_buf, S);
  for (auto* b : {&gk_buf, &gv_buf, &key_buf})
    for (T& x : *b) x = __float2bfloat16(normal(rng));
  std::vector<T> cos(S * (D + kPad)), sin(cos.size()), gcos(B * S * D), gsin(gcos.size());
  for (T& x : cos) x = __float2bfloat16(normal(rng));
  for (T& x : sin) x = __float2bfloat16(normal(rng));
  std::vector<int64_t> pos{3, -1, 3, 0, 7};  // row 3 twice, row 8 as -1

  BackwardParams<T> in;
  in.batch = B, in.heads = H, in.seq_len = S, in.cache_len = L, in.head_dim = D;
  in.grad_key_cache = gk;
  in.grad_value_cache = gv;
  in.key_states = key;
  in.cos = TokenRows<const T>{cos.data(), 0, D + kPad};
  in.sin = TokenRows<const T>{sin.data(), 0, D + kPad};
  in.cache_position = pos.data();

  // The outputs: the reference rounded once to bf16, written through strided views.
  const reference::BackwardGold g = reference::cpu_backward(in);
  HeadRows<T> gks = padded(gks_buf, S), gvs = padded(gvs_buf, S), gk_in = padded(gk_in_buf, L),
              gv_in = padded(gv_in_buf, L);
  auto bf = [](double x) { return __float2bfloat16(static_cast<float>(x)); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < H; ++j) {
      for (int64_t t = 0; t < S; ++t)
        for (int64_t d = 0; d < D; ++d) {
          gks.row(b, j, t)[d] = bf(g.grad_key_states[((b * H + j) * S + t) * D + d].value);
          gvs.row(b, j, t)[d] = bf(g.grad_value_states[((b * H + j) * S + t) * D + d]);
        }
      for (int64_t s = 0; s < L; ++s)
        for (int64_t d = 0; d < D; ++d) {
          gk_in.row(b, j, s)[d] = bf(g.grad_key_cache_input[((b * H + j) * L + s) * D + d]);
          gv_in.row(b, j, s)[d] = bf(g.grad_value_cache_input[((b * H + j) * L + s) * D + d]);
        }
    }
  for (size_t i = 0; i < gcos.size(); ++i) gcos[i] = bf(g.grad_cos[i].value), gsin[i] = bf(g.grad_sin[i].value);

  verify::BackwardOutputs<T> out;
  out.grad_key_states = gks;
  out.grad_value_states = gvs;
  out.grad_key_cache_input = gk_in;
  out.grad_value_cache_input = gv_in;
  out.grad_cos = bsd<const T>(gcos.data(), S, D);
  out.grad_sin = bsd<const T>(gsin.data(), S, D);
  verify::CheckResult r = verify::check_backward(in, out);
  INFO(r.first_mismatch);
  CHECK(r.ok());
  CHECK(r.checked == 2 * B * H * S * D + 2 * B * S * D + 2 * B * H * L * D);

  // Rows 3, 8 and 0 are zeroed in both cache grads; 7 too; the rest are copies.
  CHECK(__bfloat162float(gk_in.row(1, 2, 8)[5]) == 0.0f);
  CHECK(__bfloat162float(gv_in.row(0, 1, 3)[0]) == 0.0f);

  // One wrong element anywhere is found and named.
  struct Case {
    T* element;
    const char* name;
  };
  for (const Case c :
       {Case{&gks.row(1, 2, 4)[7], "grad_key_states"}, Case{&gvs.row(0, 0, 1)[0], "grad_value_states"},
        Case{&gk_in.row(1, 0, 2)[3], "grad_key_cache_input"}, Case{&gv_in.row(0, 2, 3)[1], "grad_value_cache_input"},
        Case{&gcos[B * S * D - 1], "grad_cos"}, Case{&gsin[0], "grad_sin"}}) {
    const T saved = *c.element;
    *c.element = __float2bfloat16(__bfloat162float(saved) + 1.0f);
    r = verify::check_backward(in, out);
    CHECK(r.mismatches == 1);
    CHECK(r.first_mismatch.find(c.name) != std::string::npos);
    *c.element = saved;
  }
}
