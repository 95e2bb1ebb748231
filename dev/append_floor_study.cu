// append_floor_study: the least a serve-suite call takes when the kernel does nothing but the call's memory work
// (docs/performance-log.md, "The serving forward: what its memory work alone takes"). The serve suites' bf16 cases
// (bench/support/append_cases.hpp: NHD pages, Hq 32 and 64, H 8, D 128, rotate-half; the MLA cases with bf16
// latent rows, Hq 16 and 128, L 512, R 64, interleaved), moved by a thread a 16-byte unit (rotate-half: a unit
// pair) of one row, a row of blocks a token (no division before the first load): it loads the token's position
// and slot and its row's units at once, then the table's cos and sin at the position, then stores q rotated in
// place and k rotated and v (MLA: kv_c, then k_pe rotated) to the slot's cache row. No validation, no error flag, no
// planner, no bounds beyond the grid: what the protocol leaves for the two round trips (position, then table row) and
// the stores, beside the floor and empty kernel the serve suites use. Timed by kvrope_bench's clock (bench/support),
// the suites' cases and tokens (append_tokens).
//   append_floor_study [--iters=N] [--cases_csv=serve-decode|serve-prefill]... [--clock=cupti|events]
//                      [--flush=write|read]
#include <cuda_bf16.h>

#include <cstdio>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "append_cases.hpp"
#include "calibration.cuh"
#include "check.cuh"
#include "cupti_clock.cuh"
#include "cupti_records.cuh"
#include "device.cuh"
#include "floor_study.cuh"
#include "stats.hpp"

namespace {

using namespace kvrope_bench;

enum class Rotate : int { kNone, kHalf, kInterleaved };

// A part of every token's work: `heads` rows of `dim` bf16 at src + token * src_token + head * src_head, rotated
// or not, written in place (dst null) or to dst + slot * dst_slot + head * dst_head.
struct Part {
  const __nv_bfloat16* src = nullptr;
  int64_t src_token = 0, src_head = 0;
  __nv_bfloat16* dst = nullptr;
  int64_t dst_slot = 0, dst_head = 0;
  int heads = 0, dim = 0;
  Rotate rotate = Rotate::kNone;
  int unit_shift = 0, items = 0;  // log2 of a row's units (set_units), heads * units
  // A thread's 16-byte units of one row: dim / 8, a rotate-half pair counting once (a power of two here).
  void set_units() {
    const int units = rotate == Rotate::kHalf ? dim / 16 : dim / 8;
    while ((1 << unit_shift) < units) ++unit_shift;
    items = heads * units;
  }
};

constexpr int kParts = 3;  // GQA: q, k, v heads; MLA: q_pe heads, kv_c, k_pe

struct Bare {
  Part part[kParts];
  int items_per_token = 0;  // the parts' items: a block row of the grid (blockIdx.y: the token)
  int rotary = 0;           // R: a table row is R fp32, cos then sin
  const float* table = nullptr;
  const int64_t* positions = nullptr;
  const int64_t* slots = nullptr;
};

__device__ __forceinline__ void unpack(uint4 v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(h[i]);
    f[2 * i] = x.x, f[2 * i + 1] = x.y;
  }
}
__device__ __forceinline__ uint4 pack(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}
__device__ __forceinline__ void load_floats(const float* p, float (&f)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

__global__ void __launch_bounds__(128) bare_append(const Bare a) {
  const int64_t token = blockIdx.y;
  const int64_t position = a.positions[token], slot = a.slots[token];  // the chain's heads, first
  int rest = static_cast<int>(blockIdx.x * 128 + threadIdx.x), k = 0;
  if (rest >= a.items_per_token) return;
  while (k + 1 < kParts && rest >= a.part[k].items) rest -= a.part[k++].items;
  const Part& p = a.part[k];
  const int head = rest >> p.unit_shift, u = rest & ((1 << p.unit_shift) - 1);
  const __nv_bfloat16* src = p.src + token * p.src_token + head * p.src_head;
  __nv_bfloat16* dst =
      p.dst == nullptr ? const_cast<__nv_bfloat16*>(src) : p.dst + slot * p.dst_slot + head * p.dst_head;
  const int half = p.dim / 2;
  if (p.rotate == Rotate::kHalf) {
    const uint4 lo = *reinterpret_cast<const uint4*>(src + u * 8),
                hi = *reinterpret_cast<const uint4*>(src + half + u * 8);
    float x[8], y[8], c[8], s[8];
    unpack(lo, x), unpack(hi, y);
    load_floats(a.table + position * a.rotary + u * 8, c);
    load_floats(a.table + position * a.rotary + half + u * 8, s);
    float o[8], e[8];
    for (int i = 0; i < 8; ++i) o[i] = x[i] * c[i] - y[i] * s[i], e[i] = y[i] * c[i] + x[i] * s[i];
    *reinterpret_cast<uint4*>(dst + u * 8) = pack(o);
    *reinterpret_cast<uint4*>(dst + half + u * 8) = pack(e);
  } else if (p.rotate == Rotate::kInterleaved) {
    const uint4 v = *reinterpret_cast<const uint4*>(src + u * 8);
    float x[8];
    unpack(v, x);
    const float4 c = *reinterpret_cast<const float4*>(a.table + position * a.rotary + u * 4);
    const float4 s = *reinterpret_cast<const float4*>(a.table + position * a.rotary + half + u * 4);
    const float cs[4] = {c.x, c.y, c.z, c.w}, sn[4] = {s.x, s.y, s.z, s.w};
    float o[8];
    for (int i = 0; i < 4; ++i)
      o[2 * i] = x[2 * i] * cs[i] - x[2 * i + 1] * sn[i], o[2 * i + 1] = x[2 * i + 1] * cs[i] + x[2 * i] * sn[i];
    *reinterpret_cast<uint4*>(dst + u * 8) = pack(o);
  } else {
    *reinterpret_cast<uint4*>(dst + u * 8) = *reinterpret_cast<const uint4*>(src + u * 8);
  }
}

// bf16 values in [0.25, 1.25), never zero, from the suites' generator.
void fill_bf16(DeviceBuffer& b, uint64_t seed) {
  std::vector<__nv_bfloat16> h(b.bytes() / 2);
  SplitMix rng{seed};
  for (auto& x : h) x = __float2bfloat16(0.25f + static_cast<float>(rng.below(1000)) * 1e-3f);
  KVROPE_BENCH_CUDA(cudaMemcpy(b.as<void>(), h.data(), b.bytes(), cudaMemcpyHostToDevice));
}

struct Row {
  double us = 0, floor = 0, bytes = 0;
};

Row run_case(GpuClock& clock, const Calibration& cal, const AppendCase& c, int64_t iters) {
  const AppendTokens tok = append_tokens(c, 1);
  const int64_t T = c.tokens(), slots = c.pages() * c.page_size, R = c.rotary_dim();
  DeviceBuffer pos(T * 8), slot(T * 8), table(c.max_position * R * 4);
  KVROPE_BENCH_CUDA(cudaMemcpy(pos.as<void>(), tok.positions.data(), T * 8, cudaMemcpyHostToDevice));
  KVROPE_BENCH_CUDA(cudaMemcpy(slot.as<void>(), tok.slots.data(), T * 8, cudaMemcpyHostToDevice));
  {
    std::vector<float> h(c.max_position * R);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 0.5f + static_cast<float>(i % 97) * 1e-3f;
    KVROPE_BENCH_CUDA(cudaMemcpy(table.as<void>(), h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  }
  Bare a;
  a.rotary = static_cast<int>(R);
  a.table = table.as<const float>();
  a.positions = pos.as<const int64_t>();
  a.slots = slot.as<const int64_t>();
  std::vector<DeviceBuffer> held;
  if (!c.mla) {
    const int64_t Hq = c.query_heads, H = c.heads, D = c.head_dim, width = (Hq + 2 * H) * D;
    held.emplace_back(T * width * 2), held.emplace_back(slots * H * D * 2), held.emplace_back(slots * H * D * 2);
    fill_bf16(held[0], 7);
    __nv_bfloat16* qkv = held[0].as<__nv_bfloat16>();
    // Heads of D at `offset` in a token's qkv row, written in place (cache null) or to the cache's slot row.
    auto heads_of = [&](int64_t offset, int64_t heads, __nv_bfloat16* cache, Rotate rotate) {
      return Part{qkv + offset, width, D, cache, H * D, D, static_cast<int>(heads), static_cast<int>(D), rotate};
    };
    a.part[0] = heads_of(0, Hq, nullptr, Rotate::kHalf);
    a.part[1] = heads_of(Hq * D, H, held[1].as<__nv_bfloat16>(), Rotate::kHalf);
    a.part[2] = heads_of((Hq + H) * D, H, held[2].as<__nv_bfloat16>(), Rotate::kNone);
  } else {
    const int64_t Hq = c.query_heads, N = c.nope_dim, L = c.latent_dim;
    held.emplace_back(T * Hq * (N + R) * 2), held.emplace_back(T * (L + R) * 2), held.emplace_back(slots * (L + R) * 2);
    fill_bf16(held[0], 7), fill_bf16(held[1], 8);
    __nv_bfloat16* q = held[0].as<__nv_bfloat16>();
    __nv_bfloat16* kv = held[1].as<__nv_bfloat16>();  // [T, L + R]: kv_c, then k_pe
    __nv_bfloat16* cache = held[2].as<__nv_bfloat16>();
    a.part[0] = Part{
        q + N, Hq * (N + R), N + R, nullptr, 0, 0, static_cast<int>(Hq), static_cast<int>(R), Rotate::kInterleaved};
    a.part[1] = Part{kv, L + R, 0, cache, L + R, 0, 1, static_cast<int>(L), Rotate::kNone};
    a.part[2] = Part{kv + L, L + R, 0, cache + L, L + R, 0, 1, static_cast<int>(R), Rotate::kInterleaved};
  }
  for (int k = 0; k < kParts; ++k) {
    a.part[k].set_units();
    a.items_per_token += a.part[k].items;
  }
  const dim3 grid((a.items_per_token + 127) / 128, static_cast<unsigned>(T));  // (T <= 8,192 < 65,536)
  const double med =
      median_of(study_times_us(clock, iters, [&](cudaStream_t st) { bare_append<<<grid, 128, 0, st>>>(a); }));
  const double bytes = append_bytes(c, false);
  const Row r{med, cal.floor_us(bytes), bytes};
  std::printf("%s case %3d %-5s %-8s Hq %3lld | bare %8.2f us | floor %7.2f | %8.3f MB | bare/floor %6.3f",
              c.decode ? "serve-decode" : "serve-prefill", c.id, c.shape().c_str(), c.cache_label(),
              static_cast<long long>(c.query_heads), r.us, r.floor, bytes * 1e-6, r.us / r.floor);
  if (c.decode) std::printf(" | bare/(floor+empty) %6.3f", r.us / (r.floor + cal.empty_kernel_us));
  std::printf("\n");
  return r;
}

// The suite's bf16 cases, GQA then MLA, each group's geomean after its rows.
void study_suite(GpuClock& clock, const Calibration& cal, int64_t iters, const std::string& suite) {
  const bool decode = suite == "serve-decode";
  for (const bool mla : {false, true}) {
    Means x, x_large;
    for (const AppendCase& c : append_case_table(decode)) {
      if (c.mla != mla || c.cache != AppendCache::kBf16 || c.mrope || c.query_fp8 ||
          (!mla && c.layout != AppendLayout::kNhd))
        continue;
      const Row r = run_case(clock, cal, c, iters);
      x.add(decode ? r.us / (r.floor + cal.empty_kernel_us) : r.us / r.floor);
      if (!decode && r.bytes >= 64e6) x_large.add(r.us / r.floor);
    }
    const char* group = mla ? "mla bf16" : "bf16 NHD";
    if (decode)
      std::printf("%s %s: bare/(floor+empty) geomean = %.3f (%d cases)\n", suite.c_str(), group, x.geometric(), x.n);
    else
      std::printf("%s %s: bare/floor geomean = %.3f, >= 64 MB %.3f (%d of them)\n", suite.c_str(), group, x.geometric(),
                  x_large.geometric(), x_large.n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return floor_study_main(argc, argv, "append_floor_study", {"serve-decode", "serve-prefill"}, study_suite);
}
