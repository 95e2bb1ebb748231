// copy_study: how fast can the SMs copy a large buffer on this GPU, and by which scheme? The fused
// backward's large cases are a cache copy with a little token work on the side, and they sit at
// 1.13-1.19 x the floor that cudaMemcpyAsync sets (docs/performance-log.md #8). This program times plain copies of one
// buffer by each scheme, L2 flushed before each call:
//   - cudaMemcpyAsync (CUDA events; the floor's reference);
//   - a vectorized grid-stride copy (16-byte loads and stores, 4 in flight per thread), with streaming
//     (.cs: __ldcs/__stcs, evict-first in L1 and L2) loads and/or stores ("ef-load", "ef-store",
//     "ef-both") or the default policy (no suffix);
//   - the copy warp's scheme (bulk copies through a ring of shared-memory stages, one warp a block),
//     over: chunk size, ring depth, blocks per SM, how chunks are shared among blocks (contiguous
//     ranges as in the kernel of #7, interleaved, or taken at run time from an atomic counter), and L2
//     evict-first hints on the loads and/or stores (here "ef-*" is a createpolicy cache hint).
// The kernel time is the span from the first block's start to the last block's end (%globaltimer,
// the same span as CUPTI's), median of the calls; the spread of the blocks' end times shows how even
// the blocks' shares were.
//
// The flush is the protocol's (a write of twice the L2 size, which leaves the L2 full of dirty
// lines) or, as a diagnostic, a read of the same buffer (clean lines): the difference is what writing
// back the flush's dirty lines costs a copy that evicts them.
//
//   copy_study [MiB=1024] [calls=15] [flush=write|read]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_exit.cuh"
#include "l2_flush.cuh"  // bench/support

namespace {

enum Share : int { kContiguous = 0, kInterleaved = 1, kDynamic = 2 };
enum Hint : int { kLoadEvictFirst = 1, kStoreEvictFirst = 2 };
constexpr int kMaxStages = 8;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The loads and stores of the vector copy: streaming (.cs, evict-first in L1 and L2) where `hints`
// asks for it, else the default policy.
__device__ __forceinline__ uint4 vector_load(const uint4* p, int hints) {
  return (hints & kLoadEvictFirst) ? __ldcs(p) : *p;
}
__device__ __forceinline__ void vector_store(uint4* p, uint4 v, int hints) {
  if (hints & kStoreEvictFirst)
    __stcs(p, v);
  else
    *p = v;
}

__global__ void vector_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n, int hints,
                            uint64_t* times) {
  const uint64_t t0 = global_ns();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = vector_load(src + i + u * stride, hints);
#pragma unroll
    for (int u = 0; u < 4; ++u) vector_store(dst + i + u * stride, v[u], hints);
  }
  for (; i < n; i += stride) vector_store(dst + i, vector_load(src + i, hints), hints);
  __syncthreads();
  if (threadIdx.x == 0) {
    times[2 * blockIdx.x] = t0;
    times[2 * blockIdx.x + 1] = global_ns();
  }
}

// Counts the 16-byte words of dst that differ from src.
__global__ void count_wrong(const uint4* a, const uint4* b, int64_t n, unsigned long long* wrong) {
  unsigned long long mine = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 x = a[i], y = b[i];
    mine += x.x != y.x || x.y != y.y || x.z != y.z || x.w != y.w;
  }
  if (mine) atomicAdd(wrong, mine);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void load_chunk(void* stage, const char* src, uint32_t bytes, uint64_t* bar, bool hint,
                                           uint64_t policy) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  if (hint)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
            "r"(smem_addr(stage)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
        : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(stage)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void store_chunk(char* dst, const void* stage, uint32_t bytes, bool hint, uint64_t policy) {
  if (hint)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(dst),
                 "r"(smem_addr(stage)), "r"(bytes), "l"(policy)
                 : "memory");
  else
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(stage)),
                 "r"(bytes)
                 : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait_reads() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wait_reads(int pending) {
  switch (pending) {
    case 0: wait_reads<0>(); break;
    case 1: wait_reads<1>(); break;
    case 2: wait_reads<2>(); break;
    case 3: wait_reads<3>(); break;
    default: wait_reads<4>(); break;
  }
}
__device__ __forceinline__ bool try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done)
               : "r"(smem_addr(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
#endif

// One warp a block; lane 0 drives the ring (chunk i goes through stage i mod stages; at step i the
// stage of chunk i - slack + 1 is refilled once its store has read it).
__global__ void bulk_ring_copy(const char* src, char* dst, int64_t bytes, int chunk, int stages, int slack, int share,
                               int hints, unsigned long long* counter, uint64_t* times) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const uint64_t t0 = global_ns();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + int64_t{stages} * chunk);
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bars + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const bool hint_load = hints & kLoadEvictFirst, hint_store = hints & kStoreEvictFirst;
    const int64_t total = (bytes + chunk - 1) / chunk;
    const int64_t per = (total + gridDim.x - 1) / gridDim.x;
    int64_t taken = 0;  // chunks this block has taken
    unsigned long long ticket = share == kDynamic ? atomicAdd(counter, 1ull) : 0;
    auto next_chunk = [&]() -> int64_t {
      int64_t c = -1;
      if (share == kContiguous) {
        c = blockIdx.x * per + taken;
        if (taken >= per) c = total;
      } else if (share == kInterleaved) {
        c = blockIdx.x + taken * int64_t{gridDim.x};
      } else {
        c = static_cast<int64_t>(ticket);
        if (c < total) ticket = atomicAdd(counter, 1ull);  // the next one's ticket, a step ahead
      }
      ++taken;
      return c < total ? c : -1;
    };
    int64_t staged[kMaxStages];  // the chunk in each stage
    int issued = 0;
    auto issue = [&](int s) {
      const int64_t c = next_chunk();
      if (c < 0) return false;
      const uint32_t n = static_cast<uint32_t>((bytes - c * chunk < chunk ? bytes - c * chunk : chunk));
      staged[s] = c;
      load_chunk(smem + int64_t{s} * chunk, src + c * chunk, n, bars + s, hint_load, policy);
      ++issued;
      return true;
    };
    bool more = true;
    for (int s = 0; s < stages && more; ++s) more = issue(s);
    uint32_t phases = 0;
    int store_stage = 0, refill_stage = 0;
    for (int i = 0; i < issued; ++i) {
      while (!try_wait(bars + store_stage, (phases >> store_stage) & 1u)) {
      }
      phases ^= 1u << store_stage;
      const int64_t c = staged[store_stage];
      const uint32_t n = static_cast<uint32_t>((bytes - c * chunk < chunk ? bytes - c * chunk : chunk));
      store_chunk(dst + c * chunk, smem + int64_t{store_stage} * chunk, n, hint_store, policy);
      store_stage = store_stage + 1 == stages ? 0 : store_stage + 1;
      if (i - slack + 1 >= 0 && more) {
        wait_reads(slack - 1);
        more = issue(refill_stage);
        refill_stage = refill_stage + 1 == stages ? 0 : refill_stage + 1;
      }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    times[2 * blockIdx.x] = t0;
    times[2 * blockIdx.x + 1] = global_ns();
  }
#endif
}

struct Result {
  double span_us, event_us, end_p10, end_p50, end_max;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 15;
  const std::string flush_mode = argc > 3 ? argv[3] : "write";
  if (flush_mode != "write" && flush_mode != "read") {
    std::fprintf(stderr, "copy_study: the flush is write or read\n");
    return 2;
  }
  const int64_t bytes = mib << 20;
  int dev = 0, sms = 0, l2 = 0;
  KVROPE_TOOL_CUDA(cudaGetDevice(&dev));
  KVROPE_TOOL_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  KVROPE_TOOL_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaDeviceProp prop{};
  KVROPE_TOOL_CUDA(cudaGetDeviceProperties(&prop, dev));
  if (prop.major < 9) {
    std::fprintf(stderr, "copy_study: the bulk-copy schemes need sm_90 or later (this GPU: sm_%d%d)\n", prop.major,
                 prop.minor);
    return 2;
  }
  char *src = nullptr, *dst = nullptr, *flush = nullptr;
  unsigned long long* counter = nullptr;
  uint64_t* d_times = nullptr;
  const int max_blocks = sms * 64;
  KVROPE_TOOL_CUDA(cudaMalloc(&src, bytes));
  KVROPE_TOOL_CUDA(cudaMalloc(&dst, bytes));
  KVROPE_TOOL_CUDA(cudaMalloc(&flush, 2 * size_t(l2)));
  KVROPE_TOOL_CUDA(cudaMemset(flush, 0x5a, 2 * size_t(l2)));  // defined bytes for the flush by reads
  KVROPE_TOOL_CUDA(cudaMalloc(&counter, sizeof(unsigned long long)));
  KVROPE_TOOL_CUDA(cudaMalloc(&d_times, 2 * sizeof(uint64_t) * max_blocks));
  KVROPE_TOOL_CUDA(cudaMemset(src, 0x5a, bytes));
  KVROPE_TOOL_CUDA(cudaMemset(src, 0x33, bytes / 3));  // not one byte throughout
  cudaEvent_t e0, e1;
  KVROPE_TOOL_CUDA(cudaEventCreate(&e0));
  KVROPE_TOOL_CUDA(cudaEventCreate(&e1));
  KVROPE_TOOL_CUDA(cudaFuncSetAttribute(bulk_ring_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  std::printf("copy_study: %s, %d SMs, %lld MiB copied (%.3f GB read + written), %d calls each, L2 flushed by a %s\n",
              prop.name, sms, static_cast<long long>(mib), 2e-9 * bytes, calls, flush_mode.c_str());
  std::printf("%-52s %9s %9s %7s %7s | block end us: %7s %7s %7s\n", "scheme", "span_us", "event_us", "TB/s",
              "x_memcpy", "p10", "p50", "max");

  double memcpy_us = 0;
  // launch(grid) runs one call; timed() flushes, runs `calls` of them and reports.
  auto timed = [&](const char* name, int grid, auto&& launch) {
    KVROPE_TOOL_CUDA(cudaMemset(dst, 0, bytes));
    std::vector<double> spans, events, p10, p50, pmax;
    std::vector<uint64_t> t(2 * size_t(std::max(grid, 1)));
    for (int k = 0; k < calls + 1; ++k) {
      if (flush_mode == "write") {
        KVROPE_TOOL_CUDA(cudaMemsetAsync(flush, k & 0xff, 2 * size_t(l2)));
      } else {
        kvrope_bench::l2_read_flush<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(flush), 2 * int64_t{l2} / 16,
                                                      0x9e3779b9u + k, reinterpret_cast<uint32_t*>(counter));
        KVROPE_TOOL_CUDA(cudaGetLastError());
      }
      KVROPE_TOOL_CUDA(cudaMemsetAsync(counter, 0, sizeof(unsigned long long)));
      KVROPE_TOOL_CUDA(cudaDeviceSynchronize());
      KVROPE_TOOL_CUDA(cudaEventRecord(e0));
      launch();
      KVROPE_TOOL_CUDA(cudaGetLastError());
      KVROPE_TOOL_CUDA(cudaEventRecord(e1));
      KVROPE_TOOL_CUDA(cudaDeviceSynchronize());
      if (k == 0) continue;  // warm-up
      float ms = 0;
      KVROPE_TOOL_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      events.push_back(1e3 * ms);
      if (grid > 0) {
        KVROPE_TOOL_CUDA(cudaMemcpy(t.data(), d_times, t.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        uint64_t start = UINT64_MAX, end = 0;
        std::vector<double> ends;
        for (int b = 0; b < grid; ++b) start = std::min(start, t[2 * b]), end = std::max(end, t[2 * b + 1]);
        for (int b = 0; b < grid; ++b) ends.push_back(1e-3 * double(t[2 * b + 1] - start));
        std::sort(ends.begin(), ends.end());
        spans.push_back(1e-3 * double(end - start));
        p10.push_back(ends[ends.size() / 10]);
        p50.push_back(ends[ends.size() / 2]);
        pmax.push_back(ends.back());
      }
    }
    KVROPE_TOOL_CUDA(cudaMemset(counter, 0, sizeof(unsigned long long)));
    count_wrong<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(src), reinterpret_cast<const uint4*>(dst), bytes / 16,
                                  counter);
    unsigned long long wrong = 0;
    KVROPE_TOOL_CUDA(cudaMemcpy(&wrong, counter, sizeof(wrong), cudaMemcpyDeviceToHost));
    if (wrong)
      std::printf("%s: %llu of %lld 16-byte words not copied\n", name, wrong, static_cast<long long>(bytes / 16));
    const double ev = median(events), span = grid > 0 ? median(spans) : ev;
    if (memcpy_us == 0) memcpy_us = span;
    std::printf("%-52s %9.2f %9.2f %7.3f %7.3f", name, span, ev, 2e-6 * bytes / span, span / memcpy_us);
    if (grid > 0) std::printf(" | %21s %7.2f %7.2f %7.2f", "", median(p10), median(p50), median(pmax));
    std::printf("\n");
  };

  timed("cudaMemcpyAsync (events)", 0,
        [&] { KVROPE_TOOL_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
  const char* hint_name[] = {"", " ef-load", " ef-store", " ef-both"};
  for (int hints : {3, 0, 1, 2}) {
    for (int per_sm : {4, 8, 16}) {
      const int grid = sms * per_sm;
      char name[80];
      std::snprintf(name, sizeof(name), "vector 16B x4, 256 threads, %d blocks/SM%s", per_sm, hint_name[hints]);
      timed(name, grid, [&] {
        vector_copy<<<grid, 256>>>(reinterpret_cast<const uint4*>(src), reinterpret_cast<uint4*>(dst), bytes / 16,
                                   hints, d_times);
      });
    }
  }

  struct Scheme {
    int chunk_kib, stages, slack, per_sm, share, hints;
  };
  const char* share_name[] = {"contiguous", "interleaved", "dynamic"};
  std::vector<Scheme> schemes = {
      {32, 6, 2, 1, kContiguous, 0},  // the copy warp of performance-log #7
      {32, 6, 2, 1, kInterleaved, 0},
      {32, 6, 2, 1, kDynamic, 0},
      {32, 6, 2, 1, kContiguous, kLoadEvictFirst},
      {32, 6, 2, 1, kContiguous, kStoreEvictFirst},
      {32, 6, 2, 1, kContiguous, kLoadEvictFirst | kStoreEvictFirst},
      {32, 6, 2, 1, kDynamic, kLoadEvictFirst | kStoreEvictFirst},
      {16, 6, 2, 1, kContiguous, 0},
      {16, 6, 2, 1, kDynamic, 0},
      {32, 6, 1, 1, kContiguous, 0},
      {32, 6, 3, 1, kContiguous, 0},
      {16, 6, 2, 2, kContiguous, 0},
      {16, 6, 2, 2, kDynamic, 0},
      {8, 6, 2, 4, kContiguous, 0},
      {8, 6, 2, 4, kDynamic, 0},
      {64, 3, 1, 1, kContiguous, 0},
      {64, 3, 1, 1, kDynamic, 0},
  };
  for (const Scheme& s : schemes) {
    const int grid = sms * s.per_sm;
    const int chunk = s.chunk_kib * 1024;
    const size_t shared = size_t(s.stages) * chunk + 8 * s.stages;
    char name[96];
    std::snprintf(name, sizeof(name), "bulk %dK x%d slack %d, %d/SM, %s%s", s.chunk_kib, s.stages, s.slack, s.per_sm,
                  share_name[s.share], hint_name[s.hints]);
    timed(name, grid, [&] {
      bulk_ring_copy<<<grid, 32, shared>>>(src, dst, bytes, chunk, s.stages, s.slack, s.share, s.hints, counter,
                                           d_times);
    });
  }
  return 0;
}
