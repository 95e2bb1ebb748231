// GPU tests of the MLA append (docs/spec.md §6.6, kvrope/mla_append.cuh) against the float64 reference
// (kvrope/reference/cpu_mla.hpp): bf16, fp16 and fp32; caches in T, e4m3 and e5m2 (with and without kv_scale);
// vLLM's one cache and FlashInfer's two; q in place, out in T and out in fp8, with and without q_nope; both
// styles; L = 512, R = 64 (the compiled instance), generic sizes on the vector path (L = 256, R = 32) and odd
// ones on the scalar path (L = 511, R = 40), misaligned views; Hq = 16 and 128, no q; a fused q and separate
// q_pe, q_nope; padding (-1), repeated and out-of-range slots, out-of-range positions; int32 and int64 positions;
// fp32 and T tables; decode, prefill, an empty call; PDL and graph capture; random configurations of all of these
// (KVROPE_RANDOM_CONFIGS, KVROPE_RANDOM_SEED). Every output is poisoned (0xFF bytes) before each launch; every
// element of every output buffer is checked: a copy bit for bit (fp8: the reference's code), a rotated value
// within the tolerance of §1.7 (fp8: the code of a value in T within it), everything the call must not write
// unchanged; then the error flag (tests/support/mla_case.hpp).
#include <kvrope/mla_append.cuh>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "support/cuda_require.hpp"
#include "support/gpu_problem.cuh"
#include "support/mla_case.hpp"

using namespace kvrope;
using namespace kvrope::testing;

namespace {

using QMode = MlaQMode;
using Slots = MlaSlots;
using Launch = MlaLaunch;

template <typename U>
DeviceBuffer<U> sized(int64_t n) {
  return DeviceBuffer<U>(static_cast<size_t>(n));
}

//! A case's device buffers (inputs random normal, outputs poisoned before each launch), its params, the launch
//! and the check.
template <typename T, typename C, typename Pos>
struct MlaProblem {
  MlaCase<Pos> k;
  DeviceBuffer<T> q, q_nope, q_out, kv, table;
  DeviceBuffer<float> table_f32, q_scale, kv_scale;
  DeviceBuffer<__nv_fp8_e4m3> q_out8;
  DeviceBuffer<C> cache, ckv, kpe;
  DeviceBuffer<Pos> pos;
  DeviceBuffer<int64_t> slots;
  DeviceBuffer<int> flag;
  MlaAppendParams<T, C, Pos> params;

  explicit MlaProblem(const MlaConfig& c) : k(c, kIsFp8<C>) {
    q = sized<T>(k.q_size);
    q_nope = sized<T>(k.q_nope_size);
    if (c.q_fp8())
      q_out8 = sized<__nv_fp8_e4m3>(k.out_size);
    else
      q_out = sized<T>(k.out_size);
    kv = sized<T>(k.kv_size);
    if (c.table_f32)
      table_f32 = sized<float>(k.table_size);
    else
      table = sized<T>(k.table_size);
    cache = sized<C>(k.cache_size);
    ckv = sized<C>(k.ckv_size);
    kpe = sized<C>(k.kpe_size);
    if (k.has_kv_scale) {
      kv_scale = sized<float>(1);
      KVROPE_CUDA_REQUIRE(cudaMemcpy(kv_scale.get(), &k.kv_scale, 4, cudaMemcpyHostToDevice));
    }
    if (k.has_q_scale) {
      q_scale = sized<float>(1);
      KVROPE_CUDA_REQUIRE(cudaMemcpy(q_scale.get(), &k.q_scale, 4, cudaMemcpyHostToDevice));
    }
    pos = sized<Pos>(c.tokens);
    slots = sized<int64_t>(c.tokens);
    upload_slots();
    flag = sized<int>(1);
    uint64_t seed = c.seed * 1000;
    for (DeviceBuffer<T>* b : {&q, &q_nope, &kv, &table}) fill_random(*b, ++seed);
    fill_random(table_f32, ++seed);
    params = make_params();
  }

  //! Copies the case's positions and slots (after a test changed them) to the device.
  void upload_slots() {
    const size_t n = k.slots.size();
    if (n == 0) return;
    KVROPE_CUDA_REQUIRE(cudaMemcpy(pos.get(), k.pos.data(), n * sizeof(Pos), cudaMemcpyHostToDevice));
    KVROPE_CUDA_REQUIRE(cudaMemcpy(slots.get(), k.slots.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
  }

  MlaAppendParams<T, C, Pos> make_params() const {
    const MlaConfig& c = k.cfg;
    const int64_t N = c.nope_dim, L = c.latent_dim, o = c.offset;
    MlaAppendParams<T, C, Pos> p{};
    p.tokens = c.tokens;
    p.query_heads = c.query_heads;
    p.nope_dim = N;
    p.rotary_dim = c.rotary_dim;
    p.latent_dim = L;
    p.style = c.style;
    if (q.get()) {
      p.query_pe = {q.get() + o + (c.fused_q ? N : 0), k.q_tok, k.q_head};
      if (c.fused_q)
        p.query_nope = {q.get() + o, k.q_tok, k.q_head};
      else if (q_nope.get())
        p.query_nope = {q_nope.get() + o, k.nope_tok, k.nope_head};
    }
    if (q_out.get()) p.query_out = {q_out.get() + o, k.out_tok, k.out_head};
    if (q_out8.get()) p.query_out_fp8 = {q_out8.get() + o, k.out_tok, k.out_head};
    p.write_query_nope = c.q_nope();
    p.query_scale = q_scale.get();
    if (kv.get()) {
      p.kv_c = kv.get() + o;
      p.k_pe = kv.get() + o + L;
    }
    p.kv_c_stride = p.k_pe_stride = k.kv_row;
    p.positions = pos.get();
    p.cos_sin_cache = table.get() ? table.get() + o : nullptr;
    p.cos_sin_cache_f32 = table_f32.get() ? table_f32.get() + o : nullptr;
    p.max_position = k.max_position;
    if (c.split) {
      p.latent_cache = {ckv.get() + o, k.lat_page, k.lat_off};
      p.rope_cache = {kpe.get() + o, k.rope_page, k.rope_off};
    } else {
      p.latent_cache = {cache.get() + o, k.lat_page, k.lat_off};
      p.rope_cache = {cache.get() + o + L, k.rope_page, k.rope_off};
    }
    p.page_size = c.page_size;
    p.num_pages = k.num_pages;
    p.slot_mapping = slots.get();
    p.kv_scale = kv_scale.get();
    p.error_flag = flag.get();
    p.enable_pdl = c.launch == Launch::kPdl;
    return p;
  }

  //! 0xFF bytes (NaN in T and in both fp8 formats) in every output buffer; the flag zeroed.
  void poison_outputs() {
    poison(q_out);
    poison(q_out8);
    poison(cache);
    poison(ckv);
    poison(kpe);
    KVROPE_CUDA_REQUIRE(cudaMemset(flag.get(), 0, sizeof(int)));
  }

  MlaSnapshot<T, C> snapshot() const {
    MlaSnapshot<T, C> s;
    s.q = q.to_host(), s.q_nope = q_nope.to_host(), s.q_out = q_out.to_host(), s.kv = kv.to_host();
    s.table = table.to_host(), s.table_f32 = table_f32.to_host(), s.q_out8 = q_out8.to_host();
    s.cache = cache.to_host(), s.ckv = ckv.to_host(), s.kpe = kpe.to_host();
    return s;
  }

  Status launch(cudaStream_t stream = nullptr) const { return mla_append(params, stream); }

  //! Launches as the case asks (a graph: captured, instantiated, launched once) and waits.
  void launch_and_wait() {
    Status st;
    if (k.cfg.launch == Launch::kGraph) {
      cudaStream_t stream = nullptr;
      KVROPE_CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph = nullptr;
      KVROPE_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      st = launch(stream);
      KVROPE_CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec = nullptr;
      KVROPE_CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
      KVROPE_CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
      KVROPE_CUDA_REQUIRE(cudaStreamSynchronize(stream));
      KVROPE_CUDA_REQUIRE(cudaGraphExecDestroy(exec));
      KVROPE_CUDA_REQUIRE(cudaGraphDestroy(graph));
      KVROPE_CUDA_REQUIRE(cudaStreamDestroy(stream));
    } else {
      st = launch();
    }
    INFO("status " << to_string(st.code) << " field " << (st.field ? st.field : "-"));
    REQUIRE(st.ok());
    KVROPE_CUDA_REQUIRE(cudaGetLastError());
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  }

  //! Poisons the outputs, snapshots the inputs, launches once and checks every output element.
  void run_and_check() {
    INFO(k.cfg.describe());
    poison_outputs();
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    const MlaSnapshot<T, C> before = snapshot();
    launch_and_wait();
    const MlaSnapshot<T, C> after = snapshot();
    const MlaCheckResult r = check_mla(k, before, after, flag.to_host()[0]);
    INFO("checked " << r.checked << ", mismatches " << r.bad << ": " << r.first);
    CHECK(r.ok());
  }

  MlaPlan plan() const {
    MlaPlan p{};
    REQUIRE(plan_mla_append(params, &p).ok());
    return p;
  }
};

template <typename T, typename C>
void run_case(const MlaConfig& c) {
  if (c.pos64) {
    MlaProblem<T, C, int64_t> p(c);
    p.run_and_check();
  } else {
    MlaProblem<T, C, int32_t> p(c);
    p.run_and_check();
  }
}

}  // namespace

TEMPLATE_TEST_CASE("mla append matches the float64 reference: shapes, layouts, q outputs, styles, slots", "[gpu][mla]",
                   __nv_bfloat16, __half, float) {
  using T = TestType;
  uint64_t seed = 1;
  for (const MlaShape& shape : kShapes)
    for (const bool split : {false, true})
      for (const QMode qmode : kQModes)
        for (const RotaryStyle style : {RotaryStyle::kInterleaved, RotaryStyle::kRotateHalf}) {
          MlaConfig c;
          c.seed = seed++;
          set_shape(c, shape);
          c.split = split;
          c.qmode = qmode;
          c.style = style;
          c.tokens = 5 + static_cast<int64_t>(c.seed % 37);
          c.query_heads = c.seed % 4 == 0 ? 128 : 16;
          c.fused_q = c.seed % 3 != 2;
          c.table_f32 = c.seed % 3 != 1;
          c.pos64 = c.seed % 2 == 0;
          c.page_size = c.seed % 3 == 0 ? 1 : c.seed % 3 == 1 ? 16 : 64;
          c.slots = kSlots[c.seed % 4];
          c.pad = c.seed % 5 == 0 ? 0 : 16;
          run_case<T, T>(c);
        }
}

TEST_CASE("mla append: latent tiles of 4 to 32 tokens, slots repeated within and across tiles", "[gpu][mla][slots]") {
  // Token counts around a tile's 4 tokens and far past them, so that a slot's last writer is in the same tile, a
  // later one, or many tiles later, and past 2,048 and 8,192 tokens, where the tiles grow to 8 and 32 tokens
  // (detail/mla/plan.cuh); every slot pattern, decode (T = 1, 2) included.
  uint64_t seed = 700;
  for (const int64_t tokens : {1, 2, 3, 4, 5, 31, 33, 65, 300, 1000, 3000, 9000})
    for (const MlaSlots slots : kSlots) {
      MlaConfig c;
      c.seed = seed++;
      set_shape(c, kShapes[0]);
      c.tokens = tokens;
      c.slots = slots;
      c.split = c.seed % 2 == 0;
      c.page_size = c.seed % 3 == 0 ? 1 : 16;
      run_case<__nv_bfloat16, __nv_bfloat16>(c);
      run_case<__nv_bfloat16, __nv_fp8_e4m3>(c);
    }
}

TEMPLATE_TEST_CASE("mla append into fp8 caches: e4m3 and e5m2, kv_scale or none, saturation, every q output",
                   "[gpu][mla][fp8]", __nv_bfloat16, __half, float) {
  using T = TestType;
  uint64_t seed = 500;
  for (const MlaShape& shape : kShapes)
    for (const bool split : {false, true})
      for (const QMode qmode : kQModes) {
        MlaConfig c;
        c.seed = seed++;
        set_shape(c, shape);
        c.split = split;
        c.qmode = qmode;
        c.style = c.seed % 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
        c.tokens = 3 + static_cast<int64_t>(c.seed % 29);
        c.query_heads = c.seed % 3 == 0 ? 128 : 16;
        c.fused_q = c.seed % 2 == 0;
        c.table_f32 = c.seed % 3 != 2;
        c.pos64 = c.seed % 2 == 1;
        c.slots = kSlots[c.seed % 4];
        c.scales = c.seed % 4 != 3;
        if (c.seed % 2)
          run_case<T, __nv_fp8_e4m3>(c);
        else
          run_case<T, __nv_fp8_e5m2>(c);
      }
  // Scales small enough that many values saturate (e4m3 beyond 448, e5m2 beyond 57344), and large ones that push
  // values into the subnormals.
  for (const float magnitude : {0.004f, 1.0e-5f, 100.0f}) {
    MlaConfig c;
    c.seed = seed++;
    c.qmode = QMode::kOutFp8Nope;
    c.scale_magnitude = magnitude;
    run_case<T, __nv_fp8_e4m3>(c);
    c.split = true;
    run_case<T, __nv_fp8_e5m2>(c);
  }
}

TEST_CASE("mla append: the instance each shape takes", "[gpu][mla][plan]") {
  using T = __nv_bfloat16;
  struct Want {
    MlaShape shape;
    int64_t offset;
    int vec_width;
    bool fixed;
  };
  const Want wants[] = {{kShapes[0], 0, 8, true},
                        {kShapes[1], 0, 8, false},
                        {kShapes[2], 0, 1, false},
                        {kShapes[3], 0, 1, false},
                        {kShapes[0], 1, 1, false}};
  for (const Want& w : wants) {
    for (const bool split : {false, true})
      for (const QMode qmode : kQModes) {
        MlaConfig c;
        set_shape(c, w.shape);
        c.offset = w.offset;
        c.split = split;
        c.qmode = qmode;
        MlaProblem<T, __nv_fp8_e4m3, int64_t> p(c);
        INFO(c.describe());
        const MlaPlan plan = p.plan();
        CHECK(plan.launched);
        CHECK(plan.vec_width == w.vec_width);
        CHECK(plan.fixed_dims == w.fixed);
      }
  }
}

TEST_CASE("mla append: misaligned views take the scalar path with the same results", "[gpu][mla]") {
  uint64_t seed = 900;
  for (const MlaShape& shape : {kShapes[0], kShapes[1]})
    for (const bool split : {false, true})
      for (const QMode qmode : kQModes) {
        MlaConfig c;
        c.seed = seed++;
        set_shape(c, shape);
        c.offset = 1;
        c.pad = c.seed % 2 ? 1 : 3;
        c.split = split;
        c.qmode = qmode;
        c.style = c.seed % 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
        c.slots = kSlots[c.seed % 4];
        c.fused_q = c.seed % 3 != 0;
        run_case<__nv_bfloat16, __nv_bfloat16>(c);
        run_case<float, __nv_fp8_e4m3>(c);
      }
}

TEST_CASE("mla append: bad slots skip the cache, bad positions write nothing, both flagged", "[gpu][mla][slots]") {
  // Token 0: slot -1 (no cache row, q written); 1: slot past the end (flagged, q written); 2: position past
  // the table (flagged, nothing written); 3: negative position; 4 and 5: one slot, the later one's position bad
  // (so 4 writes it); 6: a valid token.
  using T = __nv_bfloat16;
  for (const QMode qmode : {QMode::kInPlace, QMode::kOutNope, QMode::kOutFp8}) {
    MlaConfig c;
    c.tokens = 7;
    c.qmode = qmode;
    MlaProblem<T, T, int64_t> p(c);
    const int64_t S = p.k.num_slots, M = p.k.max_position;
    p.k.slots = {-1, S + 3, 5, 6, 9, 9, 11};
    p.k.pos = {1, 2, M, -7, 3, M + 5, 0};
    p.upload_slots();
    p.run_and_check();
    CHECK(p.flag.to_host()[0] == (kErrorPositionIdOutOfRange | kErrorSlotOutOfRange));
    CHECK(read_error_flag(p.flag.get()).code == StatusCode::kPositionIdOutOfRange);
  }
  // Only a bad slot: the slot's bit alone.
  MlaConfig c;
  c.tokens = 3;
  MlaProblem<T, T, int32_t> p(c);
  p.k.slots = {0, p.k.num_slots, 2};
  p.upload_slots();
  p.run_and_check();
  CHECK(p.flag.to_host()[0] == kErrorSlotOutOfRange);
}

TEST_CASE("mla append: decode and prefill sizes, Hq = 0 and 128, an empty call", "[gpu][mla]") {
  uint64_t seed = 1300;
  for (const int64_t tokens : {int64_t{1}, int64_t{4}, int64_t{700}, int64_t{3000}})
    for (const int64_t heads : {int64_t{0}, int64_t{16}, int64_t{128}}) {
      if (tokens >= 3000 && heads == 128) continue;  // (the reference's time)
      MlaConfig c;
      c.seed = seed++;
      c.tokens = tokens;
      c.query_heads = heads;
      c.qmode = kQModes[c.seed % 5];
      c.split = c.seed % 2 == 1;
      c.slots = kSlots[c.seed % 4];
      c.page_size = 64;
      run_case<__nv_bfloat16, __nv_bfloat16>(c);
      run_case<__half, __nv_fp8_e4m3>(c);
    }
  MlaConfig empty;
  empty.tokens = 0;
  MlaProblem<__nv_bfloat16, __nv_bfloat16, int64_t> p(empty);
  CHECK(!p.plan().launched);
  p.run_and_check();
}

TEST_CASE("mla append: programmatic dependent launch and graph capture give the same results", "[gpu][mla][graph]") {
  uint64_t seed = 1400;
  for (const Launch launch : {Launch::kPdl, Launch::kGraph})
    for (const MlaShape& shape : {kShapes[0], kShapes[2]}) {
      MlaConfig c;
      c.seed = seed++;
      set_shape(c, shape);
      c.launch = launch;
      c.qmode = QMode::kOutNope;
      c.slots = Slots::kRepeats;
      c.tokens = 300;
      run_case<__nv_bfloat16, __nv_bfloat16>(c);
      c.qmode = QMode::kOutFp8Nope;
      run_case<__half, __nv_fp8_e5m2>(c);
    }
}

namespace {

// One random MLA configuration; `dtype` picks T (0 bf16, 1 fp16, 2 fp32), `cache` C (0 T, 1 e4m3, 2 e5m2).
struct MlaDraw {
  MlaConfig cfg;
  int dtype, cache;
};

MlaDraw draw_mla(std::mt19937_64& rng, uint64_t seed) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  MlaDraw d{};
  MlaConfig& c = d.cfg;
  d.dtype = static_cast<int>(uniform(0, 2));
  d.cache = static_cast<int>(uniform(0, 2));
  c.pos64 = uniform(0, 1) == 1;
  // Mostly the compiled L = 512, R = 64 (N: DeepSeek's 128, none, the absorbed 512, or any, which may send q's
  // outputs to the scalar path); kShapes' others; whole chunks of 16 bytes (the vector path for any sizes); any
  // L, even R, any N (mostly the scalar path). validate asks only N >= 0, R even and positive, L positive.
  const int64_t shape = uniform(0, 9);
  if (shape < 6) {
    set_shape(c, kShapes[0]);
    const int64_t n = uniform(0, 7);
    c.nope_dim = n == 0 ? 0 : n == 1 ? 512 : n == 2 ? uniform(1, 256) : 128;
  } else if (shape == 6) {
    set_shape(c, kShapes[uniform(1, 3)]);
  } else if (shape < 9) {
    c.latent_dim = 16 * uniform(1, 64);
    c.rotary_dim = 16 * uniform(1, 8);
    c.nope_dim = 16 * uniform(0, 16);
  } else {
    c.latent_dim = uniform(1, 1024);
    c.rotary_dim = 2 * uniform(1, 80);
    c.nope_dim = uniform(0, 256);
  }
  c.style = uniform(0, 1) ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
  c.split = uniform(0, 1) == 1;
  c.qmode = kQModes[uniform(0, 4)];
  c.fused_q = uniform(0, 2) != 0;
  c.table_f32 = uniform(0, 1) == 1;
  // Decode, a few dozen tokens, prefill, now and then an empty call; Hq mostly 16 or 128, sometimes none.
  const int64_t size = uniform(0, 9);
  c.tokens = size == 0   ? 1
             : size == 1 ? uniform(200, 1500)
             : size == 2 ? (uniform(0, 3) == 0 ? 0 : uniform(65, 200))
                         : uniform(1, 64);
  const int64_t heads = uniform(0, 15);
  c.query_heads = heads == 0 ? 0 : heads < 7 ? 16 : heads < 12 ? 128 : uniform(1, 128);
  // Keep each configuration to a few million elements (q's rows, the projection) so that thousands run in
  // minutes: fewer tokens, or fewer heads.
  constexpr int64_t kMost = int64_t{1} << 22;
  const int64_t W = c.nope_dim + c.rotary_dim;
  const bool fewer_tokens = uniform(0, 1) == 1;
  while (c.tokens * c.query_heads * W > kMost) {
    if (fewer_tokens || c.query_heads == 1)
      c.tokens = (c.tokens + 1) / 2;
    else
      c.query_heads /= 2;
  }
  while (c.tokens * (c.latent_dim + c.rotary_dim) > kMost / 2) c.tokens /= 2;
  const int64_t pages[] = {1, 16, 64};
  c.page_size = uniform(0, 4) < 4 ? pages[uniform(0, 2)] : uniform(2, 128);
  c.slots = kSlots[uniform(0, 3)];
  if (uniform(0, 5) == 0) c.offset = 1;  // misaligned by one element: the scalar path
  const int64_t pad = uniform(0, 3);
  c.pad = pad == 0 ? 0 : pad == 1 ? (uniform(0, 2) ? 8 * uniform(1, 4) : uniform(1, 9)) : 16;
  if (d.cache != 0 || c.q_fp8()) {
    c.scales = uniform(0, 3) != 0;
    if (uniform(0, 5) == 0) c.scale_magnitude = uniform(0, 1) ? 0.003f : 50.0f;  // saturation, subnormals
  }
  const int64_t launch = uniform(0, 9);
  c.launch = launch == 0 ? Launch::kPdl : launch == 1 ? Launch::kGraph : Launch::kDirect;
  if (c.tokens == 0) c.launch = Launch::kDirect;  // (an empty call launches nothing: none to capture)
  c.seed = seed;
  return d;
}

template <typename T>
void run_mla_dtype(const MlaDraw& d) {
  switch (d.cache) {
    case 0: run_case<T, T>(d.cfg); break;
    case 1: run_case<T, __nv_fp8_e4m3>(d.cfg); break;
    default: run_case<T, __nv_fp8_e5m2>(d.cfg); break;
  }
}

}  // namespace

// Seeded and reproducible: every failure prints its configuration and the run's seed.
//   KVROPE_RANDOM_CONFIGS  configurations per run (default 300; a long run thousands)
//   KVROPE_RANDOM_SEED     seed of the run (default 20261207)
TEST_CASE("mla append: random configurations match the float64 reference", "[gpu][mla][random]") {
  const RandomRun run = random_run("mla", 20261207);
  std::mt19937_64 rng(run.seed);
  for (int64_t i = 0; i < run.configs; ++i) {
    const MlaDraw d = draw_mla(rng, run.config_seed(i));
    const char* caches[] = {"cache T", "cache e4m3", "cache e5m2"};
    INFO(run.where(i) << ", " << dtype_name(d.dtype) << ", " << caches[d.cache] << ": " << d.cfg.describe());
    with_dtype(d.dtype, [&](auto t) { run_mla_dtype<decltype(t)>(d); });
  }
}
