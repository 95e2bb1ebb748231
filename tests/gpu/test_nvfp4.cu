// GPU tests of the NVFP4 building block (kvrope/detail/common/nvfp4.cuh) run in kernels, against the float64
// reference (kvrope/reference/cpu_nvfp4.hpp): the e2m1 rounding on dense sweeps, and random blocks quantized
// by one lane and by two lanes (8 elements each, amax combined with one shuffle).
//
// On the GPU the block scale's division and reciprocal are FlashInfer's fast-math instructions
// (div.approx.ftz.f32, rcp.approx.ftz.f32), which the reference cannot reproduce bit for bit: the test checks
// that each block's quotient is within 2 units of the correctly rounded one and its reciprocal within 1 (the
// PTX ISA's bounds), and that the block equals the reference given the GPU's quotient and reciprocal. It
// reports how many blocks differ from the reference with correctly rounded ones. Built for sm_90 this is the
// software e2m1 path; for sm_100a, the hardware conversion's.
#include <kvrope/detail/common/nvfp4.cuh>
#include <kvrope/reference/cpu_nvfp4.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "support/catch.hpp"
#include "support/cuda_require.hpp"
#include "support/nvfp4_cases.hpp"

using namespace kvrope;

namespace {

struct BlockOut {
  float quotient, inv;
  uint32_t scale;
  uint32_t packed[2];
};

__global__ void e2m1_kernel(const float* x, int64_t n, uint8_t* single, uint8_t* pairs) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n / 2; i += int64_t{gridDim.x} * blockDim.x) {
    single[2 * i] = static_cast<uint8_t>(detail::nvfp4_e2m1(x[2 * i]));
    single[2 * i + 1] = static_cast<uint8_t>(detail::nvfp4_e2m1(x[2 * i + 1]));
    pairs[i] = static_cast<uint8_t>(detail::nvfp4_e2m1_pair(x[2 * i], x[2 * i + 1]));
  }
}

// One lane a block: the scale's intermediates (nvfp4_block_scale) and the whole rule (nvfp4_quantize_block).
__global__ void one_lane_kernel(const float* x, const float* g, int n, BlockOut* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n) return;
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = x[16 * b + i];
  const detail::Nvfp4Scale s = detail::nvfp4_block_scale(detail::nvfp4_amax<16>(v), g[b]);
  const detail::Nvfp4Block q = detail::nvfp4_quantize_block(v, g[b]);
  out[b] = BlockOut{s.quotient, s.inv, q.scale, {q.packed[0], q.packed[1]}};
}

// Two lanes a block, 8 elements each (lanes 2b and 2b + 1): amax over the pair with one shuffle, each lane
// its 4-byte word, the even lane the scale byte. Every lane of a warp takes part in the shuffle.
__global__ void two_lane_kernel(const float* x, const float* g, int n, uint8_t* scales, uint32_t* words) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x, b = t / 2, half = t % 2;
  const bool in = b < n;
  float v[8];
  for (int i = 0; i < 8; ++i) v[i] = in ? x[16 * b + 8 * half + i] : 0.0f;
  const float amax = detail::nvfp4_amax_pair(detail::nvfp4_amax<8>(v));
  if (!in) return;
  const detail::Nvfp4Scale s = detail::nvfp4_block_scale(amax, g[b]);
  words[2 * b + half] = detail::nvfp4_pack8(v, s.inv);
  if (half == 0) scales[b] = static_cast<uint8_t>(s.code);
}

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  KVROPE_CUDA_REQUIRE(cudaMalloc(&d, h.size() * sizeof(T)));
  KVROPE_CUDA_REQUIRE(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  KVROPE_CUDA_REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
// Steps between two positive fp32 values.
int64_t steps(float a, float b) { return std::llabs(int64_t{bits(a)} - int64_t{bits(b)}); }

constexpr float kMinNormal = 1.17549435e-38f;

}  // namespace

TEST_CASE("nvfp4_e2m1 and nvfp4_e2m1_pair on the GPU round as the definition", "[gpu][nvfp4]") {
  std::vector<float> x;
  const float points[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
  for (float p : points)
    for (float s : {1.0f, -1.0f}) {
      float up = s * p, down = s * p;
      x.push_back(s * p);
      for (int i = 0; i < 65536; ++i) {
        up = std::nextafter(up, INFINITY), down = std::nextafter(down, -INFINITY);
        x.push_back(up), x.push_back(down);
      }
    }
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 1024) x.push_back(from_bits(static_cast<uint32_t>(b)));
  std::mt19937 rng(13);
  for (int i = 0; i < 1000000; ++i) x.push_back(from_bits(rng()));
  if (x.size() % 2) x.push_back(0.0f);
  const int64_t n = static_cast<int64_t>(x.size());
  float* dx = to_device(x);
  uint8_t *d_single = nullptr, *d_pairs = nullptr;
  KVROPE_CUDA_REQUIRE(cudaMalloc(&d_single, n));
  KVROPE_CUDA_REQUIRE(cudaMalloc(&d_pairs, n / 2));
  e2m1_kernel<<<1024, 256>>>(dx, n, d_single, d_pairs);
  KVROPE_CUDA_REQUIRE(cudaGetLastError());
  const std::vector<uint8_t> single = to_host(d_single, n), pairs = to_host(d_pairs, n / 2);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t want = reference::e2m1_encode(x[i]);
    const uint8_t pair = static_cast<uint8_t>(pairs[i / 2] >> (4 * (i % 2))) & 0xF;
    if ((single[i] != want || pair != want) && ++mismatches <= 10) {
      INFO("x = " << x[i] << " (bits 0x" << std::hex << bits(x[i]) << ") single " << int(single[i]) << " pair "
                  << int(pair) << " definition " << int(want));
      CHECK(false);
    }
  }
  CHECK(mismatches == 0);
  cudaFree(dx), cudaFree(d_single), cudaFree(d_pairs);
}

TEST_CASE("nvfp4 blocks on the GPU: one lane and two lanes, against the reference", "[gpu][nvfp4]") {
  const std::vector<testing::Nvfp4Case> cases = testing::nvfp4_random_cases(99, 400000, /*extremes=*/false);
  const int n = static_cast<int>(cases.size());
  std::vector<float> hx(16 * size_t(n)), hg(n);
  for (int b = 0; b < n; ++b) {
    std::memcpy(&hx[16 * size_t(b)], cases[b].x, sizeof(cases[b].x));
    hg[b] = cases[b].g;
  }
  float *dx = to_device(hx), *dg = to_device(hg);
  BlockOut* d_one = nullptr;
  uint8_t* d_scales = nullptr;
  uint32_t* d_words = nullptr;
  KVROPE_CUDA_REQUIRE(cudaMalloc(&d_one, n * sizeof(BlockOut)));
  KVROPE_CUDA_REQUIRE(cudaMalloc(&d_scales, n));
  KVROPE_CUDA_REQUIRE(cudaMalloc(&d_words, 2 * size_t(n) * sizeof(uint32_t)));
  one_lane_kernel<<<(n + 255) / 256, 256>>>(dx, dg, n, d_one);
  KVROPE_CUDA_REQUIRE(cudaGetLastError());
  two_lane_kernel<<<(2 * n + 255) / 256, 256>>>(dx, dg, n, d_scales, d_words);
  KVROPE_CUDA_REQUIRE(cudaGetLastError());
  const std::vector<BlockOut> one = to_host(d_one, n);
  const std::vector<uint8_t> scales = to_host(d_scales, n);
  const std::vector<uint32_t> words = to_host(d_words, 2 * size_t(n));

  int64_t failures = 0, differ_from_rounded = 0, quotients_off = 0, inverses_off = 0;
  for (int b = 0; b < n; ++b) {
    const testing::Nvfp4Case& c = cases[b];
    const BlockOut& o = one[b];
    uint8_t got[9] = {static_cast<uint8_t>(o.scale)};
    std::memcpy(got + 1, o.packed, 8);
    // The two layouts agree.
    bool ok = scales[b] == o.scale && words[2 * b] == o.packed[0] && words[2 * b + 1] == o.packed[1];
    // The quotient within 2 steps of the correctly rounded one, the reciprocal (of the GPU's scale) within 1.
    const double amax = reference::nvfp4_amax(c.x);
    const float q = reference::nvfp4_quotient(amax, c.g);
    if (q >= kMinNormal && !std::isinf(q)) {
      ok = ok && steps(o.quotient, q) <= 2;
      quotients_off += o.quotient != q;
    } else {
      ok = ok && (q == 0.0f ? o.quotient < 2 * kMinNormal : bits(o.quotient) == bits(q));
    }
    const float r = reference::nvfp4_inverse(amax, reference::fp8_decode(got[0], reference::Fp8Format::kE4M3), c.g);
    if (r >= kMinNormal && !std::isinf(r)) {
      ok = ok && steps(o.inv, r) <= 1;
      inverses_off += o.inv != r;
    } else {
      ok = ok && (r == 0.0f ? o.inv < 2 * kMinNormal : bits(o.inv) == bits(r));
    }
    // The block, given the GPU's quotient and reciprocal, is the reference's exactly.
    const reference::Nvfp4Approx gpu{o.quotient, o.inv};
    const reference::Nvfp4Block given = reference::nvfp4_quantize_block(c.x, c.g, &gpu);
    ok = ok && given.scale == got[0] && std::memcmp(given.packed, got + 1, 8) == 0;
    const reference::Nvfp4Block rounded = reference::nvfp4_quantize_block(c.x, c.g);
    differ_from_rounded += rounded.scale != got[0] || std::memcmp(rounded.packed, got + 1, 8) != 0;
    if (!ok && ++failures <= 5) {
      std::ostringstream in;
      for (float v : c.x) in << v << " ";
      INFO("block " << b << " (" << testing::kNvfp4CaseKindNames[c.kind] << "), g = " << c.g << ", x = " << in.str()
                    << "\nGPU quotient " << o.quotient << " (reference " << q << "), inverse " << o.inv
                    << " (reference " << r << "), scale 0x" << std::hex << int(got[0]) << " (two lanes 0x"
                    << int(scales[b]) << ", given the GPU's quotient 0x" << int(given.scale) << ")");
      CHECK(ok);
    }
  }
  CHECK(failures == 0);
  std::printf(
      "nvfp4: %d blocks; quotients not correctly rounded: %lld, reciprocals: %lld; blocks that differ from the "
      "reference with correctly rounded ones: %lld\n",
      n, static_cast<long long>(quotients_off), static_cast<long long>(inverses_off),
      static_cast<long long>(differ_from_rounded));
  cudaFree(dx), cudaFree(dg), cudaFree(d_one), cudaFree(d_scales), cudaFree(d_words);
}
