// Host tests of the backward's planner (detail/backward/plan.cuh): the launch it sizes for leaderboard shapes on a
// made-up H200 (132 SMs, 227 KiB of shared memory a block, sm_90 code), with no GPU.
#include <kvrope/kvrope.cuh>

#include <cstdint>

#include "support/catch.hpp"

using namespace kvrope;
using namespace kvrope::detail;

namespace {

constexpr DeviceFacts kH200{132, 232448, true};

// A contiguous BHSD call of bf16 rows at 16-byte aligned (fake) addresses.
ProblemArgs<__nv_bfloat16> shape(int64_t batch, int64_t heads, int64_t seq_len, int64_t cache_len, int64_t head_dim,
                                 bool in_place, bool tables = true) {
  using T = __nv_bfloat16;
  auto heads_at = [&](uintptr_t base, int64_t len) { return bhsd(reinterpret_cast<T*>(base), heads, len, head_dim); };
  auto table_at = [&](uintptr_t base) { return bsd(reinterpret_cast<T*>(base), seq_len, head_dim); };
  ProblemArgs<T> a{};
  a.batch = batch;
  a.heads = heads;
  a.seq_len = seq_len;
  a.cache_len = cache_len;
  a.head_dim = head_dim;
  a.gk = heads_at(0x1000000, cache_len);
  a.gv = heads_at(0x2000000, cache_len);
  a.gk_out = in_place ? heads_at(0x1000000, cache_len) : heads_at(0x3000000, cache_len);
  a.gv_out = in_place ? heads_at(0x2000000, cache_len) : heads_at(0x4000000, cache_len);
  a.key = heads_at(0x5000000, seq_len);
  a.cos = table_at(0x6000000);
  a.sin = table_at(0x7000000);
  a.grad_key = heads_at(0x8000000, seq_len);
  a.grad_value = heads_at(0x9000000, seq_len);
  if (tables) {
    a.grad_cos = table_at(0xa000000);
    a.grad_sin = table_at(0xb000000);
  }
  a.in_place = in_place;
  return a;
}

// The fused plan with `resident` blocks a SM (what the occupancy query gives on the H200: 2).
LaunchConfig plan_fused(const ProblemArgs<__nv_bfloat16>& a, unsigned int* workspace = nullptr, int resident = 2) {
  LaunchConfig config{};
  FusedArgs<__nv_bfloat16> f = plan_fused_block(a, RotarySpec{}, kHopperPolicy, kH200, vectorizable(a), config);
  plan_fused_grid(f, kHopperPolicy, kH200.sms, resident, workspace, config);
  return config;
}

}  // namespace

TEST_CASE("the policy per architecture", "[host][plan]") {
  CHECK(policy_for(9).block_threads == 384);
  CHECK(policy_for(9).bulk_copy);
  CHECK(policy_for(10).bulk_stages == policy_for(9).bulk_stages);
  CHECK_FALSE(policy_for(8).bulk_copy);
  CHECK(policy_for(8).block_threads == 256);
}

TEST_CASE("out of place: one bulk-copy warp a block beside eleven token warps, one wave", "[host][plan]") {
  const LaunchConfig c = plan_fused(shape(2, 8, 2048, 4096, 128, false));  // leaderboard case 9
  CHECK(c.plan.kernel == BackwardKernel::kFused);
  CHECK(c.plan.bulk_copy);
  CHECK(c.plan.block == 384);
  CHECK(c.token_warps == 11);
  CHECK(c.plan.grid == 264);
  CHECK(c.bulk_speculated_chunks == 6);  // 2 048 positions load in two rounds of 11 x 32 x 4
  CHECK(c.plan.shared_bytes == 4096 / 8 + 6 * (32768 + 16));
}

TEST_CASE("out of place: a small cache is cut into smaller chunks, speculated, its zero rows by the token warps",
          "[host][plan]") {
  const LaunchConfig c = plan_fused(shape(1, 8, 691, 2048, 128, false));  // leaderboard case 1
  CHECK(c.plan.bulk_copy);
  CHECK(c.bulk_chunk_rows < 128);  // fewer rows than a 32 KiB stage holds
  CHECK(c.bulk_chunk_rows * 256 >= 4096);
  CHECK(c.bulk_speculated_chunks == 6);
  CHECK(c.token_zeros);
}

TEST_CASE("out of place: a head's rows are spread evenly over its chunks, no short last chunk", "[host][plan]") {
  for (const int64_t head_dim : {80, 96}) {  // 204 and 170 rows a 32 KiB stage: 10.04 and 12.05 of 2 048
    INFO("head_dim " << head_dim);
    const LaunchConfig c = plan_fused(shape(2, 8, 256, 2048, head_dim, false));
    REQUIRE(c.plan.bulk_copy);
    const int64_t rows = c.bulk_chunk_rows, chunks = (2048 + rows - 1) / rows;
    CHECK(rows * head_dim * 2 <= 32768);
    CHECK(chunks == (head_dim == 80 ? 11 : 13));  // as many as chunks of a full stage's rows need: no more
    CHECK(rows * chunks - 2048 < chunks);         // the last chunk at most one row a chunk short of the others
  }
}

TEST_CASE("out of place: a large cache is shared through the workspace, never without one", "[host][plan]") {
  unsigned int word = 0;
  const auto a = shape(16, 8, 919, 8192, 128, false);  // leaderboard case 2
  CHECK(plan_fused(a, &word).bulk_shared_chunks > 0);
  CHECK(plan_fused(a, nullptr).bulk_shared_chunks == 0);
  CHECK_FALSE(plan_fused(a, &word).token_zeros);
}

TEST_CASE("in place: a block an item up to one wave, rows prefetched, no copy", "[host][plan]") {
  const LaunchConfig small = plan_fused(shape(4, 8, 1, 512, 96, true));
  CHECK_FALSE(small.plan.bulk_copy);
  CHECK(small.token_prefetch);
  CHECK(small.plan.grid == 4 * small.token_parts);
  const LaunchConfig many = plan_fused(shape(8, 8, 449, 4096, 128, true));  // leaderboard case 11
  CHECK(many.plan.grid == 264);
  CHECK(many.token_parts == 1);  // 3 592 tokens: more than four warps a SM already
  CHECK(many.plan.shared_bytes == 4096 / 8);
}

TEST_CASE("misaligned rows take the scalar path: no bulk copy, no prefetch", "[host][plan]") {
  auto a = shape(2, 8, 45, 512, 128, false);
  a.gk.data += 1;
  REQUIRE_FALSE(vectorizable(a));
  LaunchConfig config{};
  FusedArgs<__nv_bfloat16> f = plan_fused_block(a, RotarySpec{}, kHopperPolicy, kH200, false, config);
  CHECK(config.plan.vec_width == 1);
  plan_fused_grid(f, kHopperPolicy, kH200.sms, 2, nullptr, config);
  CHECK_FALSE(config.plan.bulk_copy);
  CHECK_FALSE(config.token_prefetch);
  CHECK(config.token_warps > 0);
  CHECK(config.token_warps < 12);  // the rest copy through registers
}

TEST_CASE("S = 1 takes the decode kernel: in place always, out of place up to 64 MiB of cache", "[host][plan]") {
  using T = __nv_bfloat16;
  CHECK(takes_decode(shape(4, 8, 1, 512, 128, true), kHopperPolicy, true));           // leaderboard case 12, in place
  CHECK(takes_decode(shape(4, 8, 1, 512, 128, false), kHopperPolicy, true));          // 16 MiB
  CHECK_FALSE(takes_decode(shape(32, 8, 1, 2048, 128, false), kHopperPolicy, true));  // case 10: 512 MiB
  CHECK(takes_decode(shape(32, 8, 1, 2048, 128, true), kHopperPolicy, true));
  CHECK_FALSE(takes_decode(shape(4, 8, 1, 512, 96, true), kHopperPolicy, true));  // no decode instance
  CHECK_FALSE(takes_decode(shape(4, 8, 2, 512, 128, true), kHopperPolicy, true));
  CHECK(decode_token_warps<T>(8, 128, true) == 2);
  CHECK(decode_token_warps<T>(8, 128, false) == 4);
  CHECK(decode_block(shape(4, 8, 1, 512, 128, false), kHopperPolicy) == 160);
  LaunchConfig c{};
  const auto a = shape(4, 8, 1, 512, 128, false);
  const DecodeArgs<T> d = plan_decode(a, decode_block(a, kHopperPolicy), 132, 2, c);
  CHECK(c.plan.kernel == BackwardKernel::kDecode);
  CHECK(d.token_blocks == 4);
  CHECK(c.plan.grid <= 264);
}

TEST_CASE("the planner sets the access width, the path and the rotation", "[host][plan]") {
  CHECK(backward_path(false, 0) == BackwardPath::kGenericScalar);
  CHECK(backward_path(false, 128) == BackwardPath::kGenericScalar);
  CHECK(backward_path(true, 0) == BackwardPath::kGenericVectorized);
  CHECK(backward_path(true, 128) == BackwardPath::kCompiledHeadDim);
  const auto a = shape(2, 8, 45, 512, 128, false);
  LaunchConfig config{};
  const RotarySpec rotary{64, RotaryStyle::kInterleaved, true};
  REQUIRE(rotary.general(128));
  REQUIRE_FALSE(RotarySpec{}.general(128));
  const FusedArgs<__nv_bfloat16> f = plan_fused_block(a, rotary, kHopperPolicy, kH200, true, config);
  CHECK(config.plan.vec_width == 8);
  CHECK(f.rotary_dim == 64);
  CHECK(f.style == RotaryStyle::kInterleaved);
  CHECK(f.rotary_units == 64 / (2 * kTokenVecMax));  // token chunks of at most kTokenVecMax elements
  CHECK(f.sum_batches);
  const FusedArgs<__nv_bfloat16> whole = plan_fused_block(a, RotarySpec{}, kHopperPolicy, kH200, false, config);
  CHECK(config.plan.vec_width == 1);
  CHECK(whole.rotary_dim == 128);
  CHECK(whole.rotary_units == 64);
  CHECK_FALSE(whole.sum_batches);
}

TEST_CASE("rotary_spec: table gradients summed over the batch only when B > 1", "[host][plan]") {
  using T = __nv_bfloat16;
  BackwardParams<T> p{};
  p.batch = 2;
  p.rotary_dim = 32;
  p.grad_cos = TokenRows<T>{reinterpret_cast<T*>(0x1000), 0, 64};
  CHECK(rotary_spec(p).sum_batches);
  CHECK(rotary_spec(p).rotary_dim == 32);
  p.batch = 1;
  CHECK_FALSE(rotary_spec(p).sum_batches);
  p.batch = 2;
  p.grad_cos.batch_stride = 64;
  CHECK_FALSE(rotary_spec(p).sum_batches);
  CHECK(workspace_of(p) == nullptr);
  CHECK(workspace_of(BackwardInPlaceParams<T>{}) == nullptr);
  CHECK(kIsInPlace<BackwardInPlaceParams<T, int32_t>>);
  CHECK_FALSE(kIsInPlace<BackwardParams<T, int32_t>>);
}
