// Host tests of the append's planner (detail/append/plan.cuh): the launch it sizes on a made-up H200
// (132 SMs), with no GPU.
#include <kvrope/kvrope.cuh>

#include <cstdint>

#include "support/catch.hpp"

using namespace kvrope;
using namespace kvrope::detail;

namespace {

using T = __nv_bfloat16;

// q, k, v as views of one fused projection, NHD pages of 16, at 16-byte aligned (fake) addresses.
template <typename C = T>
AppendParams<T, C> shape(int64_t tokens, int64_t heads, int64_t query_heads, int64_t head_dim) {
  AppendParams<T, C> p{};
  p.tokens = tokens;
  p.heads = heads;
  p.query_heads = query_heads;
  p.head_dim = head_dim;
  T* qkv = reinterpret_cast<T*>(0x10000000);
  const int64_t token_stride = (query_heads + 2 * heads) * head_dim;
  p.query = TokenHeads<T>{qkv, token_stride, head_dim};
  p.key = TokenHeads<T>{qkv + query_heads * head_dim, token_stride, head_dim};
  p.value = TokenHeads<const T>{qkv + (query_heads + heads) * head_dim, token_stride, head_dim};
  p.positions = reinterpret_cast<const int64_t*>(0x20000000);
  p.cos_sin_cache_f32 = reinterpret_cast<const float*>(0x30000000);
  p.max_position = 4096;
  p.key_cache = nhd_pages(reinterpret_cast<C*>(0x40000000), 16, heads, head_dim);
  p.value_cache = nhd_pages(reinterpret_cast<C*>(0x50000000), 16, heads, head_dim);
  p.page_size = 16;
  p.num_pages = 1024;
  p.slot_mapping = reinterpret_cast<const int64_t*>(0x60000000);
  return p;
}

}  // namespace

TEST_CASE("append plan: lanes a row are the power of two that holds its units", "[host][plan]") {
  CHECK(append_lanes(1) == 1);
  CHECK(append_lanes(5) == 8);  // D = 80 in bf16: 5 units, 3 lanes idle
  CHECK(append_lanes(8) == 8);
  CHECK(append_lanes(16) == 16);
  CHECK(append_lanes(32) == 32);
  CHECK(append_lanes(64) == 32);  // more units than a warp: each lane loops
}

TEST_CASE("append plan: the path follows from the shape alone", "[host][plan]") {
  CHECK(append_path(0, 48) == AppendPath::kNone);
  CHECK(append_path(5, 0) == AppendPath::kNone);
  CHECK(append_path(1, 48) == AppendPath::kToken);
  CHECK(append_path(kAppendTokenMaxTokens, 48) == AppendPath::kToken);
  CHECK(append_path(kAppendTokenMaxTokens + 1, 48) == AppendPath::kTile);
}

TEST_CASE("append plan: a prefill's tiles, slices and grid", "[host][plan]") {
  AppendArgs<T, T> a = append_args(shape(4096, 8, 32, 128));
  REQUIRE(validate(shape(4096, 8, 32, 128)).ok());  // the fused views do not overlap
  REQUIRE(append_vectorizable(a));
  CHECK(a.q_out.data == a.q.data);  // no query_out: q rotated in place
  CHECK(a.q_out_fp8.data == nullptr);
  CHECK(a.k_out.data == nullptr);
  CHECK(a.k_back.data == nullptr);
  CHECK(a.num_slots == 16 * 1024);
  AppendGeometry g{};
  AppendPlan plan{};
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(plan.path == AppendPath::kTile);
  CHECK(plan.launched);
  CHECK(plan.vec_width == 8);
  CHECK(g.units == 8);  // D / (2 x 8)
  CHECK(g.rotary_units == 8);
  CHECK(plan.lanes == 8);
  CHECK(g.per_token == 32 + 2 * 8);
  CHECK(g.table_row_bytes == 128 * 4);  // fp32 cos and sin, R = 128
  CHECK(g.table_runs);
  CHECK(g.tile_tokens == 16);  // ceil(4096 / 264), a power of two: one tile a block
  CHECK(g.tiles == 256);
  CHECK(g.slices == 2);  // 32 groups over 16 tokens
  CHECK(g.hash_slots == 32);
  CHECK(plan.shared_bytes == 16 * 8 * 2 + 32 * 16);
  CHECK(plan.block == kAppendBlockThreads);
  CHECK(plan.grid == 256);
  a = append_args(shape(1 << 20, 8, 32, 128));
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.tile_tokens == kAppendTileMaxTokens);
  CHECK(g.slices == 1);
  CHECK(plan.grid == 264);
  CHECK(plan.shared_bytes <= append_tile_shared_bytes(kAppendTileMaxTokens, true));  // what the occupancy asks
  a = append_args(shape(1 << 20, 0, 32, 128));  // q only: no slots, no slot table
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.hash_slots == 0);
  a = append_args(shape(1100, 1, 1, 128));  // 3 rows a token: slices stop at the rows
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.tile_tokens == 8);
  CHECK(g.slices == 4);
}

TEST_CASE("append plan: few tokens take a group a row, a token's groups whole warps", "[host][plan]") {
  AppendArgs<T, T> a = append_args(shape(1, 8, 32, 128));
  AppendGeometry g{};
  AppendPlan plan{};
  plan_append_geometry(a, AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(plan.path == AppendPath::kToken);
  CHECK(g.slices == 48);  // 48 rows, a group (8 lanes) each
  CHECK(g.div_slices.divisor == 48);
  CHECK(plan.slices == 48);
  CHECK(plan.block == kAppendTokenBlockThreads);
  CHECK(plan.grid == 3);  // 48 groups of 8 lanes: 384 threads
  CHECK(plan.shared_bytes == 0);
  a = append_args(shape(kAppendTokenMaxTokens, 8, 64, 128));  // 80 rows
  plan_append_geometry(a, AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(g.slices == 80);
  CHECK(plan.grid == kAppendTokenMaxTokens * 80 * 8 / kAppendTokenBlockThreads);
  a = append_args(shape(3, 1, 1, 128));  // 3 rows: one warp a token, a group idle
  plan_append_geometry(a, AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(g.slices == 4);
  CHECK(plan.grid == 1);
  a = append_args(shape(8, 8, 32, 64));  // D = 64: 4 lanes a row, 8 groups a warp
  plan_append_geometry(a, AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(g.lanes == 4);
  CHECK(g.slices == 48);
  a = append_args(shape(8, 8, 31, 128));  // 47 rows round up to whole warps of 4 groups
  plan_append_geometry(a, AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(g.slices == 48);
}

TEST_CASE("append plan: a few-token call is planned without asking the device", "[host][plan]") {
  AppendPlan plan{};
  REQUIRE(plan_append(shape(8, 8, 32, 128), &plan).ok());  // (no GPU here: a device query would fail)
  CHECK(plan.path == AppendPath::kToken);
  CHECK(plan.launched);
  CHECK(plan.vec_width == 8);
}

TEST_CASE("append plan: table rows read as runs where their start allows", "[host][plan]") {
  AppendParams<T, T> p = shape(8, 8, 32, 128);
  AppendGeometry g{};
  AppendPlan plan{};
  plan_append_geometry(append_args(p), AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(g.table_runs);
  p.cos_sin_cache_f32 = reinterpret_cast<const float*>(0x30000004);
  plan_append_geometry(append_args(p), AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK_FALSE(g.table_runs);
  plan_append_geometry(append_args(p), AppendPath::kToken, 1, 0, 0, g, plan);  // a pair at a time: any start
  CHECK(g.table_runs);
}

TEST_CASE("append plan: fp8 q rows need chunks of their own bytes", "[host][plan]") {
  AppendParams<T, T> p = shape(8, 8, 32, 128);
  auto* q8 = reinterpret_cast<__nv_fp8_e4m3*>(0x70000000);
  p.query_out_fp8 = thd(q8, 32, 128);
  AppendArgs<T, T> a = append_args(p);
  CHECK(a.q_out.data == nullptr);  // q read only
  CHECK(a.q_out_fp8.data == q8);
  CHECK(append_vectorizable(a));
  p.query_out_fp8.token_stride = 32 * 128 + 4;  // 4 bytes off an 8-byte chunk
  CHECK_FALSE(append_vectorizable(append_args(p)));
}

TEST_CASE("append plan: the scalar path for misaligned rows, D and R", "[host][plan]") {
  AppendParams<T, T> p = shape(8, 8, 32, 128);
  CHECK(append_vectorizable(append_args(p)));
  p.head_dim = 120;  // 120 / 2 is not a whole number of 8-element chunks
  CHECK_FALSE(append_vectorizable(append_args(p)));
  p = shape(8, 8, 32, 128);
  p.rotary_dim = 64 + 8;  // (R / 2 = 36)
  CHECK_FALSE(append_vectorizable(append_args(p)));
  p = shape(8, 8, 32, 128);
  p.query.data += 1;  // one element off
  CHECK_FALSE(append_vectorizable(append_args(p)));
  AppendParams<T, __nv_fp8_e4m3> f = shape<__nv_fp8_e4m3>(8, 8, 32, 128);
  CHECK(append_vectorizable(append_args(f)));  // fp8 rows need 8-byte chunks only
  f.key_cache.head_stride = 128 + 4;           // 4 bytes off
  CHECK_FALSE(append_vectorizable(append_args(f)));
}

TEST_CASE("append plan: an empty call launches nothing and asks the device nothing", "[host][plan]") {
  AppendPlan plan{};
  plan.launched = true;
  REQUIRE(plan_append(shape(0, 8, 32, 128), &plan).ok());  // (no GPU here: a device query would fail)
  CHECK_FALSE(plan.launched);
}
