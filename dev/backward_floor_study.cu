// backward_floor_study: the least a backward call of the suites' shapes takes when the kernel does
// little but the call's memory work (docs/performance-log.md, "What the memory work alone takes").
// Token work: a thread a 16-byte unit pair (u, u + D / 2) of one head row of a token. It loads the
// token's position, then the gK and gV rows it names, beside the token's key, cos and sin units (all
// issued before any is used), stores the RoPE backward to grad_key, gV to grad_value and zeros to the
// named rows, and sums the table terms over the heads of its warp by shuffles (a token with more heads
// than a warp holds has each of its warps write the whole table row: the same DRAM bytes, more L2
// writes). Out of place ("fused") more blocks copy the cache rows not named (a byte a row, set on the
// host), 4 units a thread and both caches, loads before stores. No repeat check, no error flag, no
// planner: BHSD rows, one block of 128 threads per 4 warps of items. Its CUPTI time after the L2 flush
// is what the protocol leaves for the chain (position, then rows, then stores) set beside the floor and
// the chain bound the suites use. A third column ("checked") runs in place with every block asking, between
// its first loads and its rows, whether the positions form one run (all S loaded, one barrier), as a
// kernel that honours repeated rows must; it is not persistent, so large cases pay that S-fold.
// Timed by kvrope_bench's clock (bench/support).
//   backward_floor_study [--iters=N] [--cases_csv=PATH]... [--clock=cupti|events] [--flush=write|read]
//   (default: the leaderboard and the suites)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "calibration.cuh"
#include "cases.hpp"
#include "check.cuh"
#include "cupti_clock.cuh"
#include "cupti_records.cuh"
#include "device.cuh"
#include "floor_study.cuh"
#include "fill.cuh"
#include "options.cuh"
#include "stats.hpp"
#include "backward_report.cuh"

namespace {

using namespace kvrope_bench;

constexpr int kBlock = 128;
constexpr int kCopyUnits = 4;  // cache units a copy thread moves, all loaded before its stores

struct Bare {
  uint4 *gk, *gv, *gk_out, *gv_out;  // caches [B, H, S_max, D]; in place the outputs are gk, gv
  const uint4 *key, *cos, *sin;      // key [B, H, S, D]; tables [B, S, D]
  uint4 *grad_key, *grad_value, *grad_cos, *grad_sin;
  const int64_t* positions;    // [S]
  const unsigned char* named;  // [S_max]: 1 where a position names the row (the copy skips it)
  int64_t batch, heads, seq_len, cache_len, head_dim;
  int units;                         // 16-byte units in half a row
  int heads_warp;                    // heads a warp covers: 32 / units
  int warps_token;                   // ceil(heads / heads_warp)
  int64_t token_blocks, copy_units;  // copy_units: 16-byte units of one cache
};

// (bf16 and fp16 convert to and from float by static_cast: the project leaves CUDA's conversions on.)
template <typename T>
__device__ __forceinline__ float to_f(T x) {
  return static_cast<float>(x);
}

template <typename T>
union Unit {
  uint4 raw;
  T e[16 / sizeof(T)];
};

// The block-wide question a real kernel must ask before its rows (do the positions form one run, so
// that no row repeats?), in the checked kernels: every position loaded, 4 a thread at once, then one __syncthreads_and.
// The answer is not used: the study times the round trip and the barrier.
__device__ __forceinline__ void run_check(const Bare& a) {
  const int64_t p0 = a.positions[0];
  bool run = true;
  for (int64_t t0 = threadIdx.x; t0 < a.seq_len; t0 += 4 * kBlock) {
    int64_t q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = a.positions[t0 + i * kBlock < a.seq_len ? t0 + i * kBlock : t0];
#pragma unroll
    for (int i = 0; i < 4; ++i) run &= t0 + i * kBlock >= a.seq_len || q[i] == (p0 + t0 + i * kBlock) % a.cache_len;
  }
  run = __syncthreads_and(run);
  asm volatile("" ::"r"(static_cast<int>(run)));
}

template <typename T, bool kCheck>
__device__ void token_work(const Bare& a, int64_t warp_id, int lane) {
  constexpr int kE = 16 / sizeof(T);
  const int64_t token = warp_id / a.warps_token;
  const int hh = lane / a.units, u = lane % a.units;
  const int64_t head = (warp_id % a.warps_token) * a.heads_warp + hh;
  const bool active = token < a.batch * a.seq_len && hh < a.heads_warp && head < a.heads;
  const int64_t b = active ? token / a.seq_len : 0, t = active ? token % a.seq_len : 0, j = active ? head : 0;
  const int64_t row_units = a.head_dim * int64_t{sizeof(T)} / 16, half = row_units / 2;
  const int64_t trow = ((b * a.heads + j) * a.seq_len + t) * row_units + u;
  const int64_t tab = (b * a.seq_len + t) * row_units + u;
  Unit<T> k1{}, k2{}, c1{}, c2{}, s1{}, s2{}, g1{}, g2{}, v1{}, v2{};
  int64_t p = 0, crow = 0;  // the position; the named row's unit u in the caches
  if (active) {
    p = a.positions[t];
    k1.raw = a.key[trow], k2.raw = a.key[trow + half];
    c1.raw = a.cos[tab], c2.raw = a.cos[tab + half];
    s1.raw = a.sin[tab], s2.raw = a.sin[tab + half];
  }
  if (kCheck) run_check(a);
  if (active) {
    const int64_t r = p < 0 ? p + a.cache_len : p;
    crow = ((b * a.heads + j) * a.cache_len + r) * row_units + u;
    g1.raw = a.gk[crow], g2.raw = a.gk[crow + half];
    v1.raw = a.gv[crow], v2.raw = a.gv[crow + half];
  }
  Unit<T> d1, d2;
  float dc[2 * kE], ds[2 * kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const float x1 = to_f(k1.e[e]), x2 = to_f(k2.e[e]), y1 = to_f(g1.e[e]), y2 = to_f(g2.e[e]);
    d1.e[e] = static_cast<T>(y1 * to_f(c1.e[e]) + y2 * to_f(s2.e[e]));
    d2.e[e] = static_cast<T>(y2 * to_f(c2.e[e]) - y1 * to_f(s1.e[e]));
    dc[e] = y1 * x1, dc[kE + e] = y2 * x2, ds[e] = -y1 * x2, ds[kE + e] = y2 * x1;
  }
  for (int o = 1; o < a.heads_warp; o <<= 1) {  // the head sum of the warp, a tree onto hh = 0
    const bool take = hh % (2 * o) == 0 && hh + o < a.heads_warp && head + o < a.heads;
#pragma unroll
    for (int e = 0; e < 2 * kE; ++e) {
      const float c = __shfl_down_sync(0xffffffffu, dc[e], o * a.units);
      const float s = __shfl_down_sync(0xffffffffu, ds[e], o * a.units);
      if (take) dc[e] += c, ds[e] += s;
    }
  }
  if (!active) return;
  a.grad_key[trow] = d1.raw, a.grad_key[trow + half] = d2.raw;
  a.grad_value[trow] = v1.raw, a.grad_value[trow + half] = v2.raw;
  a.gk_out[crow] = a.gk_out[crow + half] = a.gv_out[crow] = a.gv_out[crow + half] = uint4{0, 0, 0, 0};
  if (hh == 0) {
    Unit<T> o1, o2, o3, o4;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      o1.e[e] = static_cast<T>(dc[e]), o2.e[e] = static_cast<T>(dc[kE + e]);
      o3.e[e] = static_cast<T>(ds[e]), o4.e[e] = static_cast<T>(ds[kE + e]);
    }
    a.grad_cos[tab] = o1.raw, a.grad_cos[tab + half] = o2.raw;
    a.grad_sin[tab] = o3.raw, a.grad_sin[tab + half] = o4.raw;
  }
}

template <typename T, bool kCheck>
__global__ void __launch_bounds__(kBlock) bare_backward(const Bare a) {
  if (blockIdx.x < a.token_blocks) {  // token blocks first: their chain starts first
    token_work<T, kCheck>(a, (int64_t{blockIdx.x} * kBlock + threadIdx.x) / 32, threadIdx.x & 31);
    return;
  }
  // The rows no position names, both caches: kCopyUnits units of each a thread.
  const int64_t row_units = a.head_dim * int64_t{sizeof(T)} / 16;
  const int64_t first = (int64_t{blockIdx.x} - a.token_blocks) * kBlock * kCopyUnits + threadIdx.x;
  bool copy[kCopyUnits];
  uint4 k[kCopyUnits], v[kCopyUnits];
#pragma unroll
  for (int i = 0; i < kCopyUnits; ++i) {
    const int64_t unit = first + i * kBlock;
    copy[i] = unit < a.copy_units && !a.named[(unit / row_units) % a.cache_len];
  }
#pragma unroll
  for (int i = 0; i < kCopyUnits; ++i) {
    if (copy[i]) k[i] = a.gk[first + i * kBlock], v[i] = a.gv[first + i * kBlock];
  }
#pragma unroll
  for (int i = 0; i < kCopyUnits; ++i) {
    if (copy[i]) a.gk_out[first + i * kBlock] = k[i], a.gv_out[first + i * kBlock] = v[i];
  }
}

struct BareResult {
  double bare_us, floor_us, bound_us;  // bound: the floor, plus the chain in place
};

enum Mode { kFused, kInPlace, kInPlaceChecked, kModes };

// Case c in every mode, on one set of buffers (out of place first: in place zeroes the named rows).
template <typename T>
void run_modes(GpuClock& clock, const Calibration& cal, const LeaderboardCase& c, int64_t iters,
               BareResult (&result)[kModes]) {
  const int64_t B = c.batch, H = c.heads, S = c.seq_len, Smax = c.cache_len, D = c.head_dim;
  const int64_t E = sizeof(T);
  DeviceBuffer gk(B * H * Smax * D * E), gv(B * H * Smax * D * E), gko(gk.bytes()), gvo(gv.bytes());
  DeviceBuffer key(B * H * S * D * E), cs(B * S * D * E), sn(B * S * D * E), dk(B * H * S * D * E);
  DeviceBuffer dv(B * H * S * D * E), dc(B * S * D * E), dsn(B * S * D * E), pos(S * 8), named(Smax);
  const std::string pattern = c.positions.empty() ? "arange" : c.positions;
  const std::vector<int64_t> p =
      make_positions(pattern, S, Smax, splitmix64(Options{}.seed ^ (uint64_t(c.id) << 32)));  // the bench's
  std::vector<unsigned char> flags(static_cast<size_t>(Smax), 0);
  for (int64_t r : p) flags[static_cast<size_t>(r < 0 ? r + Smax : r)] = 1;
  KVROPE_BENCH_CUDA(cudaMemcpy(pos.as<void>(), p.data(), S * 8, cudaMemcpyHostToDevice));
  KVROPE_BENCH_CUDA(cudaMemcpy(named.as<void>(), flags.data(), Smax, cudaMemcpyHostToDevice));
  for (DeviceBuffer* buf : {&gk, &gv, &key, &cs, &sn})
    KVROPE_BENCH_CUDA(cudaMemset(buf->as<void>(), 0x3c, buf->bytes()));
  Bare a{};
  a.gk = gk.as<uint4>(), a.gv = gv.as<uint4>();
  a.key = key.as<const uint4>(), a.cos = cs.as<const uint4>(), a.sin = sn.as<const uint4>();
  a.grad_key = dk.as<uint4>(), a.grad_value = dv.as<uint4>(), a.grad_cos = dc.as<uint4>(), a.grad_sin = dsn.as<uint4>();
  a.positions = pos.as<const int64_t>(), a.named = named.as<const unsigned char>();
  a.batch = B, a.heads = H, a.seq_len = S, a.cache_len = Smax, a.head_dim = D;
  a.units = static_cast<int>(D * E / 32);
  a.heads_warp = 32 / a.units;
  a.warps_token = static_cast<int>((H + a.heads_warp - 1) / a.heads_warp);
  a.token_blocks = (B * S * a.warps_token + kBlock / 32 - 1) / (kBlock / 32);
  const Traffic bytes = traffic_of(c, sizeof(T));
  for (Mode mode : {kFused, kInPlace, kInPlaceChecked}) {
    const bool in_place = mode != kFused;
    a.gk_out = in_place ? a.gk : gko.as<uint4>(), a.gv_out = in_place ? a.gv : gvo.as<uint4>();
    a.copy_units = in_place ? 0 : B * H * Smax * D * E / 16;
    const int64_t copy_blocks = (a.copy_units + kBlock * kCopyUnits - 1) / (kBlock * kCopyUnits);
    const int grid = static_cast<int>(std::max<int64_t>(1, a.token_blocks + copy_blocks));
    const double med = median_of(study_times_us(clock, iters, [&](cudaStream_t st) {
      if (mode == kInPlaceChecked) {
        bare_backward<T, true><<<grid, kBlock, 0, st>>>(a);
      } else {
        bare_backward<T, false><<<grid, kBlock, 0, st>>>(a);
      }
    }));
    const double floor = cal.floor_us(in_place ? bytes.in_place : bytes.out_of_place);
    result[mode] = {med, floor, in_place ? chain_bound_us(floor, cal.empty_kernel_us) : floor};
  }
}

}  // namespace

int main(int argc, char** argv) {
  return floor_study_main(
      argc, argv, "backward_floor_study",
      {"bench/sol_execbench_062_cases.csv", "bench/suite_positions.csv", "bench/suite_heads.csv",
       "bench/suite_head_dims.csv", "bench/suite_dtypes.csv"},
      [](GpuClock& clock, const Calibration& cal, int64_t iters, const std::string& path) {
        std::printf(
            "%s\ncase dtype   H    D   B     S S_max pos    | fused bare  floor ratio | in place bare "
            "floor bound ratio | checked ratio\n",
            path.c_str());
        double logs[kModes] = {0, 0, 0};
        int n = 0;
        for (const LeaderboardCase& c : read_cases(path)) {
          const std::string dtype = c.dtype.empty() ? "bf16" : c.dtype;
          BareResult r[kModes];
          if (dtype == "fp32") {
            run_modes<float>(clock, cal, c, iters, r);
          } else if (dtype == "fp16") {
            run_modes<__half>(clock, cal, c, iters, r);
          } else {
            run_modes<__nv_bfloat16>(clock, cal, c, iters, r);
          }
          for (int m = 0; m < kModes; ++m) logs[m] += std::log(r[m].bare_us / r[m].bound_us);
          ++n;
          std::printf(
              "%4d %5s %3lld %4lld %3lld %5lld %5lld %-6s | %10.2f %6.2f %5.3f | %13.2f %5.2f %5.2f %5.3f | %7.2f "
              "%5.3f\n",
              c.id, dtype.c_str(), static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.batch), static_cast<long long>(c.seq_len), static_cast<long long>(c.cache_len),
              c.positions.empty() ? "arange" : c.positions.c_str(), r[0].bare_us, r[0].floor_us,
              r[0].bare_us / r[0].bound_us, r[1].bare_us, r[1].floor_us, r[1].bound_us, r[1].bare_us / r[1].bound_us,
              r[2].bare_us, r[2].bare_us / r[2].bound_us);
        }
        std::printf(
            "bare fused/floor geomean = %.3f   bare inplace/(inplace-floor + chain) geomean = %.3f   checked = %.3f  "
            "(%d cases)\n",
            std::exp(logs[0] / n), std::exp(logs[1] / n), std::exp(logs[2] / n), n);
      });
}
