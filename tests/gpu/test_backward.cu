// GPU tests of the backward: fused (out-of-place, in-place, without table gradients) and naive,
// against the float64 reference, over dtypes, head dims, layouts, position patterns and shapes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "support/gpu_problem.cuh"

using namespace kvrope;
using namespace kvrope::testing;

namespace {

const Positions kAllPatterns[] = {Positions::kArange,   Positions::kPermutation, Positions::kSparse,
                                  Positions::kNegative, Positions::kDuplicates,  Positions::kOutOfRange};
const Variant kAllVariants[] = {Variant::kOutOfPlace, Variant::kInPlace, Variant::kNaive, Variant::kOutOfPlaceNoTables,
                                Variant::kInPlaceNoTables};

template <typename T, typename Pos>
void run(const Config& cfg) {
  Problem<T, Pos> problem(cfg);
  problem.run_and_check();
}

// The shapes of leaderboard cases 4, 8, 10 and 16 (H = 8, D = 128).
const Shape kCases[] = {{2, 8, 211, 1024, 128}, {1, 8, 1, 256, 128}, {32, 8, 1, 2048, 128}, {1, 8, 293, 2048, 128}};

}  // namespace

// Small shapes at head dims [first, last) of the list below, every layout, position pattern and variant;
// each configuration's seed is its index over the whole list (a test case a few head dims, so that
// each of compute-sanitizer's racecheck runs, one a test case, stays within its time limit).
template <typename T>
void run_small_shapes(int first, int last) {
  // 64..256 are compiled instances; 48 and 512 take the generic vectorized path (512: more chunk
  // pairs than lanes), 40 and 2 the scalar path for 16-bit types.
  const int64_t head_dims[] = {64, 80, 96, 128, 256, 48, 512, 40, 2};
  const Shape shapes[] = {{2, 4, 7, 33, 0}, {3, 5, 16, 16, 0}, {1, 1, 1, 1, 0}};
  const uint64_t per_dim = std::size(shapes) * 2 * std::size(kAllPatterns) * std::size(kAllVariants);
  uint64_t seed = 1 + first * per_dim;
  for (int i = first; i < last; ++i)
    for (Shape shape : shapes)
      for (Layout layout : {Layout::kBHSD, Layout::kBSHD})
        for (Positions positions : kAllPatterns)
          for (Variant variant : kAllVariants) {
            shape.head_dim = head_dims[i];
            Config cfg{shape, layout, positions, variant, seed % 3 == 0, seed};
            if (seed % 2)
              run<T, int64_t>(cfg);
            else
              run<T, int32_t>(cfg);
            ++seed;
          }
}

TEMPLATE_TEST_CASE("backward matches the float64 reference on small shapes, head dims 64 80 96", "[gpu]", __nv_bfloat16,
                   __half, float) {
  run_small_shapes<TestType>(0, 3);
}
TEMPLATE_TEST_CASE("backward matches the float64 reference on small shapes, head dims 128 256", "[gpu]", __nv_bfloat16,
                   __half, float) {
  run_small_shapes<TestType>(3, 5);
}
TEMPLATE_TEST_CASE("backward matches the float64 reference on small shapes, head dims 48 512 40 2", "[gpu]",
                   __nv_bfloat16, __half, float) {
  run_small_shapes<TestType>(5, 9);
}

TEMPLATE_TEST_CASE("head dims 80 and 96 with one warp a token", "[gpu]", __nv_bfloat16, float) {
  // Pairs a row that are not a power of two (10, 12), with more tokens than half the warps (one warp a
  // token, on an H200); 7 heads leave a head slot idle.
  const Shape shapes[] = {{4, 7, 400, 420, 80}, {4, 16, 400, 420, 80}, {4, 8, 400, 420, 96}};
  uint64_t seed = 400;
  for (const Shape& shape : shapes)
    for (Positions positions : kAllPatterns)
      for (Variant variant : kAllVariants) {
        const Config cfg{shape, Layout::kBHSD, positions, variant, seed % 3 == 0, seed};
        if (seed % 2)
          run<TestType, int64_t>(cfg);
        else
          run<TestType, int32_t>(cfg);
        ++seed;
      }
}

TEMPLATE_TEST_CASE("backward on leaderboard case shapes 4, 8, 10, 16", "[gpu][cases]", __nv_bfloat16, __half, float) {
  uint64_t seed = 100;
  for (const Shape& shape : kCases)
    for (Layout layout : {Layout::kBHSD, Layout::kBSHD})
      for (Positions positions : {Positions::kArange, Positions::kPermutation, Positions::kDuplicates})
        for (Variant variant : {Variant::kOutOfPlace, Variant::kInPlace, Variant::kNaive}) {
          // BSHD and the other dtypes take fewer combinations (the kernel paths are the same).
          if (layout == Layout::kBSHD && positions != Positions::kArange) continue;
          if (!std::is_same_v<TestType, __nv_bfloat16> && (positions != Positions::kArange || layout == Layout::kBSHD))
            continue;
          run<TestType, int64_t>(Config{shape, layout, positions, variant, false, seed++});
        }
}

TEMPLATE_TEST_CASE("a token whose position is out of range has zero outputs whatever its key and tables hold",
                   "[gpu][range]", __nv_bfloat16, __half, float) {
  // The out-of-range tokens' key rows are +Inf and their cos / sin rows NaN / -Inf (rows no valid
  // token reads): their grad_key_states, grad_value_states, grad_cos and grad_sin must still be
  // zeros (a zero gradient times an infinite input would be NaN), every other output as usual.
  // S = 1 through the decode kernel (BSHD with one table for the batch, more heads than a pass covers,
  // padded rows) and the fused one (out of place with the decode kernel's cache limit at zero; in place
  // a head dim with no decode instance); S > 1 through the fused kernel (out of place: the bulk copy;
  // in place), BSHD with one table for the batch, and the scalar path.
  Config configs[] = {
      {{3, 8, 1, 64, 128}, Layout::kBHSD, Positions::kOutOfRange, Variant::kOutOfPlace, false, 301},
      {{3, 8, 1, 64, 128}, Layout::kBHSD, Positions::kOutOfRange, Variant::kInPlace, false, 302},
      {{2, 8, 7, 64, 128}, Layout::kBHSD, Positions::kOutOfRange, Variant::kOutOfPlace, false, 303},
      {{2, 8, 7, 64, 128}, Layout::kBHSD, Positions::kOutOfRange, Variant::kInPlace, false, 304},
      {{2, 4, 7, 33, 64}, Layout::kBSHD, Positions::kOutOfRange, Variant::kInPlace, true, 305},
      {{2, 4, 7, 33, 64}, Layout::kBHSD, Positions::kOutOfRange, Variant::kOutOfPlaceNoTables, false, 306},
      {{2, 4, 7, 33, 64}, Layout::kBHSD, Positions::kOutOfRange, Variant::kOutOfPlace, false, 307},
      {{3, 5, 1, 9, 16}, Layout::kBSHD, Positions::kOutOfRange, Variant::kOutOfPlace, true, 308},
      {{2, 37, 1, 9, 32}, Layout::kBHSD, Positions::kOutOfRange, Variant::kInPlace, false, 309},
      {{2, 8, 1, 33, 64}, Layout::kBHSD, Positions::kOutOfRange, Variant::kOutOfPlace, false, 310},
      {{3, 8, 1, 64, 96}, Layout::kBHSD, Positions::kOutOfRange, Variant::kInPlace, false, 311},
  };
  configs[6].offset = 1;   // misaligned: the scalar path
  configs[9].pad_row = 8;  // padded rows and heads, still 16-byte aligned
  configs[9].pad_head = 16;
  for (const Config& cfg : configs)
    for (const bool decode : {true, false}) {  // false: out of place, the decode kernel's cache limit at 0
      if (!decode && (cfg.shape.seq_len != 1 || cfg.variant != Variant::kOutOfPlace)) continue;
      Problem<TestType, int64_t> p(cfg);
      const Shape& sh = cfg.shape;
      std::vector<TestType> key = p.key.to_host(), cos = p.cos.to_host(), sin = p.sin.to_host();
      const TestType inf = from_float<TestType>(INFINITY), ninf = from_float<TestType>(-INFINITY),
                     nan = from_float<TestType>(NAN);
      int64_t bad = 0;
      for (int64_t t = 0; t < sh.seq_len; ++t) {
        const int64_t r = static_cast<int64_t>(p.host_pos[t]);
        if (r >= -sh.cache_len && r < sh.cache_len) continue;
        ++bad;
        for (int64_t b = 0; b < sh.batch; ++b) {
          for (int64_t j = 0; j < sh.heads; ++j)
            std::fill_n(p.heads_view(key.data(), sh.seq_len).row(b, j, t), sh.head_dim, inf);
          std::fill_n(p.table_view(cos.data()).row(b, t), sh.head_dim, nan);
          std::fill_n(p.table_view(sin.data()).row(b, t), sh.head_dim, ninf);
        }
      }
      REQUIRE(bad > 0);
      KVROPE_CUDA_REQUIRE(cudaMemcpy(p.key.get(), key.data(), key.size() * sizeof(TestType), cudaMemcpyHostToDevice));
      KVROPE_CUDA_REQUIRE(cudaMemcpy(p.cos.get(), cos.data(), cos.size() * sizeof(TestType), cudaMemcpyHostToDevice));
      KVROPE_CUDA_REQUIRE(cudaMemcpy(p.sin.get(), sin.data(), sin.size() * sizeof(TestType), cudaMemcpyHostToDevice));
      LaunchPolicy policy = device_policy();
      if (!decode) policy.decode_copy_max_mib = 0;
      LaunchConfig launch;
      REQUIRE(p.plan(&launch, &policy).ok());
      INFO(cfg.describe() << " kernel " << static_cast<int>(launch.plan.kernel) << " warps a token "
                          << launch.token_parts << " path " << static_cast<int>(launch.plan.path));
      const bool decode_dim = detail::decode_head_dim_ok<TestType>(sh.head_dim);
      CHECK((launch.plan.kernel == BackwardKernel::kDecode) ==
            (decode && sh.seq_len == 1 && cfg.offset == 0 && decode_dim));
      p.run_and_check(&policy);
    }
}

TEST_CASE("empty problems: B = 0 does nothing, S = 0 still copies the caches", "[gpu]") {
  for (Variant variant : {Variant::kOutOfPlace, Variant::kInPlace, Variant::kNaive}) {
    run<__nv_bfloat16, int64_t>(Config{{2, 3, 0, 17, 64}, Layout::kBHSD, Positions::kArange, variant, false, 7});
    run<__nv_bfloat16, int64_t>(Config{{2, 0, 5, 17, 64}, Layout::kBHSD, Positions::kPermutation, variant, false, 8});
    run<__nv_bfloat16, int64_t>(Config{{2, 3, 0, 0, 64}, Layout::kBHSD, Positions::kArange, variant, false, 9});
  }
  // B = 0: nothing launched, nothing written, even with null pointers.
  BackwardParams<float> p;
  p.batch = 0;
  p.heads = 8;
  p.seq_len = 4;
  p.cache_len = 16;
  p.head_dim = 64;
  BackwardPlan plan;
  REQUIRE(Launchers<float, int64_t>::plan(p, &plan).ok());
  CHECK(plan.path == BackwardPath::kNothingToDo);
  CHECK(Launchers<float, int64_t>::backward(p, nullptr).ok());
}

TEST_CASE("a rejected call launches nothing and writes nothing", "[gpu]") {
  Problem<__nv_bfloat16, int64_t> problem(
      Config{{2, 4, 8, 32, 128}, Layout::kBHSD, Positions::kArange, Variant::kOutOfPlace, false, 11});
  problem.poison_outputs();
  auto p = problem.device_params();
  p.head_dim = 127;
  CHECK(Launchers<__nv_bfloat16, int64_t>::backward(p, nullptr).code == StatusCode::kInvalidHeadDim);
  p = problem.device_params();
  p.grad_value_states = HeadRows<__nv_bfloat16>{problem.gks.get(), 0, 0, 0};  // overlapping rows
  CHECK(Launchers<__nv_bfloat16, int64_t>::backward(p, nullptr).code == StatusCode::kOverlappingRows);
  p = problem.device_params();
  p.grad_key_cache_input.data = problem.gk.get();  // out-of-place output aliasing its input
  CHECK(Launchers<__nv_bfloat16, int64_t>::backward(p, nullptr).code == StatusCode::kAliasedBuffers);
  KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  for (const DeviceBuffer<__nv_bfloat16>* b :
       {&problem.gks, &problem.gvs, &problem.gcos, &problem.gsin, &problem.gk_in, &problem.gv_in}) {
    const auto host = b->to_host();
    const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
    CHECK(std::all_of(bytes, bytes + host.size() * sizeof(__nv_bfloat16), [](unsigned char c) { return c == 0xFF; }));
  }
}

TEST_CASE("the fast path is taken when alignment allows, the scalar path otherwise", "[gpu]") {
  Problem<__nv_bfloat16, int64_t> problem(
      Config{{2, 4, 8, 32, 128}, Layout::kBHSD, Positions::kArange, Variant::kOutOfPlace, false, 12});
  BackwardPlan plan;
  auto p = problem.device_params();
  REQUIRE(Launchers<__nv_bfloat16, int64_t>::plan(p, &plan).ok());
  CHECK(plan.path == BackwardPath::kCompiledHeadDim);
  CHECK(plan.head_dim_instance == 128);
  CHECK(plan.vec_width == 8);
  p.cos.data += 1;  // one element off: no longer 16-byte aligned (still inside the buffer's bounds checks)
  p.cos.seq_stride = 127;
  p.seq_len = 7;
  p.key_states.seq_stride = 128;
  REQUIRE(Launchers<__nv_bfloat16, int64_t>::plan(p, &plan).ok());
  CHECK(plan.path == BackwardPath::kGenericScalar);
  CHECK(plan.vec_width == 1);
}

TEMPLATE_TEST_CASE("the backward of every rotation: interleaved, partial rotary, table gradients summed over the batch",
                   "[gpu][rotary]", __nv_bfloat16, __half, float) {
  // The general instance (16-byte accesses where R allows them, else the scalar path); both variants,
  // with and without table gradients; BSHD and broadcast tables; repeated and out-of-range positions.
  uint64_t seed = 700;
  const Shape shapes[] = {{3, 8, 45, 300, 128}, {2, 5, 17, 40, 64}, {4, 3, 1, 9, 80}};
  for (const Shape& shape : shapes)
    for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
      for (const int64_t r : {int64_t{0}, shape.head_dim / 2, int64_t{2}})
        for (const bool sum : {false, true}) {
          if (style == RotaryStyle::kRotateHalf && r == 0 && !sum) continue;  // the default: tested above
          for (const Variant variant : {Variant::kOutOfPlace, Variant::kInPlace, Variant::kInPlaceNoTables}) {
            Config cfg{shape,
                       seed % 2 ? Layout::kBSHD : Layout::kBHSD,
                       seed % 3 == 0   ? Positions::kDuplicates
                       : seed % 3 == 1 ? Positions::kOutOfRange
                                       : Positions::kPermutation,
                       variant,
                       seed % 4 == 0,
                       seed};
            cfg.rotary_dim = r;
            cfg.style = style;
            cfg.sum_table_grads = sum;
            ++seed;
            run<TestType, int64_t>(cfg);
          }
        }
}
