// GPU tests of the forward (docs/spec.md §2) against the float64 reference: both rotary styles, partial
// rotary, per-token tables and the table cache (T and fp32), q in place or out, key_out, BHSD / BSHD,
// padded and misaligned rows, repeated / negative / out-of-range positions; the naive reference too.
#include <kvrope/reference/cpu_forward.hpp>

#include "verify/naive/naive_forward.cuh"
#include "support/gpu_problem.cuh"
#include "verify/check_forward.hpp"

using namespace kvrope;
using namespace kvrope::testing;

namespace {

enum class Tables { kPerToken, kPerTokenShared, kCacheT, kCacheF32 };

struct ForwardConfig {
  Shape shape;
  int64_t query_heads = 0;
  int64_t rotary_dim = 0;
  RotaryStyle style = RotaryStyle::kRotateHalf;
  Tables tables = Tables::kPerToken;
  Layout layout = Layout::kBHSD;
  Positions positions = Positions::kArange;
  bool key_out = true, query_out = false, shared_ids = false, naive = false;
  int64_t pad_row = 0, offset = 0;
  uint64_t seed = 1;

  std::string describe() const {
    std::ostringstream os;
    os << "B=" << shape.batch << " H=" << shape.heads << " S=" << shape.seq_len << " S_max=" << shape.cache_len
       << " D=" << shape.head_dim << " Hq=" << query_heads << " R=" << rotary_dim
       << (style == RotaryStyle::kInterleaved ? " interleaved" : " rotate-half") << " tables=" << int(tables) << " "
       << name(layout) << " positions=" << name(positions) << " key_out=" << key_out << " query_out=" << query_out
       << " pad=" << pad_row << " offset=" << offset << (naive ? " naive" : "") << " seed=" << seed;
    return os.str();
  }
};

// A [B, H, L, D] tensor in `layout` with `pad` elements after each row, `offset` elements in.
template <typename T>
struct Rows {
  DeviceBuffer<T> buf;
  HeadRows<T> view;
  std::vector<T> before, host;  // host copies taken before and after the call
  Rows(int64_t B, int64_t H, int64_t L, int64_t D, Layout layout, int64_t pad, int64_t offset)
      : buf(static_cast<size_t>(std::max<int64_t>(B * H * L * (D + pad) + offset, 1))) {
    const int64_t row = D + pad;
    view = layout == Layout::kBHSD ? HeadRows<T>{buf.get() + offset, H * L * row, L * row, row}
                                   : HeadRows<T>{buf.get() + offset, L * H * row, row, H * row};
  }
  void snapshot_before() { before = buf.to_host(); }
  void snapshot() { host = buf.to_host(); }
  HeadRows<T> before_view() {
    return {before.data() + (view.data - buf.get()), view.batch_stride, view.head_stride, view.seq_stride};
  }
  HeadRows<const T> host_view() const {
    return {host.data() + (view.data - buf.get()), view.batch_stride, view.head_stride, view.seq_stride};
  }
};

template <typename T, typename Pos>
void run_forward(const ForwardConfig& c) {
  INFO(c.describe());
  const Shape& s = c.shape;
  const int64_t R = effective_rotary_dim(c.rotary_dim, s.head_dim);
  std::mt19937_64 rng(c.seed);
  Rows<T> k(s.batch, s.heads, s.seq_len, s.head_dim, c.layout, c.pad_row, c.offset);
  Rows<T> v(s.batch, s.heads, s.seq_len, s.head_dim, c.layout, c.pad_row, c.offset);
  Rows<T> kc(s.batch, s.heads, s.cache_len, s.head_dim, c.layout, c.pad_row, c.offset);
  Rows<T> vc(s.batch, s.heads, s.cache_len, s.head_dim, c.layout, c.pad_row, c.offset);
  Rows<T> ko(s.batch, s.heads, s.seq_len, s.head_dim, c.layout, c.pad_row, c.offset);
  Rows<T> q(s.batch, c.query_heads, s.seq_len, s.head_dim, c.layout, c.pad_row, c.offset);
  Rows<T> qo(s.batch, c.query_heads, s.seq_len, s.head_dim, c.layout, c.pad_row, c.offset);
  const bool per_token = c.tables == Tables::kPerToken || c.tables == Tables::kPerTokenShared;
  const int64_t table_batch = c.tables == Tables::kPerTokenShared ? 1 : s.batch;
  DeviceBuffer<T> cos(per_token ? table_batch * s.seq_len * R : 0), sin(per_token ? table_batch * s.seq_len * R : 0);
  const int64_t max_position = s.seq_len + 5;
  DeviceBuffer<T> cache_t(c.tables == Tables::kCacheT ? max_position * R : 0);
  DeviceBuffer<float> cache_f32(c.tables == Tables::kCacheF32 ? max_position * R : 0);
  const int64_t id_rows = per_token ? 0 : (c.shared_ids ? 1 : s.batch);
  DeviceBuffer<Pos> ids(id_rows * s.seq_len), positions(s.seq_len);
  DeviceBuffer<int> flag(1);
  uint64_t seed = c.seed * 1000;
  for (DeviceBuffer<T>* b : {&k.buf, &v.buf, &kc.buf, &vc.buf, &q.buf, &cos, &sin, &cache_t}) fill_random(*b, ++seed);
  fill_random(cache_f32, ++seed);
  poison(ko.buf);
  poison(qo.buf);
  const std::vector<Pos> host_pos = make_positions<Pos>(c.positions, s.seq_len, s.cache_len, rng);
  std::vector<Pos> host_ids(static_cast<size_t>(id_rows * s.seq_len));
  for (auto& id : host_ids) id = static_cast<Pos>(rng() % max_position);
  if (c.positions == Positions::kOutOfRange && !host_ids.empty()) host_ids[host_ids.size() / 2] = max_position;
  if (s.seq_len)
    KVROPE_CUDA_REQUIRE(cudaMemcpy(positions.get(), host_pos.data(), s.seq_len * sizeof(Pos), cudaMemcpyHostToDevice));
  if (!host_ids.empty())
    KVROPE_CUDA_REQUIRE(cudaMemcpy(ids.get(), host_ids.data(), host_ids.size() * sizeof(Pos), cudaMemcpyHostToDevice));
  KVROPE_CUDA_REQUIRE(cudaMemset(flag.get(), 0, sizeof(int)));

  ForwardParams<T, Pos> p;
  p.batch = s.batch;
  p.heads = s.heads;
  p.seq_len = s.seq_len;
  p.cache_len = s.cache_len;
  p.head_dim = s.head_dim;
  p.rotary_dim = c.rotary_dim;
  p.style = c.style;
  p.key_states = k.view;
  p.value_states = v.view;
  p.key_cache = kc.view;
  p.value_cache = vc.view;
  p.cache_position = positions.get();
  if (c.key_out) p.key_out = ko.view;
  p.query_heads = c.query_heads;
  if (c.query_heads) {
    p.query = q.view;
    if (c.query_out) p.query_out = qo.view;
  }
  if (per_token) {
    p.cos = TokenRows<const T>{cos.get(), c.tables == Tables::kPerTokenShared ? 0 : s.seq_len * R, R};
    p.sin = TokenRows<const T>{sin.get(), c.tables == Tables::kPerTokenShared ? 0 : s.seq_len * R, R};
  } else {
    p.cos_sin_cache = cache_t.size() ? cache_t.get() : nullptr;
    p.cos_sin_cache_f32 = cache_f32.size() ? cache_f32.get() : nullptr;
    p.max_position = max_position;
    p.position_ids = ids.get();
    p.position_ids_batch_stride = c.shared_ids ? 0 : s.seq_len;
  }
  p.error_flag = flag.get();

  // The inputs as the call finds them, on the host.
  for (Rows<T>* r : {&k, &v, &kc, &vc, &ko, &q, &qo}) r->snapshot_before();
  const std::vector<T> h_cos = cos.to_host(), h_sin = sin.to_host(), h_cache = cache_t.to_host();
  const std::vector<float> h_cache_f32 = cache_f32.to_host();
  ForwardParams<T, Pos> in = p;
  in.key_states = k.before_view();
  in.value_states = v.before_view();
  in.key_cache = kc.before_view();
  in.value_cache = vc.before_view();
  in.cache_position = host_pos.data();
  if (c.key_out) in.key_out = ko.before_view();
  if (c.query_heads) {
    in.query = q.before_view();
    if (c.query_out) in.query_out = qo.before_view();
  }
  if (per_token) {
    in.cos.data = h_cos.data();
    in.sin.data = h_sin.data();
  } else {
    in.cos_sin_cache = p.cos_sin_cache ? h_cache.data() : nullptr;
    in.cos_sin_cache_f32 = p.cos_sin_cache_f32 ? h_cache_f32.data() : nullptr;
    in.position_ids = host_ids.data();
  }
  in.error_flag = nullptr;

  if (c.naive) {
    DeviceBuffer<char> ws(reference::naive_forward_workspace_bytes(p));
    const Status st = reference::naive_forward(p, ws.get(), ws.size(), nullptr);
    INFO("status " << to_string(st.code) << " " << (st.field ? st.field : "-"));
    REQUIRE(st.ok());
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  } else {
    const Status st = Launchers<T, Pos>::forward(p, nullptr);
    INFO("status " << to_string(st.code) << " " << (st.field ? st.field : "-"));
    REQUIRE(st.ok());
  }
  KVROPE_CUDA_REQUIRE(cudaGetLastError());
  KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  for (Rows<T>* r : {&kc, &vc, &ko, &q, &qo}) r->snapshot();
  verify::ForwardOutputs<T> out;
  out.key_cache = kc.host_view();
  out.value_cache = vc.host_view();
  if (c.key_out) out.key_out = ko.host_view();
  if (c.query_heads) out.query = c.query_out ? qo.host_view() : q.host_view();
  const verify::CheckResult result = verify::check_forward(in, out);
  INFO(result.first_mismatch);
  CHECK(result.ok());
  CHECK(result.checked > 0);
  CHECK(flag.to_host()[0] == reference::expected_error_flag(in));
}

}  // namespace

TEMPLATE_TEST_CASE("forward matches the float64 reference: styles, partial rotary, table sources, q, positions",
                   "[gpu][forward]", __nv_bfloat16, __half, float) {
  const Shape shapes[] = {{2, 3, 7, 24, 64}, {1, 8, 33, 40, 128}, {3, 2, 5, 9, 80}, {2, 4, 1, 16, 256}};
  uint64_t seed = 1;
  for (const Shape& shape : shapes)
    for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
      for (const int64_t r : {int64_t{0}, shape.head_dim / 2, int64_t{2}})
        for (const Tables tables : {Tables::kPerToken, Tables::kPerTokenShared, Tables::kCacheT, Tables::kCacheF32}) {
          ForwardConfig c;
          c.shape = shape;
          c.style = style;
          c.rotary_dim = r;
          c.tables = tables;
          c.seed = seed++;
          const Positions patterns[] = {Positions::kArange,     Positions::kDuplicates,  Positions::kNegative,
                                        Positions::kOutOfRange, Positions::kPermutation, Positions::kWrap};
          c.positions = patterns[c.seed % 6];
          c.layout = c.seed % 2 ? Layout::kBSHD : Layout::kBHSD;
          c.query_heads = c.seed % 3 == 0 ? 0 : 2 * shape.heads;
          c.query_out = c.seed % 4 == 1;
          c.key_out = c.seed % 5 != 2;
          c.shared_ids = c.seed % 2 == 0;
          c.pad_row = c.seed % 7 == 3 ? 8 : 0;
          run_forward<TestType, int64_t>(c);
          c.offset = 1;  // misaligned: the scalar path
          c.seed += 1000;
          run_forward<TestType, int32_t>(c);
        }
}

TEST_CASE("forward on leaderboard shapes and decode steps (bf16, H = 8, D = 128, key_out)", "[gpu][forward]") {
  const Shape shapes[] = {{2, 8, 211, 1024, 128}, {1, 8, 1, 256, 128},    {32, 8, 1, 2048, 128},
                          {1, 8, 293, 2048, 128}, {256, 8, 1, 4096, 128}, {4, 8, 1, 512, 128}};
  for (const Shape& shape : shapes)
    for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved}) {
      ForwardConfig c;
      c.shape = shape;
      c.style = style;
      c.seed = 500 + shape.batch + shape.seq_len;
      run_forward<__nv_bfloat16, int64_t>(c);
      c.rotary_dim = 64;
      c.positions = Positions::kDuplicates;
      run_forward<__nv_bfloat16, int64_t>(c);
      c.positions = Positions::kWrap;
      run_forward<__nv_bfloat16, int64_t>(c);
    }
}

TEST_CASE("the naive forward reference matches the float64 reference too", "[gpu][forward]") {
  uint64_t seed = 900;
  for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
    for (const Tables tables : {Tables::kPerToken, Tables::kCacheF32}) {
      ForwardConfig c;
      c.shape = {2, 4, 9, 16, 64};
      c.style = style;
      c.tables = tables;
      c.query_heads = 8;
      c.positions = Positions::kDuplicates;
      c.naive = true;
      c.seed = seed++;
      run_forward<__nv_bfloat16, int64_t>(c);
    }
}

TEST_CASE("forward: aligned rows take 16-byte accesses, misaligned ones the scalar path", "[gpu][forward]") {
  DeviceBuffer<__nv_bfloat16> buf(8192);
  DeviceBuffer<int64_t> pos(4);
  ForwardParams<__nv_bfloat16> p;
  p.batch = 1;
  p.heads = 2;
  p.seq_len = 4;
  p.cache_len = 4;
  p.head_dim = 64;
  p.key_states = bhsd<const __nv_bfloat16>(buf.get(), 2, 4, 64);
  p.value_states = bhsd<const __nv_bfloat16>(buf.get() + 1024, 2, 4, 64);
  p.key_cache = bhsd(buf.get() + 2048, 2, 4, 64);
  p.value_cache = bhsd(buf.get() + 3072, 2, 4, 64);
  p.cos = bsd<const __nv_bfloat16>(buf.get() + 4096, 4, 64);
  p.sin = bsd<const __nv_bfloat16>(buf.get() + 5120, 4, 64);
  p.cache_position = pos.get();
  ForwardPlan plan;
  REQUIRE((Launchers<__nv_bfloat16, int64_t>::plan(p, &plan).ok()));
  CHECK(plan.vec_width == 8);
  p.key_cache.data += 1;
  REQUIRE((Launchers<__nv_bfloat16, int64_t>::plan(p, &plan).ok()));
  CHECK(plan.vec_width == 1);
  p.key_cache.data -= 1;
  p.rotary_dim = 8;  // R / 2 = 4 elements: not a whole 16-byte vector
  REQUIRE((Launchers<__nv_bfloat16, int64_t>::plan(p, &plan).ok()));
  CHECK(plan.vec_width == 1);
}

// Random configurations, as the backward's random test draws them: KVROPE_RANDOM_CONFIGS of them
// (default 300), seeded by KVROPE_RANDOM_SEED (default 20261201); a failure prints its configuration.
TEST_CASE("forward: random configurations match the float64 reference", "[gpu][forward][random]") {
  const RandomRun run = random_run("forward", 20261201);
  std::mt19937_64 rng(run.seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t compiled[] = {64, 80, 96, 128, 256};
  const Positions patterns[] = {Positions::kArange,   Positions::kPermutation, Positions::kSparse,
                                Positions::kNegative, Positions::kDuplicates,  Positions::kOutOfRange,
                                Positions::kWrap};
  for (int64_t i = 0; i < run.configs; ++i) {
    ForwardConfig c;
    const int64_t D = uniform(0, 2) < 2 ? compiled[uniform(0, 4)] : 2 * uniform(1, 160);
    const int64_t S = uniform(0, 4) == 0 ? 1 : uniform(1, uniform(0, 3) == 0 ? 1500 : 200);
    c.shape = {uniform(1, 4), uniform(1, 16), S, S + uniform(0, 64), D};
    const int64_t r = uniform(0, 2);
    c.rotary_dim = r == 0 ? 0 : r == 1 ? D / 2 - (D / 2) % 2 : 2 * uniform(1, D / 2);
    c.style = uniform(0, 1) ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
    c.tables = static_cast<Tables>(uniform(0, 3));
    c.layout = uniform(0, 1) ? Layout::kBSHD : Layout::kBHSD;
    c.positions = patterns[uniform(0, 6)];
    c.query_heads = uniform(0, 2) == 0 ? 0 : uniform(1, 16);
    c.query_out = uniform(0, 1) == 1;
    c.key_out = uniform(0, 3) != 0;
    c.shared_ids = uniform(0, 1) == 1;
    c.pad_row = uniform(0, 4) == 0 ? 8 : 0;
    c.offset = uniform(0, 4) == 0 ? 1 : 0;
    c.seed = run.config_seed(i);
    INFO("run seed " << run.seed << ", configuration " << i << " of " << run.configs);
    const int dtype = static_cast<int>(uniform(0, 2));
    const bool pos64 = uniform(0, 1) == 1;
    if (c.rotary_dim == 0 && r == 1) c.rotary_dim = 2;
    switch (dtype * 2 + pos64) {
      case 0: run_forward<__nv_bfloat16, int32_t>(c); break;
      case 1: run_forward<__nv_bfloat16, int64_t>(c); break;
      case 2: run_forward<__half, int32_t>(c); break;
      case 3: run_forward<__half, int64_t>(c); break;
      case 4: run_forward<float, int32_t>(c); break;
      default: run_forward<float, int64_t>(c); break;
    }
  }
}
