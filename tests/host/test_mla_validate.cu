// Host tests of the MLA append's validate and planner (kvrope/mla_append.cuh, detail/mla/): each field named
// when it is wrong, what is allowed, the instance and launch a call gets, with fake addresses (nothing read).
#include <kvrope/kvrope.cuh>

#include <cstdint>
#include <string>

#include "support/catch.hpp"

using namespace kvrope;
using namespace kvrope::detail;

namespace {

using T = __nv_bfloat16;

// DeepSeek-V3's shapes by default: a fused q [T, Hq, N + R] (q_nope = q, q_pe = q + N), kv_c and k_pe views of
// one projection [T, L + R], vLLM's one cache [pages, 16, L + R], fp32 tables; every pointer a fake 16-byte
// aligned address.
template <typename C = T, typename Pos = int64_t>
MlaAppendParams<T, C, Pos> fake_mla(int64_t tokens = 64, int64_t query_heads = 16, int64_t nope = 128,
                                    int64_t rotary = 64, int64_t latent = 512) {
  MlaAppendParams<T, C, Pos> p{};
  p.tokens = tokens;
  p.query_heads = query_heads;
  p.nope_dim = nope;
  p.rotary_dim = rotary;
  p.latent_dim = latent;
  T* q = reinterpret_cast<T*>(0x10000000);
  const int64_t w = nope + rotary;
  p.query_pe = {q + nope, query_heads * w, w};
  p.query_nope = {q, query_heads * w, w};
  T* kv = reinterpret_cast<T*>(0x20000000);
  p.kv_c = kv;
  p.kv_c_stride = latent + rotary;
  p.k_pe = kv + latent;
  p.k_pe_stride = latent + rotary;
  p.positions = reinterpret_cast<const Pos*>(0x30000000);
  p.cos_sin_cache_f32 = reinterpret_cast<const float*>(0x40000000);
  p.max_position = 4096;
  C* cache = reinterpret_cast<C*>(0x50000000);
  p.page_size = 16;
  p.num_pages = 256;
  p.latent_cache = mla_concat_latent(cache, 16, latent, rotary);
  p.rope_cache = mla_concat_rope(cache, 16, latent, rotary);
  p.slot_mapping = reinterpret_cast<const int64_t*>(0x60000000);
  p.error_flag = reinterpret_cast<int*>(0x70000000);
  return p;
}

// Out of place: rows [T, Hq, N + R] at a fake address of their own.
template <typename C>
void set_query_out(MlaAppendParams<T, C>& p, bool fp8, bool nope) {
  const int64_t w = p.nope_dim + p.rotary_dim;
  if (fp8)
    p.query_out_fp8 = {reinterpret_cast<__nv_fp8_e4m3*>(0x80000000), p.query_heads * w, w};
  else
    p.query_out = {reinterpret_cast<T*>(0x80000000), p.query_heads * w, w};
  p.write_query_nope = nope;
}

std::string field_of(const Status& s) { return s.field ? s.field : ""; }
std::string other_of(const Status& s) { return s.other ? s.other : ""; }

template <typename P>
void expect_fail(const P& p, StatusCode code, const char* field, const char* other = nullptr) {
  const Status s = validate_mla_append(p);
  INFO(to_string(s.code) << " " << field_of(s) << " / " << other_of(s));
  CHECK(s.code == code);
  CHECK(field_of(s) == field);
  if (other) CHECK(other_of(s) == other);
  MlaPlan plan{};
  CHECK(plan_mla_append(p, &plan).code == code);  // the launchers validate first
}

}  // namespace

TEST_CASE("mla validate: DeepSeek-V3's calls, both layouts, q in place and out, fp8, are accepted", "[host][mla]") {
  CHECK(validate_mla_append(fake_mla()).ok());
  CHECK(validate(fake_mla()).ok());
  CHECK(validate_mla_append(fake_mla<T, int32_t>()).ok());
  auto split = fake_mla();
  split.latent_cache = mla_cache_rows(reinterpret_cast<T*>(0x50000000), 16, 512);
  split.rope_cache = mla_cache_rows(reinterpret_cast<T*>(0x58000000), 16, 64);
  CHECK(validate_mla_append(split).ok());
  for (const bool fp8 : {false, true})
    for (const bool nope : {false, true}) {
      auto p = fake_mla();
      set_query_out(p, fp8, nope);
      if (fp8) p.query_scale = reinterpret_cast<const float*>(0x90000000);
      INFO("fp8 " << fp8 << " nope " << nope);
      CHECK(validate_mla_append(p).ok());
    }
  auto e4m3 = fake_mla<__nv_fp8_e4m3>();
  e4m3.kv_scale = reinterpret_cast<const float*>(0x90000000);
  CHECK(validate_mla_append(e4m3).ok());
  CHECK(validate_mla_append(fake_mla<__nv_fp8_e5m2>()).ok());  // (no scale: 1)
  // No query heads: q may be absent; no tokens: nothing else is needed but the caches' rows.
  auto no_q = fake_mla(64, 0);
  no_q.query_pe = {};
  no_q.query_nope = {};
  CHECK(validate_mla_append(no_q).ok());
  auto empty = fake_mla(0);
  empty.query_pe = {};
  empty.kv_c = empty.k_pe = nullptr;
  empty.positions = nullptr;
  empty.slot_mapping = nullptr;
  empty.cos_sin_cache_f32 = nullptr;
  CHECK(validate_mla_append(empty).ok());
  // One cache with a gap between the parts, or the rope part first: rows of the same strides, one output.
  for (const int64_t rope_at : {520, -64}) {
    auto gap = fake_mla();
    T* rows = reinterpret_cast<T*>(0x50000000) + 64;  // [rope | latent] rows start at the rope part
    gap.latent_cache = mla_cache_rows(rope_at > 0 ? rows - 64 : rows, 16, 592);
    gap.rope_cache = {gap.latent_cache.data + rope_at, gap.latent_cache.page_stride, 592};
    INFO("rope at " << rope_at);
    CHECK(validate_mla_append(gap).ok());
  }
  // In place, q_nope is not read: it may be null.
  auto in_place = fake_mla();
  in_place.query_nope = {};
  CHECK(validate_mla_append(in_place).ok());
}

TEST_CASE("mla validate: sizes, each named", "[host][mla]") {
  auto p = fake_mla();
  p.tokens = -1;
  expect_fail(p, StatusCode::kInvalidSize, "tokens");
  p = fake_mla();
  p.query_heads = -1;
  expect_fail(p, StatusCode::kInvalidSize, "query_heads");
  p = fake_mla();
  p.nope_dim = -2;
  expect_fail(p, StatusCode::kInvalidSize, "nope_dim");
  for (const int64_t r : {0, -2, 63}) {
    p = fake_mla();
    p.rotary_dim = r;
    expect_fail(p, StatusCode::kInvalidRotaryDim, "rotary_dim");
  }
  p = fake_mla();
  p.latent_dim = 0;
  expect_fail(p, StatusCode::kInvalidSize, "latent_dim");
  p = fake_mla();
  p.style = static_cast<RotaryStyle>(7);
  expect_fail(p, StatusCode::kInvalidStyle, "style");
  p = fake_mla();
  p.max_position = -1;
  expect_fail(p, StatusCode::kInvalidSize, "max_position");
  p = fake_mla();
  p.page_size = 0;
  expect_fail(p, StatusCode::kInvalidSize, "page_size");
  p = fake_mla();
  p.num_pages = -1;
  expect_fail(p, StatusCode::kInvalidSize, "num_pages");
  p = fake_mla();
  p.latent_dim = (int64_t{1} << 30) + 2;
  expect_fail(p, StatusCode::kTooLarge, "latent_dim");
  p = fake_mla();
  p.nope_dim = (int64_t{1} << 30) + 2;
  expect_fail(p, StatusCode::kTooLarge, "nope_dim");
  p = fake_mla(1, (int64_t{1} << 30) + 1);
  expect_fail(p, StatusCode::kTooLarge, "query_heads");
  p = fake_mla();
  p.page_size = int64_t{1} << 33;
  expect_fail(p, StatusCode::kTooLarge, "page_size");
  p = fake_mla();
  p.num_pages = int64_t{1} << 40;
  p.page_size = int64_t{1} << 30;
  expect_fail(p, StatusCode::kTooLarge, "num_pages");
  p = fake_mla(int64_t{1} << 28, 16);  // (T (Hq + 1) warps: more than 2^32)
  expect_fail(p, StatusCode::kTooLarge, "tokens");
}

TEST_CASE("mla validate: fields that exclude each other, and the scales' use", "[host][mla]") {
  auto p = fake_mla();
  p.cos_sin_cache = reinterpret_cast<const T*>(0x41000000);
  expect_fail(p, StatusCode::kConflictingFields, "cos_sin_cache", "cos_sin_cache_f32");
  p = fake_mla();
  set_query_out(p, false, false);
  p.query_out_fp8 = {reinterpret_cast<__nv_fp8_e4m3*>(0xA0000000), 16 * 192, 192};
  expect_fail(p, StatusCode::kConflictingFields, "query_out_fp8", "query_out");
  p = fake_mla();
  p.query_scale = reinterpret_cast<const float*>(0x90000000);
  expect_fail(p, StatusCode::kConflictingFields, "query_scale", "query_out_fp8");
  set_query_out(p, false, false);
  expect_fail(p, StatusCode::kConflictingFields, "query_scale", "query_out_fp8");
  p = fake_mla();
  p.write_query_nope = true;  // in place: q_nope has nowhere to go
  expect_fail(p, StatusCode::kConflictingFields, "write_query_nope", "query_out");
  p = fake_mla();
  p.kv_scale = reinterpret_cast<const float*>(0x90000000);  // caches in T
  expect_fail(p, StatusCode::kConflictingFields, "kv_scale", "latent_cache");
}

TEST_CASE("mla validate: required pointers, each named", "[host][mla]") {
  auto p = fake_mla();
  p.cos_sin_cache_f32 = nullptr;
  expect_fail(p, StatusCode::kNullPointer, "cos_sin_cache");
  p = fake_mla();
  p.query_pe = {};
  expect_fail(p, StatusCode::kNullPointer, "query_pe");
  p = fake_mla();
  set_query_out(p, false, true);
  p.query_nope = {};
  expect_fail(p, StatusCode::kNullPointer, "query_nope");
  p = fake_mla();
  p.kv_c = nullptr;
  expect_fail(p, StatusCode::kNullPointer, "kv_c");
  p = fake_mla();
  p.k_pe = nullptr;
  expect_fail(p, StatusCode::kNullPointer, "k_pe");
  p = fake_mla();
  p.positions = nullptr;
  expect_fail(p, StatusCode::kNullPointer, "positions");
  p = fake_mla();
  p.slot_mapping = nullptr;
  expect_fail(p, StatusCode::kNullPointer, "slot_mapping");
  p = fake_mla();
  p.latent_cache.data = nullptr;
  p.rope_cache.data = nullptr;
  expect_fail(p, StatusCode::kNullPointer, "latent_cache");
  p = fake_mla();
  p.rope_cache = mla_cache_rows<T>(nullptr, 16, 64);
  expect_fail(p, StatusCode::kNullPointer, "rope_cache");
}

TEST_CASE("mla validate: strides, overlapping rows and aliasing, each named", "[host][mla]") {
  auto p = fake_mla();
  p.query_pe.head_stride = -1;
  expect_fail(p, StatusCode::kInvalidStride, "query_pe.head_stride");
  p = fake_mla();
  p.kv_c_stride = -1;
  expect_fail(p, StatusCode::kInvalidStride, "kv_c_stride");
  p = fake_mla();
  p.k_pe_stride = -1;
  expect_fail(p, StatusCode::kInvalidStride, "k_pe_stride");
  p = fake_mla();
  set_query_out(p, false, true);
  p.query_nope.token_stride = -1;
  expect_fail(p, StatusCode::kInvalidStride, "query_nope.token_stride");
  // q in place: its rows of R must not overlap each other.
  p = fake_mla();
  p.query_pe.head_stride = 32;
  expect_fail(p, StatusCode::kOverlappingRows, "query_pe.head_stride");
  // query_out rows are N + R long.
  p = fake_mla();
  set_query_out(p, false, false);
  p.query_out.head_stride = 128;
  expect_fail(p, StatusCode::kOverlappingRows, "query_out.head_stride");
  p = fake_mla();
  set_query_out(p, true, false);
  p.query_out_fp8.token_stride = -3;
  expect_fail(p, StatusCode::kInvalidStride, "query_out_fp8.token_stride");
  // The one cache: rows of L + R; an offset stride of L overlaps them.
  p = fake_mla();
  p.latent_cache.offset_stride = p.rope_cache.offset_stride = 512;
  expect_fail(p, StatusCode::kOverlappingRows, "latent_cache.offset_stride");
  p = fake_mla();
  p.latent_cache.page_stride = p.rope_cache.page_stride = -1;
  expect_fail(p, StatusCode::kInvalidStride, "latent_cache.page_stride");
  // Parts that overlap in rows of the same strides.
  p = fake_mla();
  p.rope_cache.data -= 2;
  expect_fail(p, StatusCode::kAliasedBuffers, "rope_cache", "latent_cache");
  // Split caches whose ranges meet: two outputs that overlap.
  p = fake_mla();
  p.latent_cache = mla_cache_rows(reinterpret_cast<T*>(0x50000000), 16, 512);
  p.rope_cache = mla_cache_rows(reinterpret_cast<T*>(0x50000000) + 1000, 16, 64);
  expect_fail(p, StatusCode::kAliasedBuffers, "rope_cache", "latent_cache");
  p.rope_cache.page_stride = -16;
  expect_fail(p, StatusCode::kInvalidStride, "rope_cache.page_stride");
  // Outputs over inputs: query_out over kv_c, the cache over q, the flag inside the cache.
  p = fake_mla();
  set_query_out(p, false, false);
  p.query_out.data = const_cast<T*>(p.kv_c);
  expect_fail(p, StatusCode::kAliasedBuffers, "query_out", "kv_c");
  p = fake_mla();
  p.latent_cache = mla_concat_latent(reinterpret_cast<T*>(0x10000000), 16, 512, 64);
  p.rope_cache = mla_concat_rope(reinterpret_cast<T*>(0x10000000), 16, 512, 64);
  expect_fail(p, StatusCode::kAliasedBuffers, "latent_cache", "query_pe");
  p = fake_mla();
  p.error_flag = reinterpret_cast<int*>(0x50000000 + 64);
  expect_fail(p, StatusCode::kAliasedBuffers, "error_flag", "latent_cache");
  // q_pe in place with a q_nope beside it in the same rows (a fused q): q_nope is not read, so no aliasing.
  CHECK(validate_mla_append(fake_mla()).ok());
  // Out of place over a fused q: query_out over q_pe is refused.
  p = fake_mla();
  set_query_out(p, false, true);
  p.query_out.data = p.query_pe.data - 128;
  expect_fail(p, StatusCode::kAliasedBuffers, "query_out", "query_pe");
}

TEST_CASE("mla plan: DeepSeek-V3 on the vector path takes the instance of L = 512, R = 64", "[host][mla][plan]") {
  MlaPlan plan{};
  REQUIRE(plan_mla_append(fake_mla(), &plan).ok());
  CHECK(plan.launched);
  CHECK(plan.vec_width == 8);
  CHECK(plan.fixed_dims);
  CHECK(plan.q_lanes == 4);      // R / 16 = 4 units a query row
  CHECK(plan.query_warps == 2);  // 16 query rows, 8 a warp
  CHECK(plan.tile_tokens == 4);  // a row a warp while the tiles are at most kMlaLatentTiles
  CHECK(plan.latent_blocks == 16);
  CHECK(plan.query_blocks == 64 * 2 / 4);
  CHECK(plan.copy_blocks == 0);  // (q_pe in place)
  CHECK(plan.block == kMlaBlockThreads);
  CHECK(plan.grid == 16 + 64 * 2 / 4);
  REQUIRE(plan_mla_append(fake_mla(1, 128), &plan).ok());  // Kimi K2 / DeepSeek-V3 decode at Hq = 128
  CHECK(plan.query_warps == 16);
  CHECK(plan.latent_blocks == 1);
  CHECK(plan.grid == 1 + 4);
  // Tiles grow with T: 2,048 tokens in 512 tiles of 4; 2,049 in 257 of 8; 8,192 in 512 of 16; 2^20 in tiles of 32.
  const int64_t tokens[] = {2048, 2049, 8192, int64_t{1} << 20};
  const int tiles[] = {4, 8, 16, 32};
  for (int i = 0; i < 4; ++i) {
    MlaArgs<T, T> many = mla_args(fake_mla());  // (the geometry alone: fake_mla's buffers hold 64 tokens)
    many.tokens = tokens[i];
    MlaGeometry g{};
    plan_mla_geometry(many, 8, g, plan);
    CHECK(plan.tile_tokens == tiles[i]);
    CHECK(plan.latent_blocks == (tokens[i] + tiles[i] - 1) / tiles[i]);
  }

  const MlaArgs<T, T> a = mla_args(fake_mla());
  CHECK(a.q_rot.data == a.q_pe.data);  // in place
  CHECK(a.q_copy.data == nullptr);
  CHECK(a.q_rot8.data == nullptr);
  CHECK(a.num_slots == 256 * 16);
  MlaGeometry g{};
  plan_mla_geometry(a, 8, g, plan);
  CHECK(g.rot_units == 4);
  CHECK(g.latent_chunks == 64);
  CHECK(g.nope_chunks == 0);
  CHECK(g.div_query_warps.divisor == 2);
  CHECK(g.latent_blocks == 16);

  auto out = fake_mla();
  set_query_out(out, false, true);
  const MlaArgs<T, T> b = mla_args(out);
  CHECK(b.q_rot.data == out.query_out.data + 128);  // RoPE(q_pe) at +N
  CHECK(b.q_copy.data == out.query_out.data);
  plan_mla_geometry(b, 8, g, plan);
  CHECK(g.nope_chunks == 16);
  CHECK(plan.copy_rows == 1);         // 64 tokens x 16 rows: at most kMlaCopyOneRowMax, a row a warp
  CHECK(plan.copy_blocks == 256);     // 4 warps a block
  CHECK(plan.grid == 16 + 32 + 256);  // latent tiles, query rows, copy warps
  auto big = fake_mla(512);
  set_query_out(big, false, true);
  plan_mla_geometry(mla_args(big), 8, g, plan);
  CHECK(plan.copy_rows == kMlaCopyRows);  // 8,192 rows: kMlaCopyRows a warp
  CHECK(plan.copy_blocks == 512 * 16 / kMlaCopyRows / 4);
  auto out8 = fake_mla();
  set_query_out(out8, true, false);
  const MlaArgs<T, T> c = mla_args(out8);
  CHECK(c.q_rot8.data == out8.query_out_fp8.data + 128);
  CHECK(c.q_copy8.data == nullptr);  // not asked
  CHECK(c.q_rot.data == nullptr);

  // fp32: 4 elements a chunk, 8 units a rotated row.
  MlaAppendParams<float, float> f{};
  f.tokens = 2;
  f.query_heads = 16;
  f.nope_dim = 128;
  f.rotary_dim = 64;
  f.latent_dim = 512;
  f.query_pe = {reinterpret_cast<float*>(0x10000000) + 128, 16 * 192, 192};
  f.kv_c = reinterpret_cast<const float*>(0x20000000);
  f.k_pe = f.kv_c + 512;
  f.kv_c_stride = f.k_pe_stride = 576;
  f.positions = reinterpret_cast<const int64_t*>(0x30000000);
  f.cos_sin_cache_f32 = reinterpret_cast<const float*>(0x40000000);
  f.max_position = 10;
  f.page_size = 1;
  f.num_pages = 100;
  f.latent_cache = mla_concat_latent(reinterpret_cast<float*>(0x50000000), 1, 512, 64);
  f.rope_cache = mla_concat_rope(reinterpret_cast<float*>(0x50000000), 1, 512, 64);
  f.slot_mapping = reinterpret_cast<const int64_t*>(0x60000000);
  REQUIRE(plan_mla_append(f, &plan).ok());
  CHECK(plan.vec_width == 4);
  CHECK(plan.fixed_dims);
  CHECK(plan.q_lanes == 8);
  CHECK(plan.query_warps == 4);
}

TEST_CASE("mla plan: other sizes take the generic vector instance, odd ones and misaligned rows the scalar one",
          "[host][mla][plan]") {
  MlaPlan plan{};
  REQUIRE(plan_mla_append(fake_mla(64, 16, 128, 32, 256), &plan).ok());
  CHECK(plan.vec_width == 8);
  CHECK(!plan.fixed_dims);
  CHECK(plan.q_lanes == 2);
  CHECK(plan.query_warps == 1);
  // Each cause of the scalar path, named by mla_scalar_cause.
  struct Case {
    const char* cause;
    MlaAppendParams<T> p;
  };
  auto with = [](auto f) {
    auto p = fake_mla();
    f(p);
    return p;
  };
  const Case cases[] = {
      {"rotary_dim", fake_mla(64, 16, 128, 40, 512)},
      {"latent_dim", fake_mla(64, 16, 128, 64, 509)},
      {"nope_dim", with([](MlaAppendParams<T>& p) {
         p.nope_dim = 100;  // (q_pe at +100 in the fused q: misaligned too, but nope_dim is named first)
         set_query_out(p, false, false);
       })},
      {"query_pe", with([](MlaAppendParams<T>& p) {
         p.query_pe = {p.query_pe.data, 16 * 196, 196};
       })},
      {"query_nope", with([](MlaAppendParams<T>& p) {
         set_query_out(p, false, true);
         p.query_nope.data += 1;
       })},
      {"query_out", with([](MlaAppendParams<T>& p) {
         set_query_out(p, false, false);
         p.query_out.token_stride += 4;
       })},
      {"query_out_fp8", with([](MlaAppendParams<T>& p) {
         set_query_out(p, true, false);
         p.query_out_fp8.data += 4;
       })},
      {"kv_c", with([](MlaAppendParams<T>& p) { p.kv_c_stride = 580; })},
      {"k_pe", with([](MlaAppendParams<T>& p) { p.k_pe += 2; })},
      {"cos_sin_cache_f32", with([](MlaAppendParams<T>& p) { p.cos_sin_cache_f32 += 1; })},
      {"latent_cache", with([](MlaAppendParams<T>& p) {
         p.latent_cache = mla_cache_rows(reinterpret_cast<T*>(0x50000000), 16, 516);
         p.rope_cache = mla_cache_rows(reinterpret_cast<T*>(0x58000000), 16, 64);
       })},
      {"rope_cache", with([](MlaAppendParams<T>& p) {
         p.latent_cache = mla_cache_rows(reinterpret_cast<T*>(0x50000000), 16, 512);
         p.rope_cache = mla_cache_rows(reinterpret_cast<T*>(0x58000000) + 2, 16, 64);
       })},
  };
  for (const Case& c : cases) {
    INFO(c.cause);
    const MlaArgs<T, T> a = mla_args(c.p);
    const char* cause = mla_scalar_cause(a);
    CHECK(std::string(cause ? cause : "") == c.cause);
    REQUIRE(plan_mla_append(c.p, &plan).ok());
    CHECK(plan.vec_width == 1);
    CHECK(!plan.fixed_dims);
  }
  // The scalar path: a lane a unit of one pair (rotate-half: R / 2 units), up to 32 lanes a query row.
  REQUIRE(plan_mla_append(fake_mla(3, 16, 128, 64, 509), &plan).ok());
  CHECK(plan.q_lanes == 32);
  CHECK(plan.query_warps == 16);
  // fp8 caches: chunks of 8 bytes (a chunk of 8 bf16 values), aligned to them.
  auto e4m3 = fake_mla<__nv_fp8_e4m3>();
  REQUIRE(plan_mla_append(e4m3, &plan).ok());
  CHECK(plan.vec_width == 8);
  e4m3.latent_cache = mla_cache_rows(reinterpret_cast<__nv_fp8_e4m3*>(0x50000000), 16, 516);
  e4m3.rope_cache = mla_cache_rows(reinterpret_cast<__nv_fp8_e4m3*>(0x58000000), 16, 64);
  REQUIRE(plan_mla_append(e4m3, &plan).ok());
  CHECK(plan.vec_width == 1);
  // No tokens: nothing launched.
  auto empty = fake_mla(0);
  REQUIRE(plan_mla_append(empty, &plan).ok());
  CHECK(!plan.launched);
  CHECK(plan.grid == 0);
}
