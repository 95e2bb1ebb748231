// Randomized differential test: random configurations (dtype, head dim, layout, padding, alignment,
// broadcast, positions, sizes, variant) checked against the float64 reference. Seeded and
// reproducible: every failure prints its configuration and the run's seed.
//
//   KVROPE_RANDOM_CONFIGS  configurations per run (default 300; the long run uses 2000 or more)
//   KVROPE_RANDOM_SEED     seed of the run (default 20261129)
#include <cstdio>
#include <random>

#include "support/gpu_problem.cuh"

using namespace kvrope;
using namespace kvrope::testing;

namespace {

// One random configuration; `dtype` picks the element type (0 bf16, 1 fp16, 2 fp32), `pos64` the
// position type.
struct Draw {
  Config cfg;
  int dtype;
  bool pos64;
};

Draw draw(std::mt19937_64& rng, uint64_t seed) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Draw d{};
  d.dtype = static_cast<int>(uniform(0, 2));
  d.pos64 = uniform(0, 1) == 1;
  const int64_t compiled[] = {64, 80, 96, 128, 256};
  const int64_t head_dim = uniform(0, 2) < 2 ? compiled[uniform(0, 4)] : 2 * uniform(1, 160);
  Shape s{uniform(0, 4), uniform(1, 64), 0, uniform(1, 300), head_dim};
  if (uniform(0, 9) == 0) s.batch = 0;
  const int64_t big = uniform(0, 3) == 0;  // a few long sequences
  if (big) s.cache_len = uniform(300, 2500);
  s.seq_len = uniform(0, 5) == 0 ? s.cache_len : uniform(0, s.cache_len);
  // Keep each configuration to a few million elements so that thousands run in minutes.
  while (s.batch * s.heads * s.cache_len * s.head_dim > (int64_t{1} << 22) && s.heads > 1) s.heads /= 2;
  d.cfg.shape = s;
  d.cfg.layout = uniform(0, 1) ? Layout::kBHSD : Layout::kBSHD;
  const Positions patterns[] = {Positions::kArange,   Positions::kPermutation, Positions::kSparse,
                                Positions::kNegative, Positions::kDuplicates,  Positions::kOutOfRange};
  d.cfg.positions = patterns[uniform(0, 5)];
  const Variant variants[] = {Variant::kOutOfPlace, Variant::kInPlace, Variant::kOutOfPlaceNoTables,
                              Variant::kInPlaceNoTables, Variant::kNaive};
  d.cfg.variant = variants[uniform(0, 4)];
  d.cfg.broadcast_tables = uniform(0, 2) == 0;
  if (uniform(0, 2) == 0) {  // padding between rows, heads and batches
    d.cfg.pad_row = uniform(0, 3) == 0 ? 1 : 8 * uniform(0, 4);
    d.cfg.pad_head = uniform(0, 17);
    d.cfg.pad_batch = uniform(0, 33);
  }
  if (uniform(0, 5) == 0) d.cfg.offset = 1;                      // misaligned by one element
  if (d.cfg.variant != Variant::kNaive && uniform(0, 2) == 0) {  // another rotation (the naive one has none)
    d.cfg.style = uniform(0, 1) ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
    const int64_t choice = uniform(0, 2);
    d.cfg.rotary_dim = choice == 0 ? 0 : choice == 1 ? head_dim / 2 / 2 * 2 : 2 * uniform(1, head_dim / 2);
    if (d.cfg.rotary_dim == 0 && d.cfg.style == RotaryStyle::kRotateHalf) d.cfg.rotary_dim = 2;
    d.cfg.sum_table_grads = uniform(0, 1) == 1;
  }
  d.cfg.seed = seed;
  return d;
}

template <typename T>
void run_one(const Draw& d) {
  if (d.pos64) {
    Problem<T, int64_t> p(d.cfg);
    p.run_and_check();
  } else {
    Problem<T, int32_t> p(d.cfg);
    p.run_and_check();
  }
}

}  // namespace

TEST_CASE("random configurations match the float64 reference", "[gpu][random]") {
  const RandomRun run = random_run("backward", 20261129);
  std::mt19937_64 rng(run.seed);
  for (int64_t i = 0; i < run.configs; ++i) {
    const Draw d = draw(rng, run.config_seed(i));
    INFO(run.where(i) << ", dtype " << dtype_name(d.dtype) << (d.pos64 ? " int64" : " int32")
                      << " positions: " << d.cfg.describe());
    with_dtype(d.dtype, [&](auto t) { run_one<decltype(t)>(d); });
  }
}
