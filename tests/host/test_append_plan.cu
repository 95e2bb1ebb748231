// Host tests of the append's planner (detail/append/plan.cuh): the launch it sizes on a made-up H200
// (132 SMs), with no GPU.
#include <kvrope/kvrope.cuh>

#include <cstdint>
#include <string>

#include "support/catch.hpp"
#include "support/fake_append.hpp"

using namespace kvrope;
using namespace kvrope::detail;

namespace {

using T = __nv_bfloat16;

// q, k, v as views of one fused projection, NHD pages of 16, at fake addresses.
template <typename C = T>
AppendParams<T, C> shape(int64_t tokens, int64_t heads, int64_t query_heads, int64_t head_dim) {
  return fake_append<T, C>(tokens, heads, query_heads, head_dim);
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

TEST_CASE("append plan: rows, lanes, tiles and the grid of a prefill", "[host][plan]") {
  AppendArgs<T, T> a = append_args(shape(4096, 8, 32, 128));
  AppendGeometry g{};
  REQUIRE(validate(shape(4096, 8, 32, 128)).ok());  // the fused views do not overlap
  REQUIRE(append_vectorizable(a));
  CHECK(a.q_out.data == a.q.data);  // no query_out: q rotated in place
  CHECK(a.k_out.data == nullptr);
  CHECK(a.k_back.data == nullptr);
  CHECK(a.num_slots == 16 * 1024);
  AppendPlan plan{};
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(plan.launched);
  CHECK(plan.vec_width == 8);
  CHECK(g.units == 8);  // D / (2 x 8)
  CHECK(g.rotary_units == 8);
  CHECK(plan.lanes == 8);
  CHECK(g.table_row_bytes == 128 * 4);  // fp32 cos and sin, R = 128
  CHECK(g.table_copy_bytes == 16);
  CHECK(g.tile_tokens == 16);  // ceil(4096 / 264): one tile a block
  CHECK(plan.tile_tokens == 16);
  CHECK(g.tiles == 256);
  CHECK(g.hash_slots == 32);
  CHECK(g.ring_bytes == kAppendRowStages * 2 * 16 * kAppendBlockThreads);  // a ring row: two 16-byte chunks a thread
  CHECK(plan.shared_bytes == 16 * 512 + 16 * 8 + 32 * 16 + g.ring_bytes);
  CHECK(plan.block == kAppendBlockThreads);
  CHECK(plan.grid == 256);
}

TEST_CASE("append plan: a tile's tokens fill one wave, up to what its shared memory holds", "[host][plan]") {
  AppendArgs<T, T> a = append_args(shape(1, 8, 32, 128));
  AppendGeometry g{};
  AppendPlan plan{};
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.tile_tokens == 1);
  CHECK(g.row_splits == 1);  // 48 rows: one pass of the block's 32 groups, two rows each
  CHECK(g.tiles == 1);
  a = append_args(shape(1, 8, 64, 128));  // 80 rows: two blocks of 40, each one pass
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.row_splits == 2);
  CHECK(g.split_rows == 40);
  CHECK(g.tiles == 2);
  a = append_args(shape(200, 8, 64, 128));  // more tokens than a wave's half: no split
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.row_splits == 1);
  CHECK(g.split_rows == 80);
  a = append_args(shape(1 << 20, 8, 32, 128));
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.tile_tokens == 64);  // 64 fp32 table rows of 512 bytes and their slots fit 48 KiB, 128 do not
  CHECK(plan.shared_bytes - g.ring_bytes <= kAppendSharedBudget);
  CHECK(append_most_shared_bytes(a, 8) == plan.shared_bytes);
  CHECK(plan.grid == 264);
  AppendParams<T, T> p = shape(1 << 20, 8, 32, 128);
  p.cos_sin_cache_f32 = nullptr;
  p.cos_sin_cache = reinterpret_cast<const T*>(0x30000000);  // a bf16 table: rows of 256 bytes
  a = append_args(p);
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.tile_tokens == kAppendTileMaxTokens);
  p = shape(1 << 20, 0, 32, 128);  // q only: no slots, no slot table
  a = append_args(p);
  plan_append_geometry(a, AppendPath::kTile, 8, 132, 2, g, plan);
  CHECK(g.hash_slots == 0);
}

TEST_CASE("append plan: the path follows from the shape alone", "[host][plan]") {
  CHECK(append_path(append_args(shape(0, 8, 32, 128)), 8) == AppendPath::kNone);
  CHECK(append_path(append_args(shape(1, 8, 32, 128)), 8) == AppendPath::kToken);
  CHECK(append_path(append_args(shape(kAppendTokenMaxTokens, 8, 32, 128)), 8) == AppendPath::kToken);
  CHECK(append_path(append_args(shape(kAppendTokenMaxTokens + 1, 8, 32, 128)), 8) == AppendPath::kTile);
  CHECK(append_path(append_args(shape(8, 8, 32, 128)), 1) == AppendPath::kTile);  // the scalar path: tiles
  AppendParams<T, T> p = shape(8, 8, 32, 128);
  p.rotary_dim = 2;  // table rows of 8 bytes: no 16-byte runs
  CHECK(append_path(append_args(p), 8) == AppendPath::kTile);
  CHECK(append_chunk(append_args(shape(8, 8, 32, 128))) == 8);
  CHECK(append_chunk(append_args(shape(8, 8, 32, 1024))) == 1);  // 64 units: a lane loops, a pair at a time
  for (const int64_t tokens : {1, kAppendTokenMaxTokens, kAppendTokenMaxTokens + 1}) {
    p = shape(tokens, 8, 32, 128);  // mRoPE: the path of the same shape with ordinary positions
    p.mrope_section[0] = 16;
    p.mrope_section[1] = p.mrope_section[2] = 24;
    p.position_stream_stride = tokens;
    CHECK(append_path(append_args(p), 8) == append_path(append_args(shape(tokens, 8, 32, 128)), 8));
  }
}

TEST_CASE("append plan: few tokens take a warp a token's rows, nothing staged", "[host][plan]") {
  AppendArgs<T, T> a = append_args(shape(1, 8, 32, 128));
  AppendGeometry g{};
  AppendPlan plan{};
  plan_append_geometry(a, AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(plan.path == AppendPath::kToken);
  CHECK(g.token_warps == 12);  // 48 rows, 4 a warp (8 lanes a row)
  CHECK(plan.token_warps == 12);
  CHECK(g.div_token_warps.divisor == 12);
  CHECK(plan.block == kAppendTokenBlockThreads);
  CHECK(plan.grid == 3);  // 12 warps, 4 a block
  CHECK(plan.shared_bytes == 0);
  a = append_args(shape(kAppendTokenMaxTokens, 8, 64, 128));  // 80 rows: 20 warps a token
  plan_append_geometry(a, AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(g.token_warps == 20);
  CHECK(plan.grid == kAppendTokenMaxTokens * 20 / 4);
  a = append_args(shape(3, 1, 1, 128));  // 3 rows: one warp, a group idle
  plan_append_geometry(a, AppendPath::kToken, 8, 0, 0, g, plan);
  CHECK(g.token_warps == 1);
  CHECK(plan.grid == 1);
}

TEST_CASE("append plan: a few-token call is planned without asking the device", "[host][plan]") {
  AppendPlan plan{};
  REQUIRE(plan_append(shape(8, 8, 32, 128), &plan).ok());  // (no GPU here: a device query would fail)
  CHECK(plan.path == AppendPath::kToken);
  CHECK(plan.launched);
  CHECK(plan.vec_width == 8);
  CHECK(plan.token_warps == 12);
}

TEST_CASE("append plan: fp8 q rows need chunks of their own bytes", "[host][plan]") {
  AppendParams<T, T> p = shape(8, 8, 32, 128);
  auto* q8 = reinterpret_cast<__nv_fp8_e4m3*>(0x70000000);
  p.query_out_fp8 = thd(q8, 32, 128);
  REQUIRE(validate(p).ok());
  AppendArgs<T, T> a = append_args(p);
  CHECK(a.q_out.data == nullptr);  // q read only
  CHECK(a.q_out_fp8.data == q8);
  CHECK(append_vectorizable(a));
  p.query_out_fp8.token_stride = 32 * 128 + 4;  // 4 bytes off an 8-byte chunk
  CHECK_FALSE(append_vectorizable(append_args(p)));
}

TEST_CASE("append validate: fp8 q excludes query_out; its scale needs it", "[host][plan]") {
  AppendParams<T, T> p = shape(8, 8, 32, 128);
  auto* q8 = reinterpret_cast<__nv_fp8_e4m3*>(0x70000000);
  p.query_out_fp8 = thd(q8, 32, 128);
  p.query_out = thd(reinterpret_cast<T*>(0x78000000), 32, 128);
  Status s = validate(p);
  CHECK(s.code == StatusCode::kConflictingFields);
  CHECK(std::string(s.field) == "query_out_fp8");
  p.query_out = {};
  p.query_out_fp8 = {};
  p.query_scale = reinterpret_cast<const float*>(0x7c000000);
  s = validate(p);
  CHECK(s.code == StatusCode::kConflictingFields);
  CHECK(std::string(s.field) == "query_scale");
  const int64_t tokens = p.tokens;
  p.tokens = 0;  // an empty fp8 query_out may have no data (torch's empty tensors have none)
  CHECK(validate(p).ok());
  p.tokens = tokens;
  p.query_out_fp8 = thd(q8, 32, 128);
  p.query_out_fp8.data = reinterpret_cast<__nv_fp8_e4m3*>(0x10000000);  // onto q's own rows
  s = validate(p);
  CHECK_FALSE(s.ok());
}

TEST_CASE("append plan: table rows copied as wide as their size and start allow", "[host][plan]") {
  AppendParams<T, T> p = shape(8, 8, 32, 128);
  p.rotary_dim = 2;  // 8 bytes of fp32
  CHECK(append_table_copy_bytes(append_args(p)) == 8);
  p.cos_sin_cache_f32 = nullptr;
  p.cos_sin_cache = reinterpret_cast<const T*>(0x30000002);  // bf16, 4 bytes a row, 2-byte aligned
  CHECK(append_table_copy_bytes(append_args(p)) == 2);
  p.cos_sin_cache = reinterpret_cast<const T*>(0x30000004);
  CHECK(append_table_copy_bytes(append_args(p)) == 4);
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
