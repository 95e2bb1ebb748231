// Host tests of the per-element RoPE building blocks, the index division and the tolerance helpers
// (verify/tolerance.hpp).
#include <kvrope/detail/common/divmod.cuh>
#include <kvrope/reference/cpu_backward.hpp>
#include <kvrope/rope.cuh>

#include <random>

#include "support/catch.hpp"
#include "verify/tolerance.hpp"

using namespace kvrope;

namespace {
RopeChunk<2> chunk(float a, float b, float c, float d) { return RopeChunk<2>{{a, b}, {c, d}}; }
}  // namespace

TEST_CASE("rope_backward on a hand-worked row", "[host][rope]") {
  // D = 4, h = 2: g = [1, 2, 3, 4], cos = [.5, .25, .5, .25], sin = [.1, .2, .3, .4].
  const RopeChunk<2> out = rope_backward(chunk(1, 2, 3, 4), chunk(.5f, .25f, .5f, .25f), chunk(.1f, .2f, .3f, .4f));
  CHECK(out.lo[0] == Catch::Approx(1 * .5 + 3 * .3));   // g0 cos0 + g2 sin2 = 1.4
  CHECK(out.lo[1] == Catch::Approx(2 * .25 + 4 * .4));  // g1 cos1 + g3 sin3 = 2.1
  CHECK(out.hi[0] == Catch::Approx(3 * .5 - 1 * .1));   // g2 cos2 - g0 sin0 = 1.4
  CHECK(out.hi[1] == Catch::Approx(4 * .25 - 2 * .2));  // g3 cos3 - g1 sin1 = 0.6
}

TEST_CASE("rope_forward on a hand-worked row", "[host][rope]") {
  const RopeChunk<2> out = rope_forward(chunk(1, 2, 3, 4), chunk(.5f, .25f, .5f, .25f), chunk(.1f, .2f, .3f, .4f));
  CHECK(out.lo[0] == Catch::Approx(0.2));   // 1*.5 - 3*.1
  CHECK(out.lo[1] == Catch::Approx(-0.3));  // 2*.25 - 4*.2
  CHECK(out.hi[0] == Catch::Approx(1.8));   // 3*.5 + 1*.3
  CHECK(out.hi[1] == Catch::Approx(1.8));   // 4*.25 + 2*.4
}

TEST_CASE("accumulate_rope_table_grads on a hand-worked row", "[host][rope]") {
  RopeChunk<2> gcos = RopeChunk<2>::zeros(), gsin = RopeChunk<2>::zeros();
  accumulate_rope_table_grads(chunk(1, 2, 3, 4), chunk(5, 6, 7, 8), gcos, gsin);
  CHECK(gcos.lo[0] == 5);  // g * k
  CHECK(gcos.lo[1] == 12);
  CHECK(gcos.hi[0] == 21);
  CHECK(gcos.hi[1] == 32);
  CHECK(gsin.lo[0] == -7);  // g * rot(k), rot(k) = [-7, -8, 5, 6]
  CHECK(gsin.lo[1] == -16);
  CHECK(gsin.hi[0] == 15);
  CHECK(gsin.hi[1] == 24);
}

TEST_CASE("rope_backward is the adjoint of rope_forward, and the table grads its derivatives", "[host][rope]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> n;
  for (int trial = 0; trial < 100; ++trial) {
    RopeChunk<4> k, g, c, s;
    for (int i = 0; i < 4; ++i) {
      k.lo[i] = n(rng), k.hi[i] = n(rng), g.lo[i] = n(rng), g.hi[i] = n(rng);
      c.lo[i] = n(rng), c.hi[i] = n(rng), s.lo[i] = n(rng), s.hi[i] = n(rng);
    }
    // <forward(k), g> = <k, backward(g)>
    const RopeChunk<4> f = rope_forward(k, c, s), b = rope_backward(g, c, s);
    double lhs = 0, rhs = 0;
    for (int i = 0; i < 4; ++i) lhs += double(f.lo[i]) * g.lo[i] + double(f.hi[i]) * g.hi[i];
    for (int i = 0; i < 4; ++i) rhs += double(k.lo[i]) * b.lo[i] + double(k.hi[i]) * b.hi[i];
    CHECK(lhs == Catch::Approx(rhs).margin(1e-4));
    // <forward(k), g> is linear in cos and sin: its gradients are exactly the table grads.
    RopeChunk<4> gc = RopeChunk<4>::zeros(), gs = RopeChunk<4>::zeros();
    accumulate_rope_table_grads(g, k, gc, gs);
    double via_grads = 0;
    for (int i = 0; i < 4; ++i)
      via_grads += double(gc.lo[i]) * c.lo[i] + double(gc.hi[i]) * c.hi[i] + double(gs.lo[i]) * s.lo[i] +
                   double(gs.hi[i]) * s.hi[i];
    CHECK(lhs == Catch::Approx(via_grads).margin(1e-4));
  }
}

TEST_CASE("FastDivmod agrees with / and %", "[host][divmod]") {
  std::mt19937_64 rng(5);
  const uint32_t divisors[] = {1, 2, 3, 7, 8, 16, 33, 1000, 2048, 8191, 65537, 0x7FFFFFFFu, 0x80000001u, 0xFFFFFFFFu};
  for (uint32_t d : divisors) {
    const detail::FastDivmod fd(d);
    for (int i = 0; i < 20000; ++i) {
      uint64_t n = rng();
      if (i % 3) n &= 0xFFFFFFFFull;                           // mostly the fast path, sometimes the 64-bit one
      if (i % 5 == 0) n = (n % 4) + uint64_t{d} * (n % 1000);  // near multiples
      uint64_t rem = 0;
      const uint64_t q = fd.divmod(n, rem);
      INFO("n=" << n << " d=" << d);
      REQUIRE(q == n / d);
      REQUIRE(rem == n % d);
    }
  }
}

TEST_CASE("ulp and the tolerance follow docs/spec.md §1.7", "[host][tolerance]") {
  using verify::ulp;
  CHECK(ulp<__nv_bfloat16>(1.0) == std::ldexp(1.0, -7));
  CHECK(ulp<__half>(1.0) == std::ldexp(1.0, -10));
  CHECK(ulp<float>(1.0) == std::ldexp(1.0, -23));
  CHECK(ulp<__nv_bfloat16>(-3.0) == std::ldexp(1.0, -6));
  CHECK(ulp<__half>(0.0) == std::ldexp(1.0, -24));
  CHECK(ulp<float>(0.0) == std::ldexp(1.0, -149));
  // One bf16 step off passes, two fail; NaN never passes.
  const __nv_bfloat16 one = __float2bfloat16(1.0f);
  CHECK(verify::within_tolerance(one, 1.0 + std::ldexp(1.0, -7), 0.0));
  CHECK_FALSE(verify::within_tolerance(one, 1.0 + std::ldexp(1.0, -6), 0.0));
  CHECK_FALSE(verify::within_tolerance(__float2bfloat16(NAN), 1.0, 1.0));
  // The accumulation term: 2^-21 of the sum of absolute products.
  CHECK(verify::within_tolerance(1.0f, 1.0 + std::ldexp(1.0, -20), 2.5));
  CHECK_FALSE(verify::within_tolerance(1.0f, 1.0 + std::ldexp(1.0, -20), 1.0));
}
