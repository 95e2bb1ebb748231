// GPU tests of the append (the serving forward, docs/spec.md §6) against the float64 reference: bf16, fp16
// and fp32; caches in T, e4m3 and e5m2 with per-tensor and per-head scales, NVFP4 (every value and block-scale
// byte, given the GPU's own block-scale arithmetic) and what it refuses; the compiled head dims and
// generic even ones; both styles and partial rotary; q in place or out; key_out, key in place or neither;
// the norms; NHD and HND pages, a flat pool, a contiguous per-sequence cache, caches of different
// strides; a fused qkv buffer; padding, repeated and out-of-range slots and positions; misaligned views;
// int32 and int64 positions; fp32 and T tables; decode, T = 1024, a prefill of 4096 tokens, an empty
// call; graph capture; multimodal positions (mRoPE: contiguous and interleaved sections, a stream stride
// other than T) with each of these options; the fp8 store itself on every bf16 and fp16 value under 64 scales.
// Outputs and caches are poisoned (0xFF bytes) before every launch (tests/support/append_problem.cuh).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "support/append_problem.cuh"
#include "support/fp8_cases.hpp"

using namespace kvrope;
using namespace kvrope::testing;

namespace {

template <typename T, typename C>
void run_case(const AppendConfig& c, bool pos64) {
  if (pos64)
    run_append_case<T, C, int64_t>(c);
  else
    run_append_case<T, C, int32_t>(c);
}

// Whether every byte of a host copy is 0xFF (the poison: no write reached it).
template <typename U>
bool all_poisoned(const std::vector<U>& host) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
  return std::all_of(bytes, bytes + host.size() * sizeof(U), [](unsigned char b) { return b == 0xFF; });
}

constexpr SlotPattern kPatterns[] = {SlotPattern::kSequences, SlotPattern::kRun,     SlotPattern::kPermutation,
                                     SlotPattern::kPadding,   SlotPattern::kRepeats, SlotPattern::kOutOfRange};

}  // namespace

TEMPLATE_TEST_CASE("append matches the float64 reference: head dims, styles, partial rotary, q and k outputs, norms",
                   "[gpu][append]", __nv_bfloat16, __half, float) {
  const int64_t dims[] = {64, 80, 96, 128, 256, 48, 112, 130};
  uint64_t seed = 1;
  for (const int64_t D : dims)
    for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
      for (const int r : {0, 1, 2}) {
        AppendConfig c;
        c.seed = seed++;
        c.head_dim = D;
        c.style = style;
        c.rotary_dim = r == 0 ? 0 : r == 1 ? D / 2 - (D / 2) % 2 : 2;  // full, half, one pair
        c.tokens = 19 + static_cast<int64_t>(c.seed % 13);
        c.heads = 1 + static_cast<int64_t>(c.seed % 3);
        c.query_heads = c.seed % 5 == 0 ? 0 : c.seed % 5 == 1 ? 3 : c.heads * (1 + static_cast<int64_t>(c.seed % 4));
        c.query_out = c.seed % 2 == 1;
        c.key = static_cast<KeyWrite>(c.seed % 3);
        c.q_norm = c.seed % 4 == 1 || c.seed % 4 == 3;
        c.k_norm = c.seed % 4 >= 2;
        c.plus_one = c.seed % 5 == 2;
        c.table_f32 = c.seed % 3 != 1;
        c.k_cache = c.seed % 2 ? CacheKind::kHND : CacheKind::kNHD;
        c.v_cache = (c.seed / 2) % 2 ? CacheKind::kHND : CacheKind::kNHD;
        c.page_size = c.seed % 3 == 0 ? 16 : c.seed % 3 == 1 ? 1 : 8;
        c.slots = kPatterns[c.seed % 6];
        c.bad_positions = c.seed % 7 == 5;
        run_case<TestType, TestType>(c, c.seed % 2 == 0);
      }
}

TEMPLATE_TEST_CASE("append into fp8 caches: e4m3 and e5m2, no scale, one scale, a scale a head, saturation",
                   "[gpu][append][fp8]", __nv_bfloat16, __half, float) {
  const int64_t dims[] = {128, 64, 80, 112};
  uint64_t seed = 100;
  for (const bool e5m2 : {false, true})
    for (const Scales scales : {Scales::kNone, Scales::kTensor, Scales::kHead})
      for (const KeyWrite key : {KeyWrite::kOut, KeyWrite::kInPlace, KeyWrite::kNone}) {
        AppendConfig c;
        c.seed = seed++;
        c.head_dim = dims[c.seed % 4];
        c.tokens = 33;
        c.heads = 4;
        c.query_heads = 8;
        c.scales = scales;
        c.key = key;
        c.k_norm = c.seed % 3 == 0;
        c.q_norm = c.seed % 3 == 1;
        c.style = c.seed % 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
        c.rotary_dim = c.seed % 4 == 3 ? c.head_dim / 2 : 0;
        c.slots = kPatterns[c.seed % 6];
        c.k_cache = c.seed % 2 ? CacheKind::kNHD : CacheKind::kHND;
        if (e5m2)
          run_case<TestType, __nv_fp8_e5m2>(c, c.seed % 2 == 1);
        else
          run_case<TestType, __nv_fp8_e4m3>(c, c.seed % 2 == 1);
      }
  // Scales small enough that many values saturate (e4m3 beyond 448, e5m2 beyond 57344), and large ones
  // that push values into the subnormals.
  for (const float magnitude : {0.004f, 1.0e-5f, 100.0f}) {
    AppendConfig c;
    c.seed = seed++;
    c.head_dim = 128;
    c.tokens = 17;
    c.scales = Scales::kHead;
    c.scale_magnitude = magnitude;
    run_case<TestType, __nv_fp8_e4m3>(c, true);
    run_case<TestType, __nv_fp8_e5m2>(c, false);
  }
}

namespace {
// mRoPE sections of head dims and rotary dims (R = 0: D): Qwen2-VL / Qwen2.5-VL (16, 24, 24) and Qwen3-VL
// (24, 20, 20) at D = 128, smaller dims, partial rotary, a dim the vector path cannot take (130: the tile
// path's scalar form at every T).
struct MropeShape {
  int64_t head_dim, rotary_dim, section[3];
};
constexpr MropeShape kMropeShapes[] = {
    {128, 0, {16, 24, 24}},  {128, 0, {24, 20, 20}}, {64, 0, {8, 12, 12}},   {80, 64, {8, 12, 12}},
    {128, 64, {10, 11, 11}}, {48, 0, {12, 6, 6}},    {130, 0, {21, 22, 22}}, {64, 0, {0, 32, 0}},
};
// Token counts of the few-token path (up to kAppendTokenMaxTokens on the vector path) and of the tile path.
constexpr int64_t kMropeTokens[] = {1, 3, 37, 300, detail::kAppendTokenMaxTokens + 1, 2100};

void set_mrope(AppendConfig& c, const MropeShape& m, bool interleaved) {
  c.head_dim = m.head_dim;
  c.rotary_dim = m.rotary_dim;
  for (int j = 0; j < 3; ++j) c.mrope[j] = m.section[j];
  c.mrope_interleaved = interleaved;
}
}  // namespace

TEMPLATE_TEST_CASE("append with mRoPE matches the float64 reference: sections, styles, partial rotary, norms, sizes",
                   "[gpu][append][mrope]", __nv_bfloat16, __half, float) {
  uint64_t seed = 1000;
  for (const MropeShape& m : kMropeShapes)
    for (const bool interleaved : {false, true})
      for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved}) {
        AppendConfig c;
        c.seed = seed++;
        set_mrope(c, m, interleaved);
        c.style = style;
        c.tokens = kMropeTokens[c.seed % 6];
        c.heads = 1 + static_cast<int64_t>(c.seed % 3);
        c.query_heads = c.seed % 5 == 0 ? 0 : c.heads * (1 + static_cast<int64_t>(c.seed % 4));
        c.query_out = c.seed % 2 == 1;
        c.key = static_cast<KeyWrite>(c.seed % 3);
        c.q_norm = c.seed % 4 == 1 || c.seed % 4 == 3;
        c.k_norm = c.seed % 4 >= 2;
        c.table_f32 = c.seed % 3 != 1;
        c.k_cache = c.seed % 2 ? CacheKind::kHND : CacheKind::kNHD;
        c.page_size = c.seed % 3 == 0 ? 16 : c.seed % 3 == 1 ? 1 : 8;
        c.slots = kPatterns[c.seed % 6];
        c.bad_positions = c.seed % 4 == 2;
        c.stream_pad = c.seed % 3 == 0 ? 0 : c.seed % 3 == 1 ? 5 : 64;
        run_case<TestType, TestType>(c, c.seed % 2 == 0);
      }
}

TEMPLATE_TEST_CASE("append with mRoPE into fp8 caches and fp8 q, per-tensor and per-head scales, both paths",
                   "[gpu][append][mrope][fp8]", __nv_bfloat16, __half, float) {
  uint64_t seed = 1100;
  for (const bool interleaved : {false, true})
    for (const Scales scales : {Scales::kTensor, Scales::kHead})
      for (const int64_t tokens : {int64_t{1}, int64_t{45}, int64_t{detail::kAppendTokenMaxTokens + 77}}) {
        AppendConfig c;
        c.seed = seed++;
        set_mrope(c, kMropeShapes[c.seed % 5], interleaved);
        c.tokens = tokens;
        c.heads = 4;
        c.query_heads = 8;
        c.scales = scales;
        c.query_fp8 = c.seed % 2 == 0;
        c.key = static_cast<KeyWrite>(c.seed % 3);
        c.q_norm = c.k_norm = c.seed % 3 == 0;
        c.style = c.seed % 4 < 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
        c.slots = kPatterns[c.seed % 6];
        c.stream_pad = 3;
        if (c.seed % 2)
          run_case<TestType, __nv_fp8_e4m3>(c, true);
        else
          run_case<TestType, __nv_fp8_e5m2>(c, false);
      }
}

TEST_CASE("append with mRoPE: cache layouts, a fused qkv buffer, misaligned views, streams of stride 0",
          "[gpu][append][mrope]") {
  struct Variant {
    CacheKind k, v;
    int64_t page_size;
    bool contiguous, fused;
    int64_t offset, stream_pad;  // stream_pad -T: stride 0
  };
  const Variant variants[] = {
      {CacheKind::kNHD, CacheKind::kNHD, 16, false, false, 0, 0},
      {CacheKind::kHND, CacheKind::kHND, 16, false, true, 0, 7},
      {CacheKind::kNHD, CacheKind::kNHD, 1, false, false, 0, 1},   // a flat pool
      {CacheKind::kHND, CacheKind::kNHD, 0, true, false, 0, 0},    // a contiguous per-sequence cache
      {CacheKind::kNHD, CacheKind::kHND, 8, false, false, 1, 2},   // misaligned: the scalar path
      {CacheKind::kNHD, CacheKind::kNHD, 16, false, true, 0, -1},  // stride 0 (set to -T below)
  };
  uint64_t seed = 1200;
  for (const Variant& v : variants)
    for (const int64_t tokens : {int64_t{2}, int64_t{29}, int64_t{1500}})
      for (const bool interleaved : {false, true}) {
        AppendConfig c;
        c.seed = seed++;
        set_mrope(c, kMropeShapes[c.seed % 2], interleaved);
        c.tokens = tokens;
        c.heads = 2;
        c.query_heads = 8;
        c.k_cache = v.k;
        c.v_cache = v.v;
        c.page_size = v.page_size;
        c.contiguous = v.contiguous;
        c.fused_qkv = v.fused;
        c.offset = v.offset;
        c.stream_pad = v.stream_pad < 0 ? -tokens : v.stream_pad;
        c.key = v.fused ? KeyWrite::kInPlace : KeyWrite::kOut;
        c.q_norm = c.k_norm = c.seed % 2 == 0;
        c.slots = v.contiguous ? SlotPattern::kSequences : kPatterns[c.seed % 6];
        c.bad_positions = c.seed % 3 == 0;
        run_case<__nv_bfloat16, __nv_bfloat16>(c, c.seed % 2 == 0);
        c.scales = Scales::kHead;
        run_case<__half, __nv_fp8_e4m3>(c, c.seed % 2 == 1);
      }
}

TEST_CASE("append with mRoPE takes the path of the same shape with ordinary positions", "[gpu][append][mrope]") {
  for (const int64_t tokens : {int64_t{1}, int64_t{37}, int64_t{detail::kAppendTokenMaxTokens + 1}}) {
    AppendConfig c;
    c.tokens = tokens;
    c.heads = 4;
    c.query_heads = 16;
    c.head_dim = 128;
    AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> plain(c);
    set_mrope(c, kMropeShapes[1], true);
    AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> mrope(c);
    AppendPlan a, b;
    REQUIRE((AppendLaunchers<__nv_bfloat16, __nv_bfloat16, int64_t>::plan(plain.params, &a).ok()));
    REQUIRE((AppendLaunchers<__nv_bfloat16, __nv_bfloat16, int64_t>::plan(mrope.params, &b).ok()));
    CHECK(a.path == (tokens <= detail::kAppendTokenMaxTokens ? AppendPath::kToken : AppendPath::kTile));
    CHECK(b.path == a.path);
    mrope.run_and_check();
  }
}

namespace {
// k and v made of the bf16 values whose fp32 quotient by `scale` encodes otherwise than their float64
// quotient (and their negatives): the cache must hold the fp32 path's codes (docs/spec.md §6.4).
template <typename C>
void fp32_division_case(float scale) {
  using T = __nv_bfloat16;
  const __nv_fp8_interpretation_t kind = std::is_same_v<C, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
  std::vector<T> special;
  for (uint32_t b = 0x3000; b < 0x4800; ++b) {
    __nv_bfloat16_raw raw;
    raw.x = static_cast<unsigned short>(b);
    const T x(raw);
    const double f64 = static_cast<double>(to_float(x)) / static_cast<double>(scale);
    if (reference::quantize<C>(x, scale) != __nv_cvt_double_to_fp8(f64, __NV_SATFINITE, kind))
      special.push_back(x), special.push_back(from_float<T>(-to_float(x)));
  }
  INFO(special.size() << " values where the two quotients encode differently");
  REQUIRE(!special.empty());
  AppendConfig c;
  c.tokens = 16;
  c.heads = 2;
  c.query_heads = 0;
  c.head_dim = 64;
  c.rotary_dim = 2;  // k's elements 2..63 pass through: quantized as given
  c.scales = Scales::kTensor;
  AppendProblem<T, C, int64_t> p(c);
  p.host_k_scale = p.host_v_scale = {scale};
  KVROPE_CUDA_REQUIRE(cudaMemcpy(p.k_scale.get(), &scale, sizeof(float), cudaMemcpyHostToDevice));
  KVROPE_CUDA_REQUIRE(cudaMemcpy(p.v_scale.get(), &scale, sizeof(float), cudaMemcpyHostToDevice));
  std::vector<T> values(p.k.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = special[i % special.size()];
  KVROPE_CUDA_REQUIRE(cudaMemcpy(p.k.get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  KVROPE_CUDA_REQUIRE(cudaMemcpy(p.v.get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  p.run_and_check();
}
}  // namespace

TEST_CASE("append: fp8 caches divide by the scale in fp32 (inputs where a float64 quotient rounds otherwise)",
          "[gpu][append][fp8]") {
  fp32_division_case<__nv_fp8_e4m3>(0.7f);
  fp32_division_case<__nv_fp8_e5m2>(1.1f);
}

namespace {
// The fp8 store (detail::store_chunk) of n values of T, N a chunk, under scales[blockIdx.y]: e4m3 codes at
// out[2 y n + i], e5m2 at out[(2 y + 1) n + i].
template <typename T, int N>
__global__ void fp8_store_kernel(const T* x, int64_t n, const float* scales, uint8_t* out) {
  const detail::StoreScale s = detail::store_scale(scales[blockIdx.y]);
  uint8_t* const e4m3 = out + 2 * blockIdx.y * n;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < n / N; c += int64_t{gridDim.x} * blockDim.x) {
    const Vec<T, N> v = load_vec<cub::LOAD_DEFAULT, T, N>(x + c * N);
    detail::store_chunk(reinterpret_cast<__nv_fp8_e4m3*>(e4m3) + c * N, v, s);
    detail::store_chunk(reinterpret_cast<__nv_fp8_e5m2*>(e4m3 + n) + c * N, v, s);
  }
}

// Runs fp8_store_kernel over `values` with N = 1 and the vector N, and checks every code against
// reference::quantize (fp32's IEEE division). Returns the codes compared.
template <typename T>
size_t check_fp8_stores(const std::vector<T>& values, const std::vector<float>& scales) {
  constexpr int kN = 16 / static_cast<int>(sizeof(T));
  const auto n = static_cast<int64_t>(values.size());
  REQUIRE(n % kN == 0);
  DeviceBuffer<T> x(values.size());
  DeviceBuffer<float> d_scales(scales.size());
  DeviceBuffer<uint8_t> out(2 * scales.size() * values.size());
  KVROPE_CUDA_REQUIRE(cudaMemcpy(x.get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  KVROPE_CUDA_REQUIRE(cudaMemcpy(d_scales.get(), scales.data(), scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  size_t compared = 0;
  for (int vector = 0; vector < 2; ++vector) {
    KVROPE_CUDA_REQUIRE(cudaMemset(out.get(), 0xFF, out.size()));
    const dim3 grid(64, static_cast<unsigned>(scales.size()));
    if (vector)
      fp8_store_kernel<T, kN><<<grid, 256>>>(x.get(), n, d_scales.get(), out.get());
    else
      fp8_store_kernel<T, 1><<<grid, 256>>>(x.get(), n, d_scales.get(), out.get());
    KVROPE_CUDA_REQUIRE(cudaGetLastError());
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    const std::vector<uint8_t> codes = out.to_host();
    size_t wrong = 0;
    for (size_t k = 0; k < scales.size(); ++k)
      for (size_t i = 0; i < values.size(); ++i) {
        const uint8_t e4m3 = reference::quantize<__nv_fp8_e4m3>(values[i], scales[k]);
        const uint8_t e5m2 = reference::quantize<__nv_fp8_e5m2>(values[i], scales[k]);
        const uint8_t got4 = codes[2 * k * n + i], got5 = codes[(2 * k + 1) * n + i];
        if ((got4 != e4m3 || got5 != e5m2) && ++wrong <= 8)
          UNSCOPED_INFO("N " << (vector ? kN : 1) << " x " << to_float(values[i]) << " scale " << scales[k] << ": e4m3 "
                             << int{got4} << " (expected " << int{e4m3} << "), e5m2 " << int{got5} << " (expected "
                             << int{e5m2} << ")");
        compared += 2;
      }
    CHECK(wrong == 0);
  }
  return compared;
}

}  // namespace

TEST_CASE("append: the fp8 store equals fp32's division by the scale: every bf16 and fp16 value, fp32 samples",
          "[gpu][append][fp8]") {
  const std::vector<float> scales = fp8_store_scales(64, 2026);
  std::vector<__nv_bfloat16> b = every_16bit_value<__nv_bfloat16>();
  std::vector<__half> h = every_16bit_value<__half>();
  // (NaN codes are not compared)
  b.erase(std::remove_if(b.begin(), b.end(), [](__nv_bfloat16 x) { return std::isnan(to_float(x)); }), b.end());
  h.erase(std::remove_if(h.begin(), h.end(), [](__half x) { return std::isnan(to_float(x)); }), h.end());
  b.resize(b.size() / 8 * 8);
  h.resize(h.size() / 8 * 8);
  const std::vector<float> f = fp8_store_values(1u << 17, 7);
  size_t compared = check_fp8_stores(b, scales);
  compared += check_fp8_stores(h, scales);
  compared += check_fp8_stores(f, scales);
  INFO(compared << " codes compared");
  CHECK(compared > 0);
}

TEMPLATE_TEST_CASE("append into NVFP4 caches: head dims, styles, partial rotary, norms, layouts, both paths",
                   "[gpu][append][nvfp4]", __nv_bfloat16, __half, float) {
  // Every value byte and block-scale byte against the reference's blocks of the same values in T, given the
  // GPU's own quotients and reciprocals (gpu_nvfp4_oracle); with no key output, within one step.
  using T = TestType;
  const int64_t dims[] = {64, 128, 256, 96};
  uint64_t seed = 1000;
  for (const int64_t D : dims)
    for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved})
      for (const int r : {0, 1, 2})
        for (const bool prefill : {false, true}) {
          AppendConfig c;
          c.seed = seed++;
          c.head_dim = D;
          c.style = style;
          c.rotary_dim = r == 0 ? 0 : r == 1 ? 32 : D / 2 / 32 * 32;  // full, one pair of blocks, about half
          if (c.rotary_dim == D) c.rotary_dim = 0;
          // Decode-size calls take the few-token kernel, prefill-size ones the tile kernel.
          c.tokens = prefill ? detail::kAppendTokenMaxTokens + 37 + static_cast<int64_t>(c.seed % 50)
                             : 1 + static_cast<int64_t>(c.seed % 40);
          c.heads = 1 + static_cast<int64_t>(c.seed % 3);
          c.query_heads = c.seed % 5 == 0 ? 0 : c.heads * (1 + static_cast<int64_t>(c.seed % 4));
          c.key = static_cast<KeyWrite>(c.seed % 3);
          c.query_out = c.seed % 4 == 1;
          c.query_fp8 = c.seed % 4 == 3;  // fp8 q beside NVFP4 caches (the instance's run-time branch)
          c.q_norm = c.seed % 4 == 2;
          c.k_norm = c.seed % 3 == 1;
          c.plus_one = c.seed % 5 == 2;
          c.table_f32 = c.seed % 3 != 1;
          c.fused_qkv = c.seed % 7 == 3;
          c.k_cache = c.seed % 2 ? CacheKind::kHND : CacheKind::kNHD;
          c.v_cache = (c.seed / 2) % 2 ? CacheKind::kHND : CacheKind::kNHD;
          c.page_size = c.seed % 3 == 0 ? 16 : c.seed % 3 == 1 ? 1 : 8;  // (1: a flat pool)
          c.k_pad = c.seed % 4 == 0 ? 8 : 0;
          c.v_pad = c.seed % 5 == 0 ? 16 : 0;
          c.sf_pad = c.seed % 3 == 2 ? 3 : 0;
          c.slots = kPatterns[c.seed % 6];
          c.bad_positions = c.seed % 7 == 5;
          c.scales = static_cast<Scales>(c.seed % 3);
          run_case<T, kvrope::nvfp4_e2m1x2>(c, c.seed % 2 == 0);
        }
  // Global scales small enough that block scales saturate (448) and large enough that they underflow to 0.
  for (const float magnitude : {0.0005f, 1.0e-7f, 1.0e4f}) {
    AppendConfig c;
    c.seed = seed++;
    c.head_dim = 128;
    c.tokens = 17;
    c.scales = Scales::kHead;
    c.scale_magnitude = magnitude;
    run_case<T, kvrope::nvfp4_e2m1x2>(c, true);
  }
}

TEST_CASE("append: NVFP4 caches refuse what their store cannot take, and write nothing", "[gpu][append][nvfp4]") {
  AppendConfig c;
  c.tokens = 9;
  c.heads = 2;
  c.query_heads = 4;
  c.head_dim = 128;
  struct Case {
    int64_t head_dim, rotary_dim, offset;
    const char* field;
  };
  const Case cases[] = {{80, 0, 0, "head_dim"}, {128, 48, 0, "rotary_dim"}, {128, 0, 1, "query"}};
  for (const Case& k : cases) {
    c.head_dim = k.head_dim;
    c.rotary_dim = k.rotary_dim;
    c.offset = k.offset;
    AppendProblem<__nv_bfloat16, kvrope::nvfp4_e2m1x2, int64_t> p(c);
    p.poison_outputs();
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    const Status st = p.launch();
    INFO(k.field << ": " << to_string(st.code) << " " << (st.field ? st.field : "-"));
    CHECK(st.code == StatusCode::kUnsupportedByCacheFormat);
    CHECK(std::string(st.field ? st.field : "") == k.field);
    KVROPE_CUDA_REQUIRE(cudaGetLastError());
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(all_poisoned(p.kc.to_host()));
    CHECK(all_poisoned(p.ks.to_host()));
    CHECK(all_poisoned(p.k_out.to_host()));
    CHECK(p.flag.to_host()[0] == 0);
  }
}

TEST_CASE("append: NHD and HND pages, a flat pool, a contiguous per-sequence cache, caches of different strides",
          "[gpu][append][cache]") {
  struct Layout {
    CacheKind k, v;
    int64_t k_pad, v_pad, page_size;
    bool contiguous;
  };
  const Layout layouts[] = {
      {CacheKind::kNHD, CacheKind::kNHD, 0, 0, 16, false}, {CacheKind::kHND, CacheKind::kHND, 0, 0, 16, false},
      {CacheKind::kNHD, CacheKind::kNHD, 0, 0, 1, false},   // a flat pool [slots, H, D]
      {CacheKind::kNHD, CacheKind::kNHD, 0, 0, 0, true},    // [B, S_max, H, D]
      {CacheKind::kHND, CacheKind::kHND, 0, 0, 0, true},    // [B, H, S_max, D]
      {CacheKind::kNHD, CacheKind::kHND, 0, 8, 32, false},  // k and v of different layouts and strides
      {CacheKind::kHND, CacheKind::kNHD, 16, 0, 8, false}, {CacheKind::kNHD, CacheKind::kNHD, 3, 5, 4, false},
  };
  uint64_t seed = 200;
  for (const Layout& l : layouts)
    for (const SlotPattern slots : {SlotPattern::kSequences, SlotPattern::kRun, SlotPattern::kRepeats}) {
      AppendConfig c;
      c.seed = seed++;
      c.tokens = 45;
      c.heads = 3;
      c.query_heads = 6;
      c.head_dim = 128;
      c.k_cache = l.k;
      c.v_cache = l.v;
      c.k_pad = l.k_pad;
      c.v_pad = l.v_pad;
      c.page_size = l.page_size;
      c.contiguous = l.contiguous;
      c.slots = l.contiguous && slots == SlotPattern::kRepeats ? SlotPattern::kSequences : slots;
      run_case<__nv_bfloat16, __nv_bfloat16>(c, true);
      c.scales = Scales::kTensor;
      run_case<__half, __nv_fp8_e4m3>(c, false);
    }
}

TEMPLATE_TEST_CASE("append on q, k, v as views of one fused qkv buffer", "[gpu][append][fused]", __nv_bfloat16, __half,
                   float) {
  struct Outputs {
    bool query_out;
    KeyWrite key;
  };
  // vLLM's in-place call; q in place and key_out; both outputs elsewhere with k not written back.
  const Outputs outputs[] = {{false, KeyWrite::kInPlace}, {false, KeyWrite::kOut}, {true, KeyWrite::kNone}};
  uint64_t seed = 300;
  for (const Outputs& o : outputs)
    for (const int64_t groups : {int64_t{4}, int64_t{1}})  // Hq = 4 H (grouped queries), Hq = H
      for (const int64_t token_pad : {int64_t{0}, int64_t{8}}) {
        AppendConfig c;
        c.seed = seed++;
        c.fused_qkv = true;
        c.tokens = 27;
        c.heads = 2;
        c.query_heads = 2 * groups;
        c.head_dim = c.seed % 2 ? 128 : 64;
        c.token_pad = token_pad;
        c.query_out = o.query_out;
        c.key = o.key;
        c.q_norm = c.k_norm = c.seed % 3 == 0;
        c.slots = kPatterns[c.seed % 6];
        run_case<TestType, TestType>(c, true);
        c.scales = Scales::kHead;
        run_case<TestType, __nv_fp8_e5m2>(c, false);
      }
}

TEST_CASE("append: padding, repeated and out-of-range slots, out-of-range positions, and the error flag",
          "[gpu][append][slots]") {
  uint64_t seed = 400;
  for (const SlotPattern slots : {SlotPattern::kPadding, SlotPattern::kRepeats, SlotPattern::kOutOfRange})
    for (const bool bad_positions : {false, true})
      for (const int64_t tokens : {int64_t{2}, int64_t{37}, int64_t{256}, int64_t{1024}, int64_t{1025}}) {
        AppendConfig c;
        c.seed = seed++;
        c.tokens = tokens;
        c.heads = 2;
        c.query_heads = 4;
        c.head_dim = 64;
        c.page_size = 16;
        c.slots = slots;
        c.bad_positions = bad_positions;
        c.key = static_cast<KeyWrite>(c.seed % 3);
        run_case<__nv_bfloat16, __nv_bfloat16>(c, c.seed % 2 == 0);
        c.scales = Scales::kTensor;
        run_case<float, __nv_fp8_e4m3>(c, c.seed % 2 == 1);
      }

  // A hand-made case: T = 6, 2 pages of 4 slots, positions [0, 6).
  //   token 0: slot 5        1: slot 5 (wins over 0)   2: slot -1 (padding: q, k written, no row)
  //   3: slot 8 (out of range: bit 4, q, k written)     4: slot 2, position 99 (bit 2, writes nothing)
  //   5: slot 2 (the last valid token naming it)
  AppendConfig c;
  c.tokens = 6;
  c.heads = 2;
  c.query_heads = 2;
  c.head_dim = 64;
  c.page_size = 4;
  c.slots = SlotPattern::kPermutation;
  AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> p(c);
  const std::vector<int64_t> slot_list{5, 5, -1, 8, 2, 2};
  const std::vector<int64_t> positions{0, 1, 2, 3, 99, 5};
  p.plan.slots = slot_list;
  p.plan.num_pages = 2;
  p.plan.max_position = 6;
  p.host_pos = positions;
  KVROPE_CUDA_REQUIRE(cudaMemcpy(p.slots.get(), slot_list.data(), 6 * sizeof(int64_t), cudaMemcpyHostToDevice));
  KVROPE_CUDA_REQUIRE(cudaMemcpy(p.pos.get(), positions.data(), 6 * sizeof(int64_t), cudaMemcpyHostToDevice));
  p.params = p.make_params();
  p.run_and_check();
  const int flag = p.flag.to_host()[0];
  CHECK((flag & kErrorSlotOutOfRange) != 0);
  CHECK((flag & kErrorPositionIdOutOfRange) != 0);
  const Status s = read_error_flag(p.flag.get());
  CHECK(s.code == StatusCode::kPositionIdOutOfRange);  // the position bit is reported first
}

TEMPLATE_TEST_CASE("append: misaligned views take the scalar path and give the same results", "[gpu][append][align]",
                   __nv_bfloat16, __half, float) {
  AppendConfig c;
  c.tokens = 9;
  c.heads = 2;
  c.query_heads = 4;
  c.head_dim = 128;
  c.query_out = true;
  AppendProblem<TestType, TestType, int64_t> aligned(c);
  AppendPlan plan;
  REQUIRE((AppendLaunchers<TestType, TestType, int64_t>::plan(aligned.params, &plan).ok()));
  CHECK(plan.launched);
  CHECK(plan.vec_width == static_cast<int>(16 / sizeof(TestType)));
  aligned.run_and_check();

  uint64_t seed = 500;
  for (const int64_t offset : {int64_t{1}, int64_t{0}})
    for (const int64_t token_pad : {int64_t{0}, int64_t{3}}) {
      if (offset == 0 && token_pad == 0) continue;
      for (const bool fp8 : {false, true}) {
        c.seed = seed++;
        c.offset = offset;        // every pointer one element off
        c.token_pad = token_pad;  // odd token strides
        c.q_norm = c.k_norm = c.seed % 2 == 0;
        c.key = static_cast<KeyWrite>(c.seed % 3);
        c.slots = kPatterns[c.seed % 6];
        if (fp8) {
          c.scales = Scales::kHead;
          AppendProblem<TestType, __nv_fp8_e4m3, int32_t> p(c);
          REQUIRE((AppendLaunchers<TestType, __nv_fp8_e4m3, int32_t>::plan(p.params, &plan).ok()));
          CHECK(plan.vec_width == 1);
          p.run_and_check();
        } else {
          c.scales = Scales::kNone;
          AppendProblem<TestType, TestType, int32_t> p(c);
          REQUIRE((AppendLaunchers<TestType, TestType, int32_t>::plan(p.params, &plan).ok()));
          CHECK(plan.vec_width == 1);
          p.run_and_check();
        }
      }
    }
}

TEMPLATE_TEST_CASE("append: q out in fp8 e4m3, with and without a scale, on both paths", "[gpu][append][fp8q]",
                   __nv_bfloat16, __half, float) {
  uint64_t seed = 800;
  for (const int64_t tokens : {int64_t{1}, int64_t{37}, int64_t{detail::kAppendTokenMaxTokens + 300}})
    for (const Scales scales : {Scales::kNone, Scales::kTensor}) {
      AppendConfig c;
      c.tokens = tokens;
      c.heads = 2;
      c.query_heads = 6;
      c.head_dim = seed % 2 ? 128 : 64;
      c.rotary_dim = seed % 3 == 0 ? c.head_dim / 2 : 0;
      c.style = seed % 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
      c.query_fp8 = true;
      c.scales = scales;
      c.scale_magnitude = seed % 4 == 0 ? 0.003f : 1.0f;  // saturation too
      c.q_norm = c.k_norm = seed % 2 == 0;
      c.fused_qkv = seed % 3 == 1;
      c.slots = kPatterns[seed % 6];
      c.seed = seed++;
      run_case<TestType, TestType>(c, true);
      run_case<TestType, __nv_fp8_e4m3>(c, false);
    }
}

TEST_CASE("append: fp8 q is exactly the scaled rounding of the q the call writes in T", "[gpu][append][fp8q]") {
  // The same call twice, q out in T and in fp8: each fp8 code is quantize(q_T, scale), bit for bit.
  for (const int64_t tokens : {int64_t{3}, int64_t{detail::kAppendTokenMaxTokens + 17}}) {
    AppendConfig c;
    c.tokens = tokens;
    c.heads = 4;
    c.query_heads = 8;
    c.head_dim = 128;
    c.rotary_dim = 64;
    c.q_norm = true;
    c.query_out = true;
    c.seed = 900 + tokens;
    AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> t(c);
    t.run_and_check();
    const std::vector<__nv_bfloat16> q_t = t.q_out.to_host();
    c.query_out = false;
    c.query_fp8 = true;
    c.scales = Scales::kTensor;
    AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> f(c);  // the same seed: the same inputs
    f.run_and_check();
    const std::vector<__nv_fp8_e4m3> q_8 = f.q_out8.to_host();
    REQUIRE(q_t.size() == q_8.size());
    const float scale = f.host_q_scale.at(0);
    int64_t bad = 0;
    for (size_t i = 0; i < q_t.size(); ++i)
      bad += reference::fp8_bits(q_8[i]) != reference::quantize<__nv_fp8_e4m3>(q_t[i], scale);
    CHECK(bad == 0);
  }
}

TEST_CASE("append: decode (T = 1), T = 1024, a prefill of 4096 tokens, an empty call", "[gpu][append][sizes]") {
  AppendConfig c;
  c.heads = 8;
  c.query_heads = 32;
  c.head_dim = 128;
  c.page_size = 16;
  c.tokens = 1;  // decode: one token of one sequence
  c.seed = 600;
  c.scales = Scales::kTensor;
  run_case<__nv_bfloat16, __nv_fp8_e4m3>(c, true);
  c.scales = Scales::kNone;
  c.key = KeyWrite::kInPlace;
  run_case<__nv_bfloat16, __nv_bfloat16>(c, false);

  c.scales = Scales::kTensor;
  run_case<__nv_bfloat16, kvrope::nvfp4_e2m1x2>(c, true);  // NVFP4 decode: the few-token kernel
  c.scales = Scales::kNone;

  c.tokens = 1024;  // a batch of sequences
  c.key = KeyWrite::kOut;
  c.q_norm = c.k_norm = true;
  c.seed = 601;
  run_case<__nv_bfloat16, __nv_bfloat16>(c, true);
  run_case<__half, kvrope::nvfp4_e2m1x2>(c, false);
  c.q_norm = c.k_norm = false;
  c.style = RotaryStyle::kInterleaved;
  c.rotary_dim = 64;
  c.scales = Scales::kHead;
  c.seed = 602;
  run_case<__half, __nv_fp8_e5m2>(c, false);

  c = AppendConfig{};  // a prefill: one sequence of 4096 tokens
  c.tokens = 4096;
  c.heads = 8;
  c.query_heads = 32;
  c.head_dim = 128;
  c.page_size = 16;
  c.slots = SlotPattern::kRun;
  c.seed = 603;
  run_case<__nv_bfloat16, __nv_bfloat16>(c, true);
  c.scales = Scales::kTensor;
  run_case<__nv_bfloat16, kvrope::nvfp4_e2m1x2>(c, true);  // an NVFP4 prefill: the tile kernel

  // No token: a valid call that launches nothing and writes nothing.
  c = AppendConfig{};
  c.tokens = 0;
  AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> empty(c);
  AppendPlan plan;
  REQUIRE((AppendLaunchers<__nv_bfloat16, __nv_bfloat16, int64_t>::plan(empty.params, &plan).ok()));
  CHECK_FALSE(plan.launched);
  empty.run_and_check();
  CHECK(all_poisoned(empty.kc.to_host()));
  CHECK(all_poisoned(empty.vc.to_host()));
}

TEST_CASE("append: a launch captured in a CUDA graph and replayed, on new inputs too", "[gpu][append][graph]") {
  for (const bool fp8 : {false, true}) {
    AppendConfig c;
    c.tokens = 77;
    c.heads = 4;
    c.query_heads = 16;
    c.head_dim = 128;
    c.query_out = true;               // outputs elsewhere: a replay does not depend on the previous one
    c.slots = SlotPattern::kPadding;  // padding slots, as a captured decode step has
    c.q_norm = c.k_norm = true;
    c.seed = fp8 ? 700 : 701;
    auto run = [&](auto& p) {
      cudaStream_t stream = nullptr;
      KVROPE_CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      p.poison_outputs();
      KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
      auto before = p.snapshot();
      cudaGraph_t graph = nullptr;
      KVROPE_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const Status st = p.launch(stream);
      KVROPE_CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
      REQUIRE(st.ok());
      cudaGraphExec_t exec = nullptr;
      KVROPE_CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
      // Nothing ran during the capture: the outputs are still poisoned.
      CHECK(all_poisoned(p.k_out.to_host()));
      CHECK(all_poisoned(p.kc.to_host()));
      KVROPE_CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
      KVROPE_CUDA_REQUIRE(cudaGetLastError());
      KVROPE_CUDA_REQUIRE(cudaStreamSynchronize(stream));
      p.check(before);
      // The replay reads the buffers as they are then: new inputs, outputs poisoned again.
      p.fill_inputs(c.seed * 77);
      p.poison_outputs();
      KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
      before = p.snapshot();
      KVROPE_CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
      KVROPE_CUDA_REQUIRE(cudaGetLastError());
      KVROPE_CUDA_REQUIRE(cudaStreamSynchronize(stream));
      p.check(before);
      KVROPE_CUDA_REQUIRE(cudaGraphExecDestroy(exec));
      KVROPE_CUDA_REQUIRE(cudaGraphDestroy(graph));
      KVROPE_CUDA_REQUIRE(cudaStreamDestroy(stream));
    };
    if (fp8) {
      c.scales = Scales::kHead;
      AppendProblem<__nv_bfloat16, __nv_fp8_e4m3, int32_t> p(c);
      run(p);
    } else {
      AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> p(c);
      run(p);
    }
  }
}

namespace {
// A slow producer of the append's inputs, as the QKV projection before it: one block copies `n` elements
// from `src` to `dst`, after letting the next kernel start (a programmatic dependent launch of it waits
// for these writes before reading them).
template <typename T>
__global__ void produce_slowly(const T* src, T* dst, int64_t n) {
  kvrope::detail::allow_dependent_grids();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
}  // namespace

TEST_CASE("append with enable_pdl reads what the kernel before it writes, streamed and in a graph",
          "[gpu][append][pdl]") {
  for (const int64_t tokens : {int64_t{1}, int64_t{32}, int64_t{300}})  // the few-token and the tile path
    for (const bool graph : {false, true}) {
      AppendConfig c;
      c.tokens = tokens;
      c.heads = 4;
      c.query_heads = 16;
      c.head_dim = 128;
      c.fused_qkv = true;
      c.q_norm = c.k_norm = true;
      c.pdl = true;
      c.seed = 900 + tokens + graph;
      AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> p(c);
      INFO(c.describe() << (graph ? " (graph)" : ""));
      cudaStream_t stream = nullptr;
      KVROPE_CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      // The inputs go to a staging buffer; q, k, v are NaN until the producer copies them back.
      const size_t bytes = p.qkv.size() * sizeof(__nv_bfloat16);
      DeviceBuffer<__nv_bfloat16> staging(p.qkv.size());
      KVROPE_CUDA_REQUIRE(cudaMemcpy(staging.get(), p.qkv.get(), bytes, cudaMemcpyDeviceToDevice));
      p.poison_outputs();
      KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
      auto before = p.snapshot();
      KVROPE_CUDA_REQUIRE(cudaMemset(p.qkv.get(), 0xFF, bytes));
      Status st;
      auto step = [&] {
        produce_slowly<<<1, 32, 0, stream>>>(staging.get(), p.qkv.get(), static_cast<int64_t>(p.qkv.size()));
        st = p.launch(stream);
      };
      if (graph) {
        cudaGraph_t g = nullptr;
        cudaGraphExec_t exec = nullptr;
        KVROPE_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        step();
        KVROPE_CUDA_REQUIRE(cudaStreamEndCapture(stream, &g));
        REQUIRE(st.ok());
        KVROPE_CUDA_REQUIRE(cudaGraphInstantiate(&exec, g, 0));
        KVROPE_CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
        KVROPE_CUDA_REQUIRE(cudaStreamSynchronize(stream));
        KVROPE_CUDA_REQUIRE(cudaGraphExecDestroy(exec));
        KVROPE_CUDA_REQUIRE(cudaGraphDestroy(g));
      } else {
        step();
        REQUIRE(st.ok());
        KVROPE_CUDA_REQUIRE(cudaGetLastError());
        KVROPE_CUDA_REQUIRE(cudaStreamSynchronize(stream));
      }
      p.check(before);
      KVROPE_CUDA_REQUIRE(cudaStreamDestroy(stream));
    }
}

TEST_CASE("append: an invalid call launches nothing and writes nothing", "[gpu][append]") {
  AppendConfig c;
  c.tokens = 8;
  c.heads = 2;
  c.query_heads = 4;
  c.head_dim = 64;
  AppendProblem<__nv_bfloat16, __nv_bfloat16, int64_t> p(c);
  p.poison_outputs();
  KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<__nv_bfloat16> q_before = p.q.to_host();
  p.params.key_in_place = true;  // with key_out: the two exclude each other
  const Status st = p.launch();
  CHECK(st.code == StatusCode::kConflictingFields);
  KVROPE_CUDA_REQUIRE(cudaGetLastError());
  KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<__nv_bfloat16> q_after = p.q.to_host();
  CHECK(std::memcmp(q_before.data(), q_after.data(), q_before.size() * sizeof(__nv_bfloat16)) == 0);
  CHECK(all_poisoned(p.kc.to_host()));
  CHECK(all_poisoned(p.vc.to_host()));
  CHECK(all_poisoned(p.k_out.to_host()));
  CHECK(p.flag.to_host()[0] == 0);
}
