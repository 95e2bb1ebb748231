// forward_floor_study: the least a forward call of the benchmark's shapes takes when the kernel does
// nothing but the call's memory work (docs/performance-log.md, "The forward: what its memory work alone takes"). A
// thread a 16-byte unit pair of a token's head row: it loads its k, v, cos and sin chunks and the token's position, all
// at once, then stores RoPE(k) and v to the cache row the position names and RoPE(k) to key_out. No repeat check, no
// error flag, no general layouts: bf16, BHSD, H = 8, D = 128, positions arange, every item in one wave. Its CUPTI time
// after the L2 flush is what the protocol leaves for one round trip and the stores, set beside the floor the suites
// use. Timed by kvrope_bench's clock (bench/support).
//   forward_floor_study [--iters=N] [--cases_csv=PATH]... [--clock=cupti|events] [--flush=write|read]
//   (default: the forward and decode tables)
#include <cuda_bf16.h>

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
#include "stats.hpp"

namespace {

using namespace kvrope_bench;

constexpr int kHeads = 8, kDim = 128, kUnits = kDim / 16;  // a unit: 8 elements at u * 8 and u * 8 + 64

struct Bare {
  const uint4 *k, *v, *cos, *sin;
  const int64_t* positions;
  uint4 *k_cache, *v_cache, *k_out;
  int64_t seq_len, cache_len;
  uint32_t items;
};

__device__ __forceinline__ uint32_t rope_word(uint32_t x, uint32_t y, uint32_t c, uint32_t s, bool lo) {
  const float2 xf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  const float2 yf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&y));
  const float2 cf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&c));
  const float2 sf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&s));
  const float2 o = lo ? make_float2(xf.x * cf.x - yf.x * sf.x, xf.y * cf.y - yf.y * sf.y)
                      : make_float2(xf.x * cf.x + yf.x * sf.x, xf.y * cf.y + yf.y * sf.y);
  const __nv_bfloat162 r = __floats2bfloat162_rn(o.x, o.y);
  return *reinterpret_cast<const uint32_t*>(&r);
}

__global__ void __launch_bounds__(128) bare_forward(const Bare a) {
  const uint32_t item = blockIdx.x * 128 + threadIdx.x;
  if (item >= a.items) return;
  const uint32_t u = item % kUnits, head = (item / kUnits) % kHeads, token = item / (kUnits * kHeads);
  const uint32_t b = token / static_cast<uint32_t>(a.seq_len), t = token % static_cast<uint32_t>(a.seq_len);
  const int64_t p = a.positions[t];
  const int64_t row = (int64_t{b} * kHeads + head) * a.seq_len + t;  // in 16-byte chunks: row * 16
  const uint4 klo = a.k[row * 16 + u], khi = a.k[row * 16 + u + 8];
  const uint4 vlo = a.v[row * 16 + u], vhi = a.v[row * 16 + u + 8];
  const int64_t trow = int64_t{b} * a.seq_len + t;
  const uint4 clo = a.cos[trow * 16 + u], chi = a.cos[trow * 16 + u + 8];
  const uint4 slo = a.sin[trow * 16 + u], shi = a.sin[trow * 16 + u + 8];
  uint4 olo, ohi;
  olo.x = rope_word(klo.x, khi.x, clo.x, slo.x, true), ohi.x = rope_word(khi.x, klo.x, chi.x, shi.x, false);
  olo.y = rope_word(klo.y, khi.y, clo.y, slo.y, true), ohi.y = rope_word(khi.y, klo.y, chi.y, shi.y, false);
  olo.z = rope_word(klo.z, khi.z, clo.z, slo.z, true), ohi.z = rope_word(khi.z, klo.z, chi.z, shi.z, false);
  olo.w = rope_word(klo.w, khi.w, clo.w, slo.w, true), ohi.w = rope_word(khi.w, klo.w, chi.w, shi.w, false);
  const int64_t crow = (int64_t{b} * kHeads + head) * a.cache_len + p;
  a.k_cache[crow * 16 + u] = olo, a.k_cache[crow * 16 + u + 8] = ohi;
  a.v_cache[crow * 16 + u] = vlo, a.v_cache[crow * 16 + u + 8] = vhi;
  a.k_out[row * 16 + u] = olo, a.k_out[row * 16 + u + 8] = ohi;
}

void run_case(GpuClock& clock, const Calibration& cal, const LeaderboardCase& c, int64_t iters) {
  const int64_t rows = c.batch * kHeads * c.seq_len, cache_rows = c.batch * kHeads * c.cache_len;
  const size_t row_bytes = kDim * 2, table_bytes = c.batch * c.seq_len * row_bytes;
  DeviceBuffer k(rows * row_bytes), v(rows * row_bytes), ko(rows * row_bytes), cs(table_bytes), sn(table_bytes);
  DeviceBuffer kc(cache_rows * row_bytes), vc(cache_rows * row_bytes), pos(c.seq_len * 8);
  std::vector<int64_t> host(c.seq_len);
  for (int64_t t = 0; t < c.seq_len; ++t) host[t] = t;
  KVROPE_BENCH_CUDA(cudaMemcpy(pos.as<void>(), host.data(), c.seq_len * 8, cudaMemcpyHostToDevice));
  for (DeviceBuffer* b : {&k, &v, &cs, &sn}) KVROPE_BENCH_CUDA(cudaMemset(b->as<void>(), 0x3c, b->bytes()));
  Bare a{k.as<const uint4>(),
         v.as<const uint4>(),
         cs.as<const uint4>(),
         sn.as<const uint4>(),
         pos.as<const int64_t>(),
         kc.as<uint4>(),
         vc.as<uint4>(),
         ko.as<uint4>(),
         c.seq_len,
         c.cache_len,
         static_cast<uint32_t>(rows * kUnits)};
  const int grid = static_cast<int>((a.items + 127) / 128);
  const double med =
      median_of(study_times_us(clock, iters, [&](cudaStream_t st) { bare_forward<<<grid, 128, 0, st>>>(a); }));
  const double bytes = 5.0 * rows * row_bytes + 2.0 * table_bytes;  // k, v read; 2 cache rows, key_out written
  const double floor = cal.floor_us(bytes);
  std::printf(
      "case %2d B %3lld S %5lld S_max %5lld | bare %8.2f us | floor %7.2f | bare/floor %6.3f | "
      "bare/(floor+empty) %6.3f\n",
      c.id, static_cast<long long>(c.batch), static_cast<long long>(c.seq_len), static_cast<long long>(c.cache_len),
      med, floor, med / floor, med / (floor + cal.empty_kernel_us));
}

}  // namespace

int main(int argc, char** argv) {
  return floor_study_main(argc, argv, "forward_floor_study",
                          {"bench/sol_execbench_062_cases.csv", "bench/forward_decode_cases.csv"},
                          [](GpuClock& clock, const Calibration& cal, int64_t iters, const std::string& path) {
                            std::printf("%s\n", path.c_str());
                            for (const LeaderboardCase& c : read_cases(path)) run_case(clock, cal, c, iters);
                          });
}
