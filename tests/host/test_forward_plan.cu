// Host tests of the forward's planner (detail/forward/plan.cuh): the launch it sizes on a made-up H200
// (132 SMs), with no GPU.
#include <kvrope/kvrope.cuh>

#include <cstdint>

#include "support/catch.hpp"

using namespace kvrope;
using namespace kvrope::detail;

namespace {

using T = __nv_bfloat16;

// A contiguous BHSD forward with per-token tables at 16-byte aligned (fake) addresses.
ForwardParams<T> shape(int64_t batch, int64_t heads, int64_t seq_len, int64_t cache_len, int64_t head_dim,
                       int64_t query_heads = 0) {
  auto heads_at = [&](uintptr_t base, int64_t h, int64_t len) {
    return bhsd(reinterpret_cast<T*>(base), h, len, head_dim);
  };
  ForwardParams<T> p{};
  p.batch = batch;
  p.heads = heads;
  p.seq_len = seq_len;
  p.cache_len = cache_len;
  p.head_dim = head_dim;
  p.key_states = heads_at(0x1000000, heads, seq_len);
  p.value_states = heads_at(0x2000000, heads, seq_len);
  p.key_cache = heads_at(0x3000000, heads, cache_len);
  p.value_cache = heads_at(0x4000000, heads, cache_len);
  p.cache_position = reinterpret_cast<const int64_t*>(0x5000000);
  p.cos = bsd(reinterpret_cast<const T*>(0x6000000), seq_len, head_dim);
  p.sin = bsd(reinterpret_cast<const T*>(0x7000000), seq_len, head_dim);
  p.query_heads = query_heads;
  if (query_heads) p.query = heads_at(0x8000000, query_heads, seq_len);
  return p;
}

}  // namespace

TEST_CASE("forward plan: units, items, the repeat bitmask and the grid", "[host][plan]") {
  ForwardArgs<T> a = forward_args(shape(4, 8, 512, 4096, 128, 32));
  REQUIRE(forward_vectorizable(a));
  CHECK(a.q_out.data == a.q.data);  // no query_out: q rotated in place
  ForwardPlan plan{};
  plan_forward_launch(a, 8, 132, 8, plan);
  CHECK(plan.launched);
  CHECK(plan.vec_width == 8);
  CHECK(a.units == 8);  // D / (2 x 8)
  CHECK(a.rotary_units == 8);
  CHECK(a.items == 4 * 512 * (8 + 32) * 8);
  CHECK(a.mask_words == 4096 / 32);
  CHECK(plan.shared_bytes == 2 * 4096 / 8);
  CHECK(plan.block == kForwardBlockThreads);
  CHECK(plan.grid == 132 * 8);  // one wave at most
}

TEST_CASE("forward plan: a decode step has no bitmask and a smaller block", "[host][plan]") {
  ForwardArgs<T> a = forward_args(shape(2, 8, 1, 4096, 128));
  ForwardPlan plan{};
  plan_forward_launch(a, 8, 132, 16, plan);
  CHECK(a.mask_words == 0);
  CHECK(plan.shared_bytes == 0);
  CHECK(plan.block == kForwardDecodeBlockThreads);
  CHECK(plan.grid == 1);  // 2 x 8 x 8 items
}

TEST_CASE("forward plan: long caches hash onto the largest bitmask; odd rows take the scalar path", "[host][plan]") {
  ForwardArgs<T> a = forward_args(shape(1, 8, 16, int64_t{1} << 20, 128));
  ForwardPlan plan{};
  plan_forward_launch(a, 8, 132, 8, plan);
  CHECK(a.mask_words == kForwardMaskRows / 32);
  ForwardParams<T> p = shape(1, 8, 16, 64, 128);
  p.rotary_dim = 8;  // half of R is not a whole 16-byte vector
  CHECK_FALSE(forward_vectorizable(forward_args(p)));
  p = shape(1, 8, 16, 64, 128);
  p.key_cache.data += 1;
  CHECK_FALSE(forward_vectorizable(forward_args(p)));
  ForwardArgs<T> scalar = forward_args(p);
  plan_forward_launch(scalar, 1, 132, 8, plan);
  CHECK(plan.vec_width == 1);
  CHECK(scalar.units == 64);
}
