// Randomized differential test of the append (docs/spec.md §6): random configurations drawing every option
// (element, cache (NVFP4 too) and position types, head dim, rotary dim and style, sizes, q and k outputs,
// norms, cache layouts and strides, a fused qkv buffer, slot and position patterns, scales, misalignment,
// mRoPE) checked against the float64 reference. Seeded and reproducible: every failure prints its
// configuration and the run's seed.
//
//   KVROPE_RANDOM_CONFIGS  configurations per run (default 300; the long run uses 2000 or more)
//   KVROPE_RANDOM_SEED     seed of the run (default 20261202)
#include <cstdio>
#include <random>

#include "support/append_problem.cuh"

using namespace kvrope;
using namespace kvrope::testing;

namespace {

// One random configuration; `dtype` picks T (0 bf16, 1 fp16, 2 fp32), `cache` C (0 T, 1 e4m3, 2 e5m2,
// 3 NVFP4), `pos64` the position type.
struct Draw {
  AppendConfig cfg;
  int dtype, cache;
  bool pos64;
};

Draw draw(std::mt19937_64& rng, uint64_t seed) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Draw d{};
  AppendConfig& c = d.cfg;
  d.dtype = static_cast<int>(uniform(0, 2));
  d.cache = uniform(0, 7) == 0 ? 3 : static_cast<int>(uniform(0, 2));  // NVFP4 one time in eight
  d.pos64 = uniform(0, 1) == 1;
  const int64_t compiled[] = {64, 80, 96, 128, 256};
  c.head_dim = uniform(0, 2) < 2 ? compiled[uniform(0, 4)] : 2 * uniform(1, 160);
  const int64_t r = uniform(0, 2);
  c.rotary_dim = r == 0 ? 0 : r == 1 ? c.head_dim / 2 / 2 * 2 : 2 * uniform(1, c.head_dim / 2);
  if (c.rotary_dim == 0 && r == 1) c.rotary_dim = 2;
  c.style = uniform(0, 1) ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
  const int64_t size = uniform(0, 9);
  c.tokens = size == 0 ? 1 : size == 1 ? uniform(200, 1500) : size == 2 && uniform(0, 3) == 0 ? 0 : uniform(1, 200);
  c.heads = uniform(0, 15) == 0 ? 0 : uniform(1, 16);
  c.query_heads = uniform(0, 4) == 0 ? 0 : uniform(0, 1) ? c.heads * uniform(1, 8) : uniform(1, 32);
  // Keep each configuration to a few million elements so that thousands run in minutes.
  while (c.tokens * (c.query_heads + 2 * c.heads) * c.head_dim > (int64_t{1} << 22) && c.query_heads + c.heads > 1) {
    c.query_heads /= 2;
    c.heads = (c.heads + 1) / 2;
  }
  const int64_t pages[] = {1, 8, 16, 32};
  c.page_size = uniform(0, 4) < 4 ? pages[uniform(0, 3)] : uniform(1, 64);
  c.contiguous = uniform(0, 5) == 0;
  c.k_cache = uniform(0, 1) ? CacheKind::kHND : CacheKind::kNHD;
  c.v_cache = uniform(0, 2) == 0 ? (c.k_cache == CacheKind::kHND ? CacheKind::kNHD : CacheKind::kHND) : c.k_cache;
  if (uniform(0, 3) == 0) c.k_pad = uniform(0, 2) ? 8 * uniform(1, 4) : uniform(1, 9);
  if (uniform(0, 3) == 0) c.v_pad = uniform(0, 2) ? 8 * uniform(1, 4) : uniform(1, 9);
  c.fused_qkv = uniform(0, 3) == 0;
  c.query_out = uniform(0, 1) == 1;
  c.query_fp8 = c.query_out && uniform(0, 2) == 0;  // fp8 q rows instead of query_out
  c.pdl = uniform(0, 4) == 0;
  if (c.query_fp8) c.scales = static_cast<Scales>(uniform(0, 2));
  c.key = static_cast<KeyWrite>(uniform(0, 2));
  c.q_norm = uniform(0, 2) == 0;
  c.k_norm = uniform(0, 2) == 0;
  c.plus_one = uniform(0, 1) == 1;
  c.eps = uniform(0, 3) == 0 ? 0.25f : 1e-6f;
  c.table_f32 = uniform(0, 1) == 1;
  c.slots = static_cast<SlotPattern>(uniform(0, 5));
  c.bad_positions = uniform(0, 4) == 0;
  if (uniform(0, 5) == 0) c.offset = 1;  // misaligned by one element
  if (uniform(0, 3) == 0) c.token_pad = uniform(0, 1) ? 8 * uniform(1, 4) : uniform(1, 9);
  if (d.cache != 0) {
    c.scales = static_cast<Scales>(uniform(0, 2));
    if (uniform(0, 5) == 0) c.scale_magnitude = uniform(0, 1) ? 0.003f : 50.0f;  // saturation, subnormals
  }
  if (d.cache == 3) {
    // What NVFP4 caches take (validate): D and R multiples of 32, D at most 64 chunks of 16 bytes, every row
    // 16-byte aligned (code rows to a chunk's codes; block-scale rows anywhere).
    const int64_t most = d.dtype == 2 ? 256 : 512;
    c.head_dim = std::min<int64_t>(32 * uniform(1, most / 32), uniform(0, 2) < 2 ? 256 : most);
    c.rotary_dim = uniform(0, 2) == 0 ? 32 * uniform(1, c.head_dim / 32) : 0;
    if (c.rotary_dim == c.head_dim) c.rotary_dim = 0;
    while (c.tokens * (c.query_heads + 2 * c.heads) * c.head_dim > (int64_t{1} << 22) && c.query_heads + c.heads > 1) {
      c.query_heads /= 2;
      c.heads = (c.heads + 1) / 2;
    }
    c.offset = 0;
    c.token_pad = c.token_pad / 8 * 8;
    c.k_pad = c.k_pad / 8 * 8;
    c.v_pad = c.v_pad / 8 * 8;
    c.sf_pad = uniform(0, 3) == 0 ? uniform(1, 5) : 0;
    if (uniform(0, 5) == 0) c.scale_magnitude = uniform(0, 1) ? 0.0005f : 1.0e4f;  // scales saturate, underflow
  }
  if (uniform(0, 3) == 0) {
    // mRoPE: three sections of the R/2 pairs (Qwen's proportions, or any), contiguous or interleaved, and a
    // stream stride of T, more, or 0 (one stream read as all three).
    const int64_t pairs = (c.rotary_dim == 0 ? c.head_dim : c.rotary_dim) / 2;
    if (uniform(0, 1) == 0) {
      c.mrope[1] = c.mrope[2] = pairs * 3 / 8;
    } else {
      c.mrope[1] = uniform(0, pairs);
      c.mrope[2] = uniform(0, pairs - c.mrope[1]);
    }
    c.mrope[0] = pairs - c.mrope[1] - c.mrope[2];
    c.mrope_interleaved = uniform(0, 1) == 1;
    const int64_t pad = uniform(0, 5);
    c.stream_pad = pad == 0 ? -c.tokens : pad == 1 ? 0 : uniform(1, 40);
  }
  c.seed = seed;
  return d;
}

template <typename T, typename C>
void run_one(const Draw& d) {
  if (d.pos64)
    run_append_case<T, C, int64_t>(d.cfg);
  else
    run_append_case<T, C, int32_t>(d.cfg);
}

template <typename T>
void run_dtype(const Draw& d) {
  switch (d.cache) {
    case 0: run_one<T, T>(d); break;
    case 1: run_one<T, __nv_fp8_e4m3>(d); break;
    case 2: run_one<T, __nv_fp8_e5m2>(d); break;
    default: run_one<T, kvrope::nvfp4_e2m1x2>(d); break;
  }
}

}  // namespace

TEST_CASE("append: random configurations match the float64 reference", "[gpu][append][random]") {
  const RandomRun run = random_run("append", 20261202);
  std::mt19937_64 rng(run.seed);
  for (int64_t i = 0; i < run.configs; ++i) {
    const Draw d = draw(rng, run.config_seed(i));
    const char* caches[] = {"cache T", "cache e4m3", "cache e5m2", "cache NVFP4"};
    INFO(run.where(i) << ", " << dtype_name(d.dtype) << ", " << caches[d.cache] << (d.pos64 ? ", int64" : ", int32")
                      << " positions: " << d.cfg.describe());
    with_dtype(d.dtype, [&](auto t) { run_dtype<decltype(t)>(d); });
  }
}
