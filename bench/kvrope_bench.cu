// kvrope_bench: Google Benchmark suite for the backward op on the 16 leaderboard cases of
// bench/sol_execbench_062_cases.csv, timed with the leaderboard's protocol (DESIGN.md section 5):
// L2 flushed and the device synchronized before each call, GPU span of the call from CUPTI
// activity records, median over the calls; plus the CUDA-event time, the floor and a summary.
// docs/benchmarks.md describes the protocol, the flags and the output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cupti.h>

#include <kvrope/kvrope.cuh>
#include <kvrope/reference/cpu_backward.hpp>
#include <kvrope/reference/naive_backward.cuh>

#include "l2_read_flush.cuh"

// Every CUDA and CUPTI call is checked; a failure is a broken setup, so the bench aborts with its place.
#define KVROPE_BENCH_CUDA(call) ::kvrope_bench::check_cuda((call), #call, __FILE__, __LINE__)
#define KVROPE_BENCH_CUPTI(call) ::kvrope_bench::check_cupti((call), #call, __FILE__, __LINE__)

namespace kvrope_bench {

void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, what, cudaGetErrorName(err),
               cudaGetErrorString(err));
  std::abort();
}

void check_cupti(CUptiResult res, const char* what, const char* file, int line) {
  if (res == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  if (cuptiGetResultString(res, &msg) != CUPTI_SUCCESS || msg == nullptr) msg = "unknown CUPTI error";
  std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, what, msg);
  std::abort();
}

// ---------------------------------------------------------------------------------------------
// The cases: bench/sol_execbench_062_cases.csv (num_kv_heads = 8 and head_dim = 128 in every row;
// --heads and --head_dim override them).

struct LeaderboardCase {
  int id;
  int64_t batch;      // B
  int64_t seq_len;    // S, new tokens
  int64_t cache_len;  // S_max
  double b200_scoring_baseline_ms;
  double b200_sol_bound_ms;
};

constexpr LeaderboardCase kCases[] = {
    {1, 1, 691, 2048, 0.2058, 0.0036},     {2, 16, 919, 8192, 0.9156, 0.1620},
    {3, 4, 773, 4096, 0.3012, 0.0224},     {4, 2, 211, 1024, 0.2084, 0.0032},
    {5, 4, 256, 2048, 0.2128, 0.0107},     {6, 8, 256, 2048, 0.2577, 0.0209},
    {7, 2, 541, 2048, 0.2106, 0.0064},     {8, 1, 1, 256, 0.2046, 0.0007},
    {9, 2, 2048, 4096, 0.3345, 0.0152},    {10, 32, 1, 2048, 0.2887, 0.0705},
    {11, 8, 449, 4096, 0.3434, 0.0407},    {12, 4, 1, 512, 0.2073, 0.0026},
    {13, 32, 512, 4096, 0.9826, 0.1645},   {14, 16, 613, 4096, 0.6302, 0.0848},
    {15, 32, 2048, 8192, 3.1355, 0.3768}, {16, 1, 293, 2048, 0.2082, 0.0030},
};
constexpr int kNumCases = static_cast<int>(sizeof(kCases) / sizeof(kCases[0]));

enum class Variant { kNaive, kFused, kInPlace };
constexpr Variant kAllVariants[] = {Variant::kNaive, Variant::kFused, Variant::kInPlace};

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kNaive: return "naive";
    case Variant::kFused: return "fused";
    case Variant::kInPlace: return "inplace";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Options of our own; Google Benchmark's --benchmark_* flags pass through untouched.

struct Options {
  std::vector<int> cases;  // empty: all 16
  bool random_positions = false;
  std::string dtype = "bf16";
  int64_t head_dim = 128;
  int64_t heads = 8;
  int64_t iters = 100;
  int64_t warmup = 3;
  bool check = true;
  bool primer = true;
  bool naive_first = false;  // --naive_first=1: each case's naive reference first (variant_order)
  bool flush_reads = false;  // --flush=read: the diagnostic flush by reads (clean lines in L2)
  bool chain_study = false;  // --study=chain: the dependent-load chain study instead of the cases
  bool workspace = true;  // the fused variant gets a workspace (BackwardParams::workspace)
  std::vector<Variant> variants{kAllVariants, kAllVariants + 3};
  std::string json_path = "kvrope_bench_results.json";
  uint64_t seed = 20261129;
  // Launch parameters of the fused variants: with none of the tuning flags, the launcher's own
  // (the device's kvrope::default_tuning()); with any, LaunchTuning{} with those fields changed.
  kvrope::LaunchTuning tuning;
  bool tuned = false;
};

Options g_options;

void print_usage() {
  std::printf(
      "kvrope_bench options (besides Google Benchmark's --benchmark_*):\n"
      "  --cases=1,4,8               subset of the 16 cases (default: all)\n"
      "  --variants=fused,inplace,naive  (default: all three; each case's naive reference runs last, see --naive_first)\n"
      "  --dtype=bf16|fp16|fp32      (default bf16)\n"
      "  --heads=N --head_dim=N      (default 8 and 128, as in the case table)\n"
      "  --positions=arange|random   cache_position = arange(S), or S distinct random rows of S_max\n"
      "  --iters=N                   timed calls per case and variant (default 100; the protocol wants >= 50)\n"
      "  --warmup=N                  untimed calls before the timed ones (default 3)\n"
      "  --block=N                   threads per block of the fused kernel (default: kvrope::default_tuning)\n"
      "  --blocks_per_sm=N           resident blocks per SM asked for (capped by occupancy)\n"
      "  --token_weight=X            LaunchTuning::token_warp_weight (out-of-place warp split, scalar path)\n"
      "  --bulk_stages=N             LaunchTuning::bulk_stages (32 KiB stages of the bulk-copy ring)\n"
      "  --bulk_slack=N              LaunchTuning::bulk_store_slack (stores still reading their stage)\n"
      "  --bulk_min_chunks=N         LaunchTuning::bulk_min_chunks_per_block (0: 32 KiB chunks always)\n"
      "  --bulk_spec=N               LaunchTuning::bulk_speculate_chunks (chunks loaded before the bitmask)\n"
      "  --token_zeros=0|1           LaunchTuning::token_zeros (token warps write the zeros of rows p)\n"
      "  --mask_late=0|1             LaunchTuning::mask_after_first_item (token warps' bitmask share after their first item)\n"
      "  --bulk=0|1                  LaunchTuning::bulk_copy (0: the register copy path)\n"
      "  --bulk_share=0|1            LaunchTuning::bulk_share_chunks (blocks share a large cache's chunks at run time)\n"
      "  --bulk_chunk=BYTES          LaunchTuning::bulk_chunk_bytes (most bytes of a chunk of the bulk copy)\n"
      "  --spec_large=0|1            LaunchTuning::bulk_speculate_large (speculated chunks for large caches too)\n"
      "  --share_min=N               LaunchTuning::bulk_share_min_chunks_per_block (share chunks above N a block)\n"
      "  --ip_prefetch=0|1|2|3       LaunchTuning::in_place_token_prefetch (in-place: items' cos/sin/key rows into L2 ahead; 3: the first item's gK/gV rows too)\n"
      "  --ip_spread=0|1             LaunchTuning::in_place_spread_items (in-place: a block per item, items dealt to blocks in turn)\n"
      "  --oop_spread=0|1            LaunchTuning::out_of_place_spread_items (out of place: items dealt to blocks in turn)\n"
      "  --study=chain               instead of the cases: one warp's k dependent loads, then its stores, timed\n"
      "                              by the same clock (the latency floor of a position -> rows -> stores chain)\n"
      "  --decode=0|1                LaunchTuning::decode_kernel (S = 1: the decode kernel)\n"
      "  --decode_mib=N              LaunchTuning::decode_copy_max_mib (out of place: caches up to N MiB take it)\n"
      "  --decode_block=N            LaunchTuning::decode_block_threads (out of place: its block size)\n"
      "  --decode_warps=N            LaunchTuning::decode_token_warps (warps a token, 1/2/4; 0: chosen)\n"
      "  --token_parts=N             LaunchTuning::token_parts (the fused kernel's warps a token, 1/2/4/8; 0: chosen)\n"
      "  --spec_rounds=N             LaunchTuning::bulk_speculate_mask_rounds (speculate when the bitmask takes <= N rounds)\n"
      "  --workspace=0|1             pass the fused variant a workspace (default 1; 0: each block copies a fixed share)\n"
      "  --no_check                  skip the check against the CPU float64 reference\n"
      "  --seed=N                    seed of the random inputs\n"
      "  --flush=write|read          the L2 flush writes its buffer (default: the protocol's) or reads it\n"
      "                              (diagnostic: no dirty lines for the call to write back)\n"
      "  --naive_first=1             each case's naive reference before its fused variants (default: after;\n"
      "                              run just before, it slowed the in-place variant)\n"
      "  --primer=0                  no primer kernel between the flush and the call (diagnostic: CUPTI's\n"
      "                              per-flush setup then lands on the call's first launch)\n"
      "  --kvrope_json=PATH          per-case results (default kvrope_bench_results.json)\n");
}

[[noreturn]] void bad_option(const std::string& arg, const char* why) {
  std::fprintf(stderr, "kvrope_bench: %s: %s\n", arg.c_str(), why);
  print_usage();
  std::exit(2);
}

int64_t parse_int(const std::string& arg, const std::string& text, int64_t lo) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == nullptr || *end != '\0' || v < lo) bad_option(arg, "expected an integer");
  return v;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// Reads our flags and removes them from argv, so benchmark::Initialize sees only its own.
// The LaunchTuning fields set by an integer flag (count) or a 0/1 flag (on), and the least value taken.
using TuningCount = int kvrope::LaunchTuning::*;
using TuningSwitch = bool kvrope::LaunchTuning::*;
struct TuningFlag {
  const char* name;
  TuningCount count;
  TuningSwitch on;
  int64_t min;
};
const TuningFlag* tuning_flag(const std::string& key) {
  using T = kvrope::LaunchTuning;
  static const TuningFlag flags[] = {
      {"--block", &T::block_threads, nullptr, 32},
      {"--blocks_per_sm", &T::blocks_per_sm, nullptr, 1},
      {"--bulk_stages", &T::bulk_stages, nullptr, 2},
      {"--bulk_slack", &T::bulk_store_slack, nullptr, 1},
      {"--bulk_min_chunks", &T::bulk_min_chunks_per_block, nullptr, 0},
      {"--bulk_spec", &T::bulk_speculate_chunks, nullptr, 0},
      {"--bulk", nullptr, &T::bulk_copy, 0},
      {"--token_zeros", nullptr, &T::token_zeros, 0},
      {"--mask_late", nullptr, &T::mask_after_first_item, 0},
      {"--bulk_share", nullptr, &T::bulk_share_chunks, 0},
      {"--bulk_chunk", &T::bulk_chunk_bytes, nullptr, 4096},
      {"--spec_large", nullptr, &T::bulk_speculate_large, 0},
      {"--share_min", &T::bulk_share_min_chunks_per_block, nullptr, 0},
      {"--ip_prefetch", &T::in_place_token_prefetch, nullptr, 0},
      {"--ip_spread", nullptr, &T::in_place_spread_items, 0},
      {"--oop_spread", nullptr, &T::out_of_place_spread_items, 0},
      {"--decode", nullptr, &T::decode_kernel, 0},
      {"--decode_mib", &T::decode_copy_max_mib, nullptr, 0},
      {"--decode_block", &T::decode_block_threads, nullptr, 64},
      {"--decode_warps", &T::decode_token_warps, nullptr, 0},
      {"--token_parts", &T::token_parts, nullptr, 0},
      {"--spec_rounds", &T::bulk_speculate_mask_rounds, nullptr, 1},
  };
  for (const TuningFlag& f : flags)
    if (key == f.name) return &f;
  return nullptr;
}

Options parse_options(int* argc, char** argv) {
  Options opt;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? std::string() : arg.substr(eq + 1);
    if (key == "--cases") {
      opt.cases.clear();
      for (const auto& p : split_commas(value)) {
        const int64_t id = parse_int(arg, p, 1);
        if (id > kNumCases) bad_option(arg, "case ids are 1..16");
        opt.cases.push_back(static_cast<int>(id));
      }
    } else if (key == "--variants") {
      opt.variants.clear();
      for (const auto& p : split_commas(value)) {
        bool found = false;
        for (Variant v : kAllVariants) {
          if (p == variant_name(v)) {
            opt.variants.push_back(v);
            found = true;
          }
        }
        if (!found) bad_option(arg, "variants are fused, inplace, naive");
      }
    } else if (key == "--dtype") {
      if (value != "bf16" && value != "fp16" && value != "fp32") bad_option(arg, "dtype is bf16, fp16 or fp32");
      opt.dtype = value;
    } else if (key == "--positions") {
      if (value != "arange" && value != "random") bad_option(arg, "positions are arange or random");
      opt.random_positions = value == "random";
    } else if (key == "--head_dim") {
      opt.head_dim = parse_int(arg, value, 2);
      if (opt.head_dim % 2 != 0) bad_option(arg, "head_dim must be even");
    } else if (key == "--heads") {
      opt.heads = parse_int(arg, value, 1);
    } else if (key == "--iters") {
      opt.iters = parse_int(arg, value, 1);
    } else if (key == "--warmup") {
      opt.warmup = parse_int(arg, value, 0);
    } else if (key == "--seed") {
      opt.seed = static_cast<uint64_t>(parse_int(arg, value, 0));
    } else if (key == "--study") {
      if (value != "chain") bad_option(arg, "the study is chain");
      opt.chain_study = true;
    } else if (key == "--flush") {
      if (value != "write" && value != "read") bad_option(arg, "the flush is write or read");
      opt.flush_reads = value == "read";
    } else if (key == "--naive_first") {
      opt.naive_first = parse_int(arg, value, 0) != 0;
    } else if (key == "--primer") {
      opt.primer = parse_int(arg, value, 0) != 0;
    } else if (key == "--workspace") {
      opt.workspace = parse_int(arg, value, 0) != 0;
    } else if (const TuningFlag* flag = tuning_flag(key)) {
      const int64_t v = parse_int(arg, value, flag->min);
      if (flag->count) opt.tuning.*flag->count = static_cast<int>(v);
      if (flag->on) opt.tuning.*flag->on = v != 0;
      opt.tuned = true;
    } else if (key == "--token_weight") {
      const double weight = std::stod(value);
      if (weight > 0) {  // 0 or less leaves the default
        opt.tuning.token_warp_weight = weight;
        opt.tuned = true;
      }
    } else if (key == "--no_check") {
      opt.check = false;
    } else if (key == "--kvrope_json") {
      if (value.empty()) bad_option(arg, "expected a path");
      opt.json_path = value;
    } else {
      if (key == "--help" || key == "-h") print_usage();
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  if (opt.variants.empty()) bad_option("--variants", "no variant selected");
  return opt;
}

// ---------------------------------------------------------------------------------------------
// CUPTI activity collection. CUPTI hands over filled buffers through a callback (possibly from
// its own thread); we keep the [start, end] of every kernel, memcpy and memset record.

namespace cupti {

struct Span {
  uint64_t start;
  uint64_t end;
  bool harness;  // a kernel of the bench's own clock machinery (L2 flush, primer), never part of a call
};

bool is_harness_kernel(const char* name) {
  return name != nullptr && (std::strstr(name, "harness_l2_flush_kernel") != nullptr ||
                             std::strstr(name, "harness_primer_kernel") != nullptr);
}

std::mutex g_mutex;
std::vector<Span> g_spans;
std::vector<uint8_t*> g_free_buffers;
constexpr size_t kBufferBytes = size_t{2} << 20;

// A fresh buffer is touched once here: CUPTI asks for one at the first activity after each flush,
// that is at the timed call itself, and page faults on untouched memory there would land in the
// CUDA-event time. Delivered buffers go back to a pool instead of being freed.
uint8_t* new_buffer() {
  // Records are 8-byte aligned inside an 8-byte-aligned buffer.
  auto* buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  if (buffer == nullptr) {
    std::fprintf(stderr, "kvrope_bench: out of host memory for a CUPTI buffer\n");
    std::abort();
  }
  std::memset(buffer, 0, kBufferBytes);
  return buffer;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_free_buffers.empty()) {
      *buffer = g_free_buffers.back();
      g_free_buffers.pop_back();
    } else {
      *buffer = nullptr;
    }
  }
  if (*buffer == nullptr) *buffer = new_buffer();
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::vector<Span> spans;
  CUpti_Activity* record = nullptr;
  for (;;) {
    const CUptiResult res = cuptiActivityGetNextRecord(buffer, valid_bytes, &record);
    if (res == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
    KVROPE_BENCH_CUPTI(res);
    Span span{0, 0, false};
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        span = {k->start, k->end, is_harness_kernel(k->name)};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        span = {m->start, m->end, false};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        span = {m->start, m->end, false};
        break;
      }
      default: break;
    }
    // Start and end both 0: CUPTI could not time this one.
    if (span.start != 0 || span.end != 0) spans.push_back(span);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_spans.insert(g_spans.end(), spans.begin(), spans.end());
  g_free_buffers.push_back(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                          CUPTI_ACTIVITY_KIND_MEMSET};

// Tracing slows every launch down (and CUPTI's per-flush setup lands on the next launch), so the
// CUDA-event times a caller would see are measured with tracing off.
void set_tracing(bool on) {
  for (CUpti_ActivityKind kind : kKinds) {
    KVROPE_BENCH_CUPTI(on ? cuptiActivityEnable(kind) : cuptiActivityDisable(kind));
  }
}

void init() {
  for (int i = 0; i < 8; ++i) g_free_buffers.push_back(new_buffer());
  KVROPE_BENCH_CUPTI(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  set_tracing(true);
}

// Delivers every completed record (call after a device synchronize) and returns the spans
// collected since the last take().
std::vector<Span> flush_and_take(bool forced = false) {
  KVROPE_BENCH_CUPTI(cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0));
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<Span> spans;
  spans.swap(g_spans);
  return spans;
}

}  // namespace cupti

// ---------------------------------------------------------------------------------------------
// Device helpers: seeded normal inputs, the L2 flush, an empty kernel.

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ inline void store_float(float v, float* p) { *p = v; }
__device__ inline void store_float(float v, __half* p) { *p = __float2half_rn(v); }
__device__ inline void store_float(float v, __nv_bfloat16* p) { *p = __float2bfloat16_rn(v); }

// Standard normal samples from a counter-based hash and Box-Muller: element i depends only on
// (seed, i), so any size fills at memory speed and the same seed gives the same tensors.
template <typename T>
__global__ void fill_normal_kernel(T* out, int64_t n, uint64_t seed) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
    // 23-bit uniforms offset by half a step: u1 in (0, 1) (log finite, never 0), and 2*u2 never
    // lands on an odd multiple of 1/2, so cos never returns an exact zero.
    const float u1 = (static_cast<float>(h >> 41) + 0.5f) * 0x1p-23f;
    const float u2 = (static_cast<float>((h >> 9) & 0x7FFFFF) + 0.5f) * 0x1p-23f;
    float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    // Inputs are never zero, even after rounding to fp16.
    if (fabsf(z) < 0x1p-10f) z = copysignf(0x1p-10f, z);
    store_float(z, out + i);
  }
}

// Writes every 16 bytes of the buffer with a value that changes per call (the protocol's flush: it
// leaves the L2 full of dirty lines). With `read` (--flush=read, a diagnostic) it reads them instead
// (l2_read_flush.cuh), leaving clean lines; the sum (0 for the buffer's 0x5a bytes) is stored only if
// it equals the salt (1 and up), so that the loads stay. (One kernel either way: the bench knows its
// flush's activity record by this kernel's name.)
__global__ void harness_l2_flush_kernel(uint4* buf, int64_t n, uint32_t salt, bool read) {
  if (read) {
    if (kvrope_tools::read_sweep(buf, n) == salt) buf[0].x = salt;
    return;
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t lo = static_cast<uint32_t>(i);
    buf[i] = make_uint4(salt, lo, ~salt, lo ^ salt);
  }
}

__global__ void empty_kernel() {}

// Launched between the drain of the flush's records and the timed call, so that CUPTI's per-flush
// setup (a new activity buffer, ...) happens here and not inside the call's CUDA-event span.
__global__ void harness_primer_kernel() {}

// Owns one cudaMalloc allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) KVROPE_BENCH_CUDA(cudaMalloc(&ptr_, bytes));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) KVROPE_BENCH_CUDA(cudaFree(ptr_));
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void swap(DeviceBuffer& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Uninitialized host array (the big cases' caches are half a gigabyte; zeroing them is waste).
template <typename T>
class HostArray {
 public:
  HostArray() = default;
  explicit HostArray(size_t n) : data_(static_cast<T*>(std::malloc(std::max<size_t>(n, 1) * sizeof(T)))), n_(n) {
    if (!data_) {
      std::fprintf(stderr, "kvrope_bench: out of host memory (%zu bytes)\n", n * sizeof(T));
      std::abort();
    }
  }
  T* data() const { return data_.get(); }
  size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t n_ = 0;
};

template <typename T>
HostArray<T> to_host(const DeviceBuffer& buf) {
  HostArray<T> host(buf.bytes() / sizeof(T));
  KVROPE_BENCH_CUDA(cudaMemcpy(host.data(), buf.as<T>(), buf.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

struct DeviceInfo {
  int device = 0;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t global_bytes = 0;
  int sm_clock_khz = 0;   // peak, as CUDA reports it (0: not reported)
  int mem_clock_khz = 0;  // peak, as CUDA reports it (0: not reported)
  int mem_bus_bits = 0;
  int driver_version = 0, runtime_version = 0;
};

DeviceInfo g_device;

DeviceInfo query_device() {
  DeviceInfo d;
  KVROPE_BENCH_CUDA(cudaGetDevice(&d.device));
  cudaDeviceProp prop{};
  KVROPE_BENCH_CUDA(cudaGetDeviceProperties(&prop, d.device));
  d.name = prop.name;
  d.major = prop.major;
  d.minor = prop.minor;
  d.sm_count = prop.multiProcessorCount;
  d.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  d.global_bytes = prop.totalGlobalMem;
  // The clock attributes may be unsupported on some drivers; they are informational only.
  if (cudaDeviceGetAttribute(&d.sm_clock_khz, cudaDevAttrClockRate, d.device) != cudaSuccess) d.sm_clock_khz = 0;
  if (cudaDeviceGetAttribute(&d.mem_clock_khz, cudaDevAttrMemoryClockRate, d.device) != cudaSuccess)
    d.mem_clock_khz = 0;
  if (cudaDeviceGetAttribute(&d.mem_bus_bits, cudaDevAttrGlobalMemoryBusWidth, d.device) != cudaSuccess)
    d.mem_bus_bits = 0;
  (void)cudaGetLastError();  // clear a failed attribute query
  KVROPE_BENCH_CUDA(cudaDriverGetVersion(&d.driver_version));
  KVROPE_BENCH_CUDA(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

int fill_blocks() { return std::max(1, g_device.sm_count) * 8; }

template <typename T>
void fill_normal(T* out, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_normal_kernel<T><<<fill_blocks(), 256, 0, stream>>>(out, n, seed);
  KVROPE_BENCH_CUDA(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------
// The clock: one timed call under the protocol.

struct Sample {
  double cupti_us = 0;  // first start to last end over the GPU activities of the call
  double event_us = 0;  // CUDA events recorded on the stream around the launcher call (tracing on)
  int activities = 0;   // kernels + memcpys + memsets of the call
};

class GpuClock {
 public:
  GpuClock(cudaStream_t stream, size_t l2_bytes) : stream_(stream), flush_(std::max<size_t>(2 * l2_bytes, 1 << 20)) {
    // Written once here, so that a flush by reads (--flush=read) reads defined bytes.
    KVROPE_BENCH_CUDA(cudaMemset(flush_.as<void>(), 0x5a, flush_.bytes()));
    KVROPE_BENCH_CUDA(cudaEventCreate(&start_));
    KVROPE_BENCH_CUDA(cudaEventCreate(&stop_));
  }
  GpuClock(const GpuClock&) = delete;
  GpuClock& operator=(const GpuClock&) = delete;
  ~GpuClock() {
    KVROPE_BENCH_CUDA(cudaEventDestroy(start_));
    KVROPE_BENCH_CUDA(cudaEventDestroy(stop_));
  }

  cudaStream_t stream() const { return stream_; }
  size_t flush_bytes() const { return flush_.bytes(); }

  // prepare(stream) runs before the flush (outside the timed span, and its data is evicted from L2);
  // call(stream) is what gets timed. Returns activities == 0 when the call recorded no GPU work.
  template <typename Prepare, typename Call>
  Sample time(Prepare&& prepare, Call&& call) {
    prepare_and_flush(prepare);

    // Drain the records of everything before the call (the flush, the restore of in-place inputs,
    // anything earlier). The flush kernel is the last of them, so the end of its record is a fence:
    // every activity of the call starts after it, and a straggler record from before the call that
    // CUPTI delivers late still ends before it.
    uint64_t fence = 0;
    bool flush_seen = false;
    for (int attempt = 0; attempt < 2 && !flush_seen; ++attempt) {
      for (const auto& s : cupti::flush_and_take(attempt > 0)) {
        fence = std::max(fence, s.end);
        flush_seen = flush_seen || s.harness;
      }
    }
    if (!flush_seen) {
      std::fprintf(stderr, "kvrope_bench: CUPTI delivered no record of the L2 flush kernel\n");
      std::abort();
    }
    // CUPTI's setup after a flush lands on the primer, not on the call; its record is dropped by name.
    if (g_options.primer) {
      harness_primer_kernel<<<1, 32, 0, stream_>>>();
      KVROPE_BENCH_CUDA(cudaGetLastError());
      KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
    }

    const double event_us = event_timed(call);

    Sample sample;
    uint64_t first = UINT64_MAX, last = 0;
    for (int attempt = 0; attempt < 2 && sample.activities == 0; ++attempt) {
      for (const auto& s : cupti::flush_and_take(attempt > 0)) {
        if (s.start < fence || s.harness) continue;
        first = std::min(first, s.start);
        last = std::max(last, s.end);
        ++sample.activities;
      }
    }
    sample.event_us = event_us;
    sample.cupti_us = sample.activities > 0 && last >= first ? 1e-3 * static_cast<double>(last - first) : 0.0;
    return sample;
  }

  template <typename Call>
  Sample time(Call&& call) {
    return time([](cudaStream_t) {}, std::forward<Call>(call));
  }

  // The same protocol with CUPTI tracing off (cupti::set_tracing(false) first): only the CUDA-event
  // time around the call, in us, launch overhead included.
  template <typename Prepare, typename Call>
  double time_events(Prepare&& prepare, Call&& call) {
    prepare_and_flush(prepare);
    return event_timed(call);
  }

 private:
  // prepare(stream), then the L2 flush (a 2 x L2 write), then a device synchronization.
  template <typename Prepare>
  void prepare_and_flush(Prepare&& prepare) {
    prepare(stream_);
    const int64_t n = static_cast<int64_t>(flush_.bytes() / sizeof(uint4));
    harness_l2_flush_kernel<<<fill_blocks(), 256, 0, stream_>>>(flush_.as<uint4>(), n, ++salt_, g_options.flush_reads);
    KVROPE_BENCH_CUDA(cudaGetLastError());
    KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
  }

  // call(stream) between two CUDA events, synchronized; returns the event time in us.
  template <typename Call>
  double event_timed(Call&& call) {
    KVROPE_BENCH_CUDA(cudaEventRecord(start_, stream_));
    call(stream_);
    KVROPE_BENCH_CUDA(cudaEventRecord(stop_, stream_));
    KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
    float event_ms = 0;
    KVROPE_BENCH_CUDA(cudaEventElapsedTime(&event_ms, start_, stop_));
    return 1e3 * static_cast<double>(event_ms);
  }

  cudaStream_t stream_;
  DeviceBuffer flush_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  uint32_t salt_ = 0;
};

std::unique_ptr<GpuClock> g_clock;

double median_of(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double percentile_of(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::lround(q * static_cast<double>(v.size() - 1)));
  return v[std::min(i, v.size() - 1)];
}

// ---------------------------------------------------------------------------------------------
// The floor: copy bandwidth of a large cudaMemcpyAsync and an empty kernel, under the same clock.

struct Calibration {
  size_t copy_bytes = 0;          // size of the copy (read + write = twice this)
  double copy_median_us = 0;
  double bandwidth_bytes_per_us = 0;  // (read + written) / time
  double empty_kernel_us = 0;
  double empty_kernel_event_us = 0;  // CUDA-event time of the empty kernel: the launch overhead alone
  int copy_calls = 0, empty_calls = 0;
};

Calibration g_calibration;

Calibration calibrate() {
  Calibration c;
  c.copy_bytes = size_t{1} << 30;
  c.copy_calls = 20;
  c.empty_calls = 50;
  {
    DeviceBuffer src(c.copy_bytes), dst(c.copy_bytes);
    KVROPE_BENCH_CUDA(cudaMemset(src.as<void>(), 1, c.copy_bytes));
    std::vector<double> t;
    for (int i = 0; i < c.copy_calls + 2; ++i) {
      const Sample s = g_clock->time([&](cudaStream_t st) {
        KVROPE_BENCH_CUDA(cudaMemcpyAsync(dst.as<void>(), src.as<void>(), c.copy_bytes, cudaMemcpyDeviceToDevice, st));
      });
      if (s.activities == 0) {
        std::fprintf(stderr, "kvrope_bench: no CUPTI record for the calibration copy\n");
        std::abort();
      }
      if (i >= 2) t.push_back(s.cupti_us);  // the first two warm up
    }
    c.copy_median_us = median_of(t);
    c.bandwidth_bytes_per_us = 2.0 * static_cast<double>(c.copy_bytes) / c.copy_median_us;
  }
  auto empty = [](cudaStream_t st) {
    empty_kernel<<<1, 32, 0, st>>>();
    KVROPE_BENCH_CUDA(cudaGetLastError());
  };
  std::vector<double> t, ev;
  for (int i = 0; i < c.empty_calls + 2; ++i) {
    const Sample s = g_clock->time(empty);
    if (s.activities == 0) {
      std::fprintf(stderr, "kvrope_bench: no CUPTI record for the empty kernel\n");
      std::abort();
    }
    if (i >= 2) t.push_back(s.cupti_us);
  }
  c.empty_kernel_us = median_of(t);
  cupti::set_tracing(false);
  for (int i = 0; i < c.empty_calls + 2; ++i) {
    const double us = g_clock->time_events([](cudaStream_t) {}, empty);
    if (i >= 2) ev.push_back(us);
  }
  cupti::set_tracing(true);
  c.empty_kernel_event_us = median_of(ev);
  return c;
}

// The chain study (--study=chain; docs/perf-notes.md, v11): one warp loads 16 bytes a lane from
// each of `loads` buffers in turn, each load's address taken from the previous load's value (all
// values are zero: the same line of every buffer), then stores `stores` x 512 bytes. Its CUPTI time
// after the L2 flush is the least any kernel takes whose stores wait on that many dependent memory
// round trips: with loads = 2 and 16 stores, the in-place backward of one token (its position, then
// the rows at it, then 8 KiB of outputs).
struct ChainBuffers {
  const uint4* buf[3];  // kernel parameters: no load of their own
};
// The same with 768 bytes of parameters (the fused kernel's BackwardArgs is about as large), the
// pointers last.
struct BigChainBuffers {
  unsigned char pad[744];
  const uint4* buf[3];
};
template <typename Buffers>
__global__ void chain_kernel(const Buffers bufs, int loads, uint4* out, int stores, int use_shared) {
  extern __shared__ uint4 chain_shared[];
  const int lane = threadIdx.x & 31;
  uint32_t offset = 0;
  uint4 v = make_uint4(0, 0, 0, 0);
  for (int i = 0; i < loads; ++i) {
    v = bufs.buf[i][offset + lane];
    offset = v.x;  // zero: the dependence alone
  }
  if (use_shared) {  // through shared memory once, so that the kernel uses what it asked for
    chain_shared[lane] = v;
    __syncwarp();
    v = chain_shared[lane ^ 1];
  }
  for (int i = 0; i < stores; ++i) out[i * 32 + lane] = v;
}

void run_chain_study() {
  constexpr int kMaxLoads = static_cast<int>(std::size(ChainBuffers{}.buf));
  constexpr size_t kBufBytes = size_t{4} << 20;  // separate allocations, as a call's tensors are
  std::vector<DeviceBuffer> bufs;
  ChainBuffers ptrs{};
  BigChainBuffers big{};
  for (int i = 0; i < kMaxLoads; ++i) {
    bufs.emplace_back(kBufBytes);
    KVROPE_BENCH_CUDA(cudaMemset(bufs.back().as<void>(), 0, kBufBytes));
    ptrs.buf[i] = big.buf[i] = bufs.back().as<const uint4>();
  }
  DeviceBuffer out(kBufBytes);
  constexpr int kBigShared = 200 * 1024;
  KVROPE_BENCH_CUDA(cudaFuncSetAttribute(chain_kernel<ChainBuffers>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBigShared));
  std::printf("chain study: one warp, k dependent 16-byte loads a lane (separate 4 MiB buffers), then n x 512 B of\n"
              "stores; CUPTI median of %lld calls, L2 flushed before each (the empty kernel: %.3f us)\n",
              static_cast<long long>(g_options.iters), g_calibration.empty_kernel_us);
  auto time_it = [&](const char* what, int loads, int stores, auto&& launch) {
    std::vector<double> t;
    for (int64_t i = 0; i < g_options.iters + 2; ++i) {
      const Sample s = g_clock->time([&](cudaStream_t st) {
        launch(st);
        KVROPE_BENCH_CUDA(cudaGetLastError());
      });
      if (i >= 2) t.push_back(s.cupti_us);
    }
    std::printf("chain: loads %d, stores %2d x 512 B%s: median %.3f us, p10 %.3f, p90 %.3f\n", loads, stores, what,
                median_of(t), percentile_of(t, 0.1), percentile_of(t, 0.9));
  };
  for (const int stores : {0, 1, 16})
    for (int loads = 0; loads <= kMaxLoads; ++loads) {
      if (stores == 0 && loads > 0) continue;
      time_it("", loads, stores, [&](cudaStream_t st) {
        chain_kernel<<<1, 32, 0, st>>>(ptrs, loads, out.as<uint4>(), stores, 0);
      });
    }
  // What else a kernel brings: shared memory (the carveout it needs), a large parameter block.
  for (const int shared : {512, 48 * 1024, kBigShared}) {
    char what[64];
    std::snprintf(what, sizeof(what), ", %d B of shared memory", shared);
    for (const int loads : {0, 2})
      time_it(what, loads, 16, [&](cudaStream_t st) {
        chain_kernel<<<1, 32, shared, st>>>(ptrs, loads, out.as<uint4>(), 16, 1);
      });
  }
  for (const int loads : {0, 2})
    time_it(", 768 B of parameters", loads, 16, [&](cudaStream_t st) {
      chain_kernel<<<1, 32, 0, st>>>(big, loads, out.as<uint4>(), 16, 0);
    });
  std::fflush(stdout);
}

// Least bytes each variant must move (DESIGN.md section 5).
struct Traffic {
  double out_of_place = 0;  // 4*B*H*S_max*D + 3*B*H*S*D + 4*B*S*D elements
  double in_place = 0;      // 7*B*H*S*D + 4*B*S*D elements: read and zero rows p of gK, gV, no cache copy
};

Traffic traffic_of(const LeaderboardCase& lc, size_t elem_bytes) {
  const double b = static_cast<double>(lc.batch), s = static_cast<double>(lc.seq_len);
  const double smax = static_cast<double>(lc.cache_len);
  const double h = static_cast<double>(g_options.heads), d = static_cast<double>(g_options.head_dim);
  const double e = static_cast<double>(elem_bytes);
  Traffic t;
  t.out_of_place = e * (4 * b * h * smax * d + 3 * b * h * s * d + 4 * b * s * d);
  t.in_place = e * (7 * b * h * s * d + 4 * b * s * d);
  return t;
}

double floor_us(double bytes) {
  return std::max(bytes / g_calibration.bandwidth_bytes_per_us, g_calibration.empty_kernel_us);
}

// ---------------------------------------------------------------------------------------------
// Results, filled by the benchmarks and read by the summary.

struct VariantResult {
  double median_us = 0, min_us = 0, mean_us = 0, p90_us = 0, max_us = 0;
  double event_median_us = 0;         // CUDA events, tracing off (a separate run of as many calls)
  double event_traced_median_us = 0;  // CUDA events around the CUPTI-timed calls themselves
  double activities = 0;  // GPU activities per call (median)
  bool checked = false;
  std::vector<double> cupti_us, event_us, event_traced_us;
};

struct CaseResult {
  LeaderboardCase lc{};
  Traffic bytes;
  double floor_us = 0, inplace_floor_us = 0;
  std::map<Variant, VariantResult> variants;
};

std::map<int, CaseResult> g_results;

// ---------------------------------------------------------------------------------------------
// One case's tensors, shared by its variants (only one case is alive at a time).

struct CaseDataBase {
  virtual ~CaseDataBase() = default;
  int case_id = 0;
};

std::unique_ptr<CaseDataBase> g_case;

template <typename T>
struct CaseData : CaseDataBase {
  using Pos = int64_t;
  int64_t B = 0, H = 0, S = 0, Smax = 0, D = 0;
  size_t cache_elems = 0, state_elems = 0, token_elems = 0;

  // Inputs; gk and gv are also the pristine copies the in-place variant is restored from.
  DeviceBuffer gk, gv, k, cos, sin, pos, error_flag, workspace;
  // Outputs of every variant (the in-place one writes gks, gvs, gcos, gsin too).
  DeviceBuffer gks, gvs, gcos, gsin;
  // Out-of-place cache-input gradients (fused and naive), in-place working caches, naive workspace.
  DeviceBuffer gk_in, gv_in, gk_work, gv_work, naive_ws;
  bool naive_ws_ready = false;

  // Host copies of the inputs, made at the first check.
  HostArray<T> gk_h, gv_h, k_h, cos_h, sin_h;
  std::vector<Pos> pos_h;
  bool host_ready = false;

  CaseData(const LeaderboardCase& lc, cudaStream_t stream) {
    case_id = lc.id;
    B = lc.batch;
    H = g_options.heads;
    S = lc.seq_len;
    Smax = lc.cache_len;
    D = g_options.head_dim;
    cache_elems = static_cast<size_t>(B * H * Smax * D);
    state_elems = static_cast<size_t>(B * H * S * D);
    token_elems = static_cast<size_t>(B * S * D);

    gk = DeviceBuffer(cache_elems * sizeof(T));
    gv = DeviceBuffer(cache_elems * sizeof(T));
    k = DeviceBuffer(state_elems * sizeof(T));
    cos = DeviceBuffer(token_elems * sizeof(T));
    sin = DeviceBuffer(token_elems * sizeof(T));
    gks = DeviceBuffer(state_elems * sizeof(T));
    gvs = DeviceBuffer(state_elems * sizeof(T));
    gcos = DeviceBuffer(token_elems * sizeof(T));
    gsin = DeviceBuffer(token_elems * sizeof(T));
    pos = DeviceBuffer(static_cast<size_t>(S) * sizeof(Pos));
    error_flag = DeviceBuffer(sizeof(int));
    workspace = DeviceBuffer(kvrope::kBackwardWorkspaceBytes);

    const uint64_t seed = splitmix64(g_options.seed ^ (static_cast<uint64_t>(lc.id) << 32));
    fill_normal(gk.as<T>(), static_cast<int64_t>(cache_elems), seed + 1, stream);
    fill_normal(gv.as<T>(), static_cast<int64_t>(cache_elems), seed + 2, stream);
    fill_normal(k.as<T>(), static_cast<int64_t>(state_elems), seed + 3, stream);
    fill_normal(cos.as<T>(), static_cast<int64_t>(token_elems), seed + 4, stream);
    fill_normal(sin.as<T>(), static_cast<int64_t>(token_elems), seed + 5, stream);

    pos_h.resize(static_cast<size_t>(S));
    if (g_options.random_positions) {
      // S distinct rows of S_max in random order: neither contiguous nor sorted.
      std::vector<Pos> rows(static_cast<size_t>(Smax));
      std::iota(rows.begin(), rows.end(), Pos{0});
      std::mt19937_64 rng(seed);
      std::shuffle(rows.begin(), rows.end(), rng);
      std::copy(rows.begin(), rows.begin() + S, pos_h.begin());
    } else {
      std::iota(pos_h.begin(), pos_h.end(), Pos{0});
    }
    KVROPE_BENCH_CUDA(cudaMemcpy(pos.as<Pos>(), pos_h.data(), pos.bytes(), cudaMemcpyHostToDevice));
    KVROPE_BENCH_CUDA(cudaMemset(error_flag.as<int>(), 0, sizeof(int)));
    KVROPE_BENCH_CUDA(cudaMemset(workspace.as<void>(), 0, workspace.bytes()));  // zeroed once: the kernel leaves it zero
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  void need_out_of_place() {
    if (!gk_in) gk_in = DeviceBuffer(cache_elems * sizeof(T));
    if (!gv_in) gv_in = DeviceBuffer(cache_elems * sizeof(T));
  }
  void need_in_place() {
    if (!gk_work) gk_work = DeviceBuffer(cache_elems * sizeof(T));
    if (!gv_work) gv_work = DeviceBuffer(cache_elems * sizeof(T));
  }

  template <typename Params>
  void fill_common(Params& p) const {
    p.batch = B;
    p.heads = H;
    p.seq_len = S;
    p.cache_len = Smax;
    p.head_dim = D;
    p.key_states = kvrope::bhsd(static_cast<const T*>(k.as<T>()), H, S, D);
    p.cos = kvrope::bsd(static_cast<const T*>(cos.as<T>()), S, D);
    p.sin = kvrope::bsd(static_cast<const T*>(sin.as<T>()), S, D);
    p.cache_position = pos.as<const Pos>();
    p.grad_key_states = kvrope::bhsd(gks.as<T>(), H, S, D);
    p.grad_value_states = kvrope::bhsd(gvs.as<T>(), H, S, D);
    p.grad_cos = kvrope::bsd(gcos.as<T>(), S, D);
    p.grad_sin = kvrope::bsd(gsin.as<T>(), S, D);
    p.error_flag = error_flag.as<int>();
  }

  kvrope::BackwardParams<T, Pos> out_of_place() const {
    kvrope::BackwardParams<T, Pos> p;
    fill_common(p);
    p.grad_key_cache = kvrope::bhsd(static_cast<const T*>(gk.as<T>()), H, Smax, D);
    p.grad_value_cache = kvrope::bhsd(static_cast<const T*>(gv.as<T>()), H, Smax, D);
    p.grad_key_cache_input = kvrope::bhsd(gk_in.as<T>(), H, Smax, D);
    p.grad_value_cache_input = kvrope::bhsd(gv_in.as<T>(), H, Smax, D);
    p.workspace = g_options.workspace ? workspace.as<void>() : nullptr;
    return p;
  }

  kvrope::BackwardInPlaceParams<T, Pos> in_place() const {
    kvrope::BackwardInPlaceParams<T, Pos> p;
    fill_common(p);
    p.grad_key_cache = kvrope::bhsd(gk_work.as<T>(), H, Smax, D);
    p.grad_value_cache = kvrope::bhsd(gv_work.as<T>(), H, Smax, D);
    return p;
  }

  // Restores the in-place working caches from the pristine inputs.
  void restore_in_place(cudaStream_t stream) const {
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(gk_work.as<void>(), gk.as<void>(), gk.bytes(), cudaMemcpyDeviceToDevice, stream));
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(gv_work.as<void>(), gv.as<void>(), gv.bytes(), cudaMemcpyDeviceToDevice, stream));
  }

  void* naive_workspace(size_t* bytes) {
    if (!naive_ws_ready) {
      const size_t n = kvrope::reference::naive_backward_workspace_bytes(out_of_place());
      naive_ws = DeviceBuffer(n);
      naive_ws_ready = true;
    }
    *bytes = naive_ws.bytes();
    return naive_ws.as<void>();
  }

  // Poisons the outputs (all bits set: NaN in every dtype) so an output the call leaves unwritten fails the check.
  void poison_outputs(cudaStream_t stream, bool cache_inputs) const {
    for (const DeviceBuffer* b : {&gks, &gvs, &gcos, &gsin}) {
      KVROPE_BENCH_CUDA(cudaMemsetAsync(b->as<void>(), 0xFF, b->bytes(), stream));
    }
    if (cache_inputs) {
      KVROPE_BENCH_CUDA(cudaMemsetAsync(gk_in.as<void>(), 0xFF, gk_in.bytes(), stream));
      KVROPE_BENCH_CUDA(cudaMemsetAsync(gv_in.as<void>(), 0xFF, gv_in.bytes(), stream));
    }
  }

  void copy_inputs_to_host() {
    if (host_ready) return;
    gk_h = to_host<T>(gk);
    gv_h = to_host<T>(gv);
    k_h = to_host<T>(k);
    cos_h = to_host<T>(cos);
    sin_h = to_host<T>(sin);
    host_ready = true;
  }

  // The inputs as the CPU reference takes them: input pointers on the host, outputs unused.
  kvrope::BackwardParams<T, Pos> host_inputs() const {
    kvrope::BackwardParams<T, Pos> p = out_of_place();
    p.key_states.data = k_h.data();
    p.cos.data = cos_h.data();
    p.sin.data = sin_h.data();
    p.cache_position = pos_h.data();
    p.grad_key_cache.data = gk_h.data();
    p.grad_value_cache.data = gv_h.data();
    p.error_flag = nullptr;
    p.workspace = nullptr;
    return p;
  }

  // Copies what the call wrote to the host and compares with the float64 reference.
  // Returns an empty string when everything matches.
  std::string check(const DeviceBuffer& cache_k_out, const DeviceBuffer& cache_v_out) {
    copy_inputs_to_host();
    const HostArray<T> gks_h = to_host<T>(gks), gvs_h = to_host<T>(gvs);
    const HostArray<T> gcos_h = to_host<T>(gcos), gsin_h = to_host<T>(gsin);
    const HostArray<T> gk_out_h = to_host<T>(cache_k_out), gv_out_h = to_host<T>(cache_v_out);
    kvrope::reference::BackwardOutputs<T> out;
    out.grad_key_states = kvrope::bhsd(static_cast<const T*>(gks_h.data()), H, S, D);
    out.grad_value_states = kvrope::bhsd(static_cast<const T*>(gvs_h.data()), H, S, D);
    out.grad_key_cache_input = kvrope::bhsd(static_cast<const T*>(gk_out_h.data()), H, Smax, D);
    out.grad_value_cache_input = kvrope::bhsd(static_cast<const T*>(gv_out_h.data()), H, Smax, D);
    out.grad_cos = kvrope::bsd(static_cast<const T*>(gcos_h.data()), S, D);
    out.grad_sin = kvrope::bsd(static_cast<const T*>(gsin_h.data()), S, D);
    const kvrope::reference::CheckResult r = kvrope::reference::check_backward(host_inputs(), out);
    if (r.ok()) return std::string();
    return "check failed: " + std::to_string(r.mismatches) + " of " + std::to_string(r.checked) +
           " elements mismatch; first: " + r.first_mismatch;
  }

  // The kernel must leave its workspace zero for the next call.
  bool workspace_zero() const {
    uint32_t words[kvrope::kBackwardWorkspaceBytes / 4] = {};
    KVROPE_BENCH_CUDA(cudaMemcpy(words, workspace.as<void>(), sizeof(words), cudaMemcpyDeviceToHost));
    return std::all_of(std::begin(words), std::end(words), [](uint32_t w) { return w == 0; });
  }

  int read_error_flag() const {
    int flag = 0;
    KVROPE_BENCH_CUDA(cudaMemcpy(&flag, error_flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost));
    return flag;
  }
};

template <typename T>
CaseData<T>& acquire_case(const LeaderboardCase& lc) {
  auto* current = dynamic_cast<CaseData<T>*>(g_case.get());
  if (current == nullptr || current->case_id != lc.id) {
    g_case.reset();  // free the previous case before allocating this one
    g_case = std::make_unique<CaseData<T>>(lc, g_clock->stream());
    current = static_cast<CaseData<T>*>(g_case.get());
  }
  return *current;
}

std::string status_message(const char* what, const kvrope::Status& st) {
  std::string msg = std::string(what) + " returned " + kvrope::to_string(st.code);
  if (st.field != nullptr) msg += std::string(" (") + st.field + ")";
  if (st.cuda_error != cudaSuccess) msg += std::string(": ") + cudaGetErrorString(st.cuda_error);
  return msg;
}

// ---------------------------------------------------------------------------------------------
// The benchmark of one (case, variant).

template <typename T>
void run_variant(benchmark::State& state, const LeaderboardCase& lc, Variant variant) {
  CaseData<T>& data = acquire_case<T>(lc);
  const cudaStream_t stream = g_clock->stream();
  const bool in_place = variant == Variant::kInPlace;
  if (in_place) {
    data.need_in_place();
  } else {
    data.need_out_of_place();
  }
  const auto oop = data.out_of_place();
  const auto ip = data.in_place();
  size_t ws_bytes = 0;
  void* ws = variant == Variant::kNaive ? data.naive_workspace(&ws_bytes) : nullptr;

  kvrope::Status status;
  // The tuning flags override the device's default launch parameters (tuning sweeps).
  const bool tuned = g_options.tuned;
  const kvrope::LaunchTuning& tuning = g_options.tuning;
  auto launch = [&](cudaStream_t st) {
    switch (variant) {
      case Variant::kFused:
        status = tuned ? kvrope::kv_cache_rope_backward(oop, tuning, st) : kvrope::kv_cache_rope_backward(oop, st);
        break;
      case Variant::kInPlace:
        status = tuned ? kvrope::kv_cache_rope_backward(ip, tuning, st) : kvrope::kv_cache_rope_backward(ip, st);
        break;
      case Variant::kNaive: status = kvrope::reference::naive_backward(oop, ws, ws_bytes, st); break;
    }
  };
  auto prepare = [&](cudaStream_t st) {
    if (in_place) data.restore_in_place(st);
  };
  const char* launcher = variant == Variant::kNaive ? "naive_backward" : "kv_cache_rope_backward";
  KVROPE_BENCH_CUDA(cudaMemset(data.error_flag.template as<int>(), 0, sizeof(int)));

  // Check once, on poisoned outputs, before timing.
  bool checked = false;
  if (g_options.check) {
    prepare(stream);
    data.poison_outputs(stream, !in_place);
    launch(stream);
    KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
    if (!status.ok()) {
      state.SkipWithError(status_message(launcher, status).c_str());
      return;
    }
    const std::string failure = in_place ? data.check(data.gk_work, data.gv_work) : data.check(data.gk_in, data.gv_in);
    if (!failure.empty()) {
      state.SkipWithError(failure.c_str());
      return;
    }
    checked = true;
  }

  // Warm-up (module loading, first-touch effects), not timed.
  for (int64_t i = 0; i < g_options.warmup; ++i) {
    prepare(stream);
    launch(stream);
    if (!status.ok()) {
      state.SkipWithError(status_message(launcher, status).c_str());
      return;
    }
  }
  KVROPE_BENCH_CUDA(cudaDeviceSynchronize());

  VariantResult r;
  r.checked = checked;
  std::vector<double> activities;
  bool failed = false;
  for (auto _ : state) {
    const Sample s = g_clock->time(prepare, launch);
    if (!status.ok()) {
      state.SkipWithError(status_message(launcher, status).c_str());
      failed = true;
      break;
    }
    if (s.activities == 0) {
      state.SkipWithError("CUPTI recorded no GPU activity for the call");
      failed = true;
      break;
    }
    r.cupti_us.push_back(s.cupti_us);
    r.event_traced_us.push_back(s.event_us);
    activities.push_back(s.activities);
    state.SetIterationTime(1e-6 * s.cupti_us);
  }
  if (failed || r.cupti_us.empty()) return;

  // The CUDA-event times a caller sees: as many calls again, same protocol, tracing off.
  cupti::set_tracing(false);
  for (size_t i = 0; i < r.cupti_us.size() && status.ok(); ++i) {
    r.event_us.push_back(g_clock->time_events(prepare, launch));
  }
  cupti::set_tracing(true);
  if (!status.ok()) {
    state.SkipWithError(status_message(launcher, status).c_str());
    return;
  }
  if (const int flag = data.read_error_flag(); flag != 0) {
    state.SkipWithError(("the kernel raised error_flag = " + std::to_string(flag)).c_str());
    return;
  }
  if (!data.workspace_zero()) {
    state.SkipWithError("the kernel left its workspace nonzero");
    return;
  }

  r.median_us = median_of(r.cupti_us);
  r.event_median_us = median_of(r.event_us);
  r.event_traced_median_us = median_of(r.event_traced_us);
  r.min_us = *std::min_element(r.cupti_us.begin(), r.cupti_us.end());
  r.max_us = *std::max_element(r.cupti_us.begin(), r.cupti_us.end());
  r.mean_us = std::accumulate(r.cupti_us.begin(), r.cupti_us.end(), 0.0) / static_cast<double>(r.cupti_us.size());
  r.p90_us = percentile_of(r.cupti_us, 0.9);
  r.activities = median_of(activities);

  // Google Benchmark reports the mean of the per-iteration manual times. Each call was given its
  // own time above; this one correction makes the sum N * median, so the reported time is the median.
  const double n = static_cast<double>(r.cupti_us.size());
  state.SetIterationTime(1e-6 * (n * r.median_us - n * r.mean_us));

  CaseResult& cr = g_results[lc.id];
  cr.lc = lc;
  cr.bytes = traffic_of(lc, sizeof(T));
  cr.floor_us = floor_us(cr.bytes.out_of_place);
  cr.inplace_floor_us = floor_us(cr.bytes.in_place);
  const double bytes = in_place ? cr.bytes.in_place : cr.bytes.out_of_place;
  const double floor = in_place ? cr.inplace_floor_us : cr.floor_us;

  state.counters["median_us"] = r.median_us;
  state.counters["event_median_us"] = r.event_median_us;
  state.counters["event_us"] = r.event_median_us;
  state.counters["event_traced_us"] = r.event_traced_median_us;
  state.counters["min_us"] = r.min_us;
  state.counters["p90_us"] = r.p90_us;
  state.counters["bytes"] = bytes;
  state.counters["TBps"] = bytes / r.median_us * 1e-6;
  state.counters["floor_us"] = floor;
  state.counters["x_floor"] = r.median_us / floor;
  state.counters["activities"] = r.activities;
  // Each speedup over the naive reference on the row of whichever of the two ran last.
  if (variant != Variant::kNaive) {
    const auto naive = cr.variants.find(Variant::kNaive);
    if (naive != cr.variants.end()) state.counters["speedup_vs_naive"] = naive->second.median_us / r.median_us;
  } else {
    for (const auto& [other, counter] : {std::pair{Variant::kFused, "fused_speedup"}, std::pair{Variant::kInPlace, "inplace_speedup"}}) {
      const auto it = cr.variants.find(other);
      if (it != cr.variants.end()) state.counters[counter] = r.median_us / it->second.median_us;
    }
  }
  state.SetLabel(checked ? "checked" : "unchecked");
  cr.variants[variant] = std::move(r);
}

// The order of the variants within a case: the naive reference last (or first, with --naive_first).
// Run just before them it slowed the in-place variant by 3 %, as no caller's program would
// (docs/perf-notes.md, v15).
const Variant (&variant_order())[3] {
  static constexpr Variant naive_last[] = {Variant::kFused, Variant::kInPlace, Variant::kNaive};
  return g_options.naive_first ? kAllVariants : naive_last;
}

// Whether --variants asked for v.
bool selected(Variant v) {
  return std::find(g_options.variants.begin(), g_options.variants.end(), v) != g_options.variants.end();
}

template <typename T>
void register_benchmarks() {
  std::vector<int> ids = g_options.cases;
  if (ids.empty()) {
    for (const auto& lc : kCases) ids.push_back(lc.id);
  }
  for (int id : ids) {
    const LeaderboardCase lc = kCases[id - 1];
    for (Variant v : variant_order()) {
      if (!selected(v)) continue;
      char name[64];
      std::snprintf(name, sizeof(name), "backward/%s/case:%02d", variant_name(v), lc.id);
      benchmark::RegisterBenchmark(name, [lc, v](benchmark::State& st) { run_variant<T>(st, lc, v); })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->Iterations(g_options.iters);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Summary and JSON.

struct GeoMean {
  double log_sum = 0;
  int n = 0;
  void add(double x) {
    if (x > 0 && std::isfinite(x)) {
      log_sum += std::log(x);
      ++n;
    }
  }
  double value() const { return n > 0 ? std::exp(log_sum / n) : std::nan(""); }
};

const VariantResult* find_variant(const CaseResult& cr, Variant v) {
  const auto it = cr.variants.find(v);
  return it == cr.variants.end() ? nullptr : &it->second;
}

struct Summary {
  GeoMean naive, fused, inplace, floor, inplace_floor, fused_x_floor, inplace_x_floor, naive_x_fused, naive_x_inplace;
  GeoMean naive_event, fused_event, inplace_event;
  int cases = 0;
};

Summary summarize() {
  Summary s;
  for (const auto& [id, cr] : g_results) {
    (void)id;
    const VariantResult* n = find_variant(cr, Variant::kNaive);
    const VariantResult* f = find_variant(cr, Variant::kFused);
    const VariantResult* p = find_variant(cr, Variant::kInPlace);
    ++s.cases;
    s.floor.add(cr.floor_us);
    s.inplace_floor.add(cr.inplace_floor_us);
    if (n) {
      s.naive.add(n->median_us);
      s.naive_event.add(n->event_median_us);
    }
    if (f) {
      s.fused.add(f->median_us);
      s.fused_event.add(f->event_median_us);
      s.fused_x_floor.add(f->median_us / cr.floor_us);
    }
    if (p) {
      s.inplace.add(p->median_us);
      s.inplace_event.add(p->event_median_us);
      s.inplace_x_floor.add(p->median_us / cr.inplace_floor_us);
    }
    if (n && f) s.naive_x_fused.add(n->median_us / f->median_us);
    if (n && p) s.naive_x_inplace.add(n->median_us / p->median_us);
  }
  return s;
}

std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

void print_summary(const Summary& s) {
  std::printf("\nkvrope_bench summary: %s, dtype %s, H %lld, D %lld, positions %s; times are CUPTI medians in us\n",
              g_device.name.c_str(), g_options.dtype.c_str(), static_cast<long long>(g_options.heads),
              static_cast<long long>(g_options.head_dim), g_options.random_positions ? "random" : "arange");
  std::printf("%4s %3s %5s %5s | %9s %9s %9s | %8s %8s | %7s %7s %7s | %9s %9s %9s\n", "case", "B", "S", "S_max",
              "naive", "fused", "inplace", "floor", "ip_floor", "f/floor", "ip/ipfl", "n/fused", "naive_ev", "fused_ev",
              "inpl_ev");
  for (const auto& [id, cr] : g_results) {
    const VariantResult* n = find_variant(cr, Variant::kNaive);
    const VariantResult* f = find_variant(cr, Variant::kFused);
    const VariantResult* p = find_variant(cr, Variant::kInPlace);
    const double nan = std::nan("");
    std::printf("%4d %3lld %5lld %5lld | %9s %9s %9s | %8s %8s | %7s %7s %7s | %9s %9s %9s\n", id,
                static_cast<long long>(cr.lc.batch), static_cast<long long>(cr.lc.seq_len),
                static_cast<long long>(cr.lc.cache_len), fmt("%.2f", n ? n->median_us : nan).c_str(),
                fmt("%.2f", f ? f->median_us : nan).c_str(), fmt("%.2f", p ? p->median_us : nan).c_str(),
                fmt("%.2f", cr.floor_us).c_str(), fmt("%.2f", cr.inplace_floor_us).c_str(),
                fmt("%.3f", f ? f->median_us / cr.floor_us : nan).c_str(),
                fmt("%.3f", p ? p->median_us / cr.inplace_floor_us : nan).c_str(),
                fmt("%.1f", n && f ? n->median_us / f->median_us : nan).c_str(),
                fmt("%.2f", n ? n->event_median_us : nan).c_str(), fmt("%.2f", f ? f->event_median_us : nan).c_str(),
                fmt("%.2f", p ? p->event_median_us : nan).c_str());
  }
  if (s.cases == 0) {
    std::printf("no case ran\n");
    return;
  }
  // A geomean over fewer cases than ran (a variant skipped or failed somewhere) says so.
  auto line = [&](const char* label, const GeoMean& g, const char* f) {
    if (g.n == 0) return;
    std::printf("%s = %s", label, fmt(f, g.value()).c_str());
    if (g.n != s.cases) std::printf("   (over %d of %d cases)", g.n, s.cases);
    std::printf("\n");
  };
  std::printf("\ngeometric means over the %d case(s) that ran (CUPTI medians, us):\n", s.cases);
  line("naive geomean us", s.naive, "%.2f");
  line("fused geomean us", s.fused, "%.2f");
  line("inplace geomean us", s.inplace, "%.2f");
  line("floor geomean us", s.floor, "%.2f");
  line("inplace floor geomean us", s.inplace_floor, "%.2f");
  line("naive event geomean us", s.naive_event, "%.2f");
  line("fused event geomean us", s.fused_event, "%.2f");
  line("inplace event geomean us", s.inplace_event, "%.2f");
  line("fused/floor geomean", s.fused_x_floor, "%.3f");
  line("inplace/inplace-floor geomean", s.inplace_x_floor, "%.3f");
  line("naive/fused geomean speedup", s.naive_x_fused, "%.1f");
  line("naive/inplace geomean speedup", s.naive_x_inplace, "%.1f");
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// The launch tuning set by the flags, as a JSON object (every field, so that a results file says
// exactly what ran).
std::string tuning_json(const kvrope::LaunchTuning& t) {
  auto on = [](bool b) { return std::string(b ? "true" : "false"); };
  return "{\"block_threads\": " + std::to_string(t.block_threads) + ", \"blocks_per_sm\": " +
         std::to_string(t.blocks_per_sm) + ", \"token_warp_weight\": " + json_number(t.token_warp_weight) +
         ", \"bulk_stages\": " + std::to_string(t.bulk_stages) + ", \"bulk_store_slack\": " +
         std::to_string(t.bulk_store_slack) + ", \"bulk_copy\": " + on(t.bulk_copy) +
         ", \"bulk_min_chunks_per_block\": " + std::to_string(t.bulk_min_chunks_per_block) +
         ", \"bulk_speculate_chunks\": " + std::to_string(t.bulk_speculate_chunks) + ", \"token_zeros\": " +
         on(t.token_zeros) + ", \"mask_after_first_item\": " + on(t.mask_after_first_item) +
         ", \"bulk_share_chunks\": " + on(t.bulk_share_chunks) + ", \"bulk_chunk_bytes\": " +
         std::to_string(t.bulk_chunk_bytes) + ", \"bulk_speculate_large\": " + on(t.bulk_speculate_large) +
         ", \"bulk_share_min_chunks_per_block\": " + std::to_string(t.bulk_share_min_chunks_per_block) +
         ", \"in_place_token_prefetch\": " + std::to_string(t.in_place_token_prefetch) +
         ", \"in_place_spread_items\": " + on(t.in_place_spread_items) +
         ", \"out_of_place_spread_items\": " + on(t.out_of_place_spread_items) + ", \"decode_kernel\": " +
         on(t.decode_kernel) + ", \"decode_copy_max_mib\": " + std::to_string(t.decode_copy_max_mib) +
         ", \"decode_block_threads\": " + std::to_string(t.decode_block_threads) +
         ", \"decode_token_warps\": " + std::to_string(t.decode_token_warps) +
         ", \"token_parts\": " + std::to_string(t.token_parts) +
         ", \"bulk_speculate_mask_rounds\": " + std::to_string(t.bulk_speculate_mask_rounds) + "}";
}

std::string json_array(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_number(v[i]);
  return out + "]";
}

void write_json(const Summary& s, const std::string& path) {
  std::string j = "{\n";
  j += "  \"device\": {\"name\": " + json_string(g_device.name) + ", \"compute_capability\": \"" +
       std::to_string(g_device.major) + "." + std::to_string(g_device.minor) +
       "\", \"sm_count\": " + std::to_string(g_device.sm_count) + ", \"l2_bytes\": " + std::to_string(g_device.l2_bytes) +
       ", \"global_bytes\": " + std::to_string(g_device.global_bytes) +
       ", \"sm_clock_khz\": " + std::to_string(g_device.sm_clock_khz) +
       ", \"mem_clock_khz\": " + std::to_string(g_device.mem_clock_khz) +
       ", \"mem_bus_bits\": " + std::to_string(g_device.mem_bus_bits) +
       ", \"driver_version\": " + std::to_string(g_device.driver_version) +
       ", \"runtime_version\": " + std::to_string(g_device.runtime_version) + "},\n";
  std::string variants;
  for (Variant v : variant_order())  // in the order they ran within a case
    if (selected(v)) variants += std::string(variants.empty() ? "" : ", ") + "\"" + variant_name(v) + "\"";
  j += "  \"config\": {\"dtype\": " + json_string(g_options.dtype) + ", \"heads\": " + std::to_string(g_options.heads) +
       ", \"head_dim\": " + std::to_string(g_options.head_dim) + ", \"positions\": \"" +
       (g_options.random_positions ? "random" : "arange") + "\", \"position_type\": \"int64\", \"iters\": " +
       std::to_string(g_options.iters) + ", \"warmup\": " + std::to_string(g_options.warmup) +
       ", \"check\": " + (g_options.check ? "true" : "false") + ", \"seed\": " + std::to_string(g_options.seed) + ", \"primer\": " + (g_options.primer ? "true" : "false") +
       ", \"naive_first\": " + (g_options.naive_first ? "true" : "false") +
       ", \"flush\": \"" + (g_options.flush_reads ? "read" : "write") + "\"" +
       ", \"variants\": [" + variants + "], \"clock\": " +
       json_string("CUPTI: first start to last end of the call's kernels, memcpys and memsets; L2 (" +
                   std::to_string(g_clock->flush_bytes()) + (g_options.flush_reads ? " bytes read: --flush=read, not the protocol's" : " bytes written") +
                   ") flushed and device synchronized before "
                   "each call; statistic: median") +
       ", \"fused_workspace\": " + (g_options.workspace ? "true" : "false") + ", \"launch_tuning\": " +
       (g_options.tuned ? tuning_json(g_options.tuning) : std::string("\"default_tuning\"")) + "},\n";
  j += "  \"calibration\": {\"copy_bytes\": " + std::to_string(g_calibration.copy_bytes) +
       ", \"copy_median_us\": " + json_number(g_calibration.copy_median_us) +
       ", \"copy_bandwidth_TBps\": " + json_number(g_calibration.bandwidth_bytes_per_us * 1e-6) +
       ", \"copy_calls\": " + std::to_string(g_calibration.copy_calls) +
       ", \"empty_kernel_us\": " + json_number(g_calibration.empty_kernel_us) +
       ", \"empty_kernel_event_us\": " + json_number(g_calibration.empty_kernel_event_us) +
       ", \"empty_calls\": " + std::to_string(g_calibration.empty_calls) + "},\n";
  j += "  \"cases\": [";
  bool first_case = true;
  for (const auto& [id, cr] : g_results) {
    j += first_case ? "\n" : ",\n";
    first_case = false;
    j += "    {\"case\": " + std::to_string(id) + ", \"batch\": " + std::to_string(cr.lc.batch) +
         ", \"seq_len\": " + std::to_string(cr.lc.seq_len) + ", \"cache_len\": " + std::to_string(cr.lc.cache_len) +
         ", \"bytes\": " + json_number(cr.bytes.out_of_place) +
         ", \"inplace_bytes\": " + json_number(cr.bytes.in_place) + ", \"floor_us\": " + json_number(cr.floor_us) +
         ", \"inplace_floor_us\": " + json_number(cr.inplace_floor_us) +
         ", \"b200_scoring_baseline_ms\": " + json_number(cr.lc.b200_scoring_baseline_ms) +
         ", \"b200_sol_bound_ms\": " + json_number(cr.lc.b200_sol_bound_ms) + ",\n     \"variants\": {";
    bool first_variant = true;
    for (const auto& [v, r] : cr.variants) {
      const bool ip = v == Variant::kInPlace;
      const double bytes = ip ? cr.bytes.in_place : cr.bytes.out_of_place;
      const double floor = ip ? cr.inplace_floor_us : cr.floor_us;
      j += first_variant ? "\n" : ",\n";
      first_variant = false;
      j += std::string("       \"") + variant_name(v) + "\": {\"median_us\": " + json_number(r.median_us) +
           ", \"event_median_us\": " + json_number(r.event_median_us) +
           ", \"event_traced_median_us\": " + json_number(r.event_traced_median_us) + ", \"min_us\": " + json_number(r.min_us) +
           ", \"mean_us\": " + json_number(r.mean_us) + ", \"p90_us\": " + json_number(r.p90_us) +
           ", \"max_us\": " + json_number(r.max_us) + ", \"bytes\": " + json_number(bytes) +
           ", \"TBps\": " + json_number(bytes / r.median_us * 1e-6) + ", \"floor_us\": " + json_number(floor) +
           ", \"x_floor\": " + json_number(r.median_us / floor) +
           ", \"activities\": " + json_number(r.activities) + ", \"checked\": " + (r.checked ? "true" : "false");
      if (const VariantResult* n = find_variant(cr, Variant::kNaive); n != nullptr && v != Variant::kNaive) {
        j += ", \"speedup_vs_naive\": " + json_number(n->median_us / r.median_us);
      }
      j += ",\n         \"times_us\": " + json_array(r.cupti_us) + ",\n         \"event_times_us\": " + json_array(r.event_us) +
           ",\n         \"event_traced_times_us\": " + json_array(r.event_traced_us) + "}";
    }
    j += "}}";
  }
  j += "\n  ],\n";
  j += "  \"geomean\": {\"cases\": " + std::to_string(s.cases) + ", \"naive_us\": " + json_number(s.naive.value()) +
       ", \"fused_us\": " + json_number(s.fused.value()) + ", \"inplace_us\": " + json_number(s.inplace.value()) +
       ", \"floor_us\": " + json_number(s.floor.value()) +
       ", \"inplace_floor_us\": " + json_number(s.inplace_floor.value()) +
       ", \"naive_event_us\": " + json_number(s.naive_event.value()) +
       ", \"fused_event_us\": " + json_number(s.fused_event.value()) +
       ", \"inplace_event_us\": " + json_number(s.inplace_event.value()) +
       ", \"fused_over_floor\": " + json_number(s.fused_x_floor.value()) +
       ", \"inplace_over_inplace_floor\": " + json_number(s.inplace_x_floor.value()) +
       ", \"naive_over_fused\": " + json_number(s.naive_x_fused.value()) +
       ", \"naive_over_inplace\": " + json_number(s.naive_x_inplace.value()) + "}\n}\n";

  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || std::fwrite(j.data(), 1, j.size(), f) != j.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "kvrope_bench: cannot write %s\n", path.c_str());
    return;
  }
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace kvrope_bench

int main(int argc, char** argv) {
  using namespace kvrope_bench;
  g_options = parse_options(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("kvrope_bench: no CUDA device available (%s); nothing to benchmark.\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 0;
  }
  if (g_options.iters < 50) {
    std::fprintf(stderr, "kvrope_bench: warning: --iters=%lld is below the protocol's 50 calls per case\n",
                 static_cast<long long>(g_options.iters));
  }

  cupti::init();
  KVROPE_BENCH_CUDA(cudaFree(nullptr));  // create the context
  g_device = query_device();
  cudaStream_t stream = nullptr;
  KVROPE_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  g_clock = std::make_unique<GpuClock>(stream, g_device.l2_bytes);
  g_calibration = calibrate();

  std::printf("kvrope_bench: %s (sm_%d%d), %d SMs, L2 %.1f MiB, %.1f GiB", g_device.name.c_str(), g_device.major,
              g_device.minor, g_device.sm_count, static_cast<double>(g_device.l2_bytes) / (1 << 20),
              static_cast<double>(g_device.global_bytes) / (1 << 30));
  if (g_device.sm_clock_khz > 0) std::printf(", SM clock %d MHz", g_device.sm_clock_khz / 1000);
  if (g_device.mem_clock_khz > 0) std::printf(", memory clock %d MHz", g_device.mem_clock_khz / 1000);
  std::printf("; driver %d, runtime %d\n", g_device.driver_version, g_device.runtime_version);
  std::printf("copy bandwidth: %.3f TB/s (1 GiB cudaMemcpyAsync D2D, read + written / CUPTI median of %d: %.1f us)\n",
              g_calibration.bandwidth_bytes_per_us * 1e-6, g_calibration.copy_calls, g_calibration.copy_median_us);
  std::printf("empty kernel: %.3f us (CUPTI median of %d); its CUDA-event time (tracing off): %.2f us\n",
              g_calibration.empty_kernel_us,
              g_calibration.empty_calls, g_calibration.empty_kernel_event_us);
  std::printf("config: dtype %s, H %lld, D %lld, positions %s (int64), %lld timed calls + %lld warm-up per case, "
              "check %s, L2 flush %.1f MiB %s, fused workspace %s\n\n",
              g_options.dtype.c_str(), static_cast<long long>(g_options.heads),
              static_cast<long long>(g_options.head_dim), g_options.random_positions ? "random" : "arange",
              static_cast<long long>(g_options.iters), static_cast<long long>(g_options.warmup),
              g_options.check ? "on" : "off", static_cast<double>(g_clock->flush_bytes()) / (1 << 20),
              g_options.flush_reads ? "read (--flush=read: a diagnostic, not the protocol)" : "written",
              g_options.workspace ? "on" : "off");
  if (g_options.chain_study) {
    run_chain_study();
    g_clock.reset();
    KVROPE_BENCH_CUDA(cudaStreamDestroy(stream));
    return 0;
  }
  if (g_options.tuned)  // a record of the launch parameters the fused variants ran with, as in the JSON
    std::printf("launch tuning (flags): %s\n\n", tuning_json(g_options.tuning).c_str());
  std::fflush(stdout);

  benchmark::AddCustomContext("kvrope_device", g_device.name);
  benchmark::AddCustomContext("kvrope_dtype", g_options.dtype);
  benchmark::AddCustomContext("kvrope_heads", std::to_string(g_options.heads));
  benchmark::AddCustomContext("kvrope_head_dim", std::to_string(g_options.head_dim));
  benchmark::AddCustomContext("kvrope_positions", g_options.random_positions ? "random" : "arange");
  benchmark::AddCustomContext("kvrope_copy_bandwidth_TBps", fmt("%.4f", g_calibration.bandwidth_bytes_per_us * 1e-6));
  benchmark::AddCustomContext("kvrope_empty_kernel_us", fmt("%.4f", g_calibration.empty_kernel_us));

  if (g_options.dtype == "bf16") {
    register_benchmarks<__nv_bfloat16>();
  } else if (g_options.dtype == "fp16") {
    register_benchmarks<__half>();
  } else {
    register_benchmarks<float>();
  }
  benchmark::RunSpecifiedBenchmarks();
  g_case.reset();

  const Summary summary = summarize();
  print_summary(summary);
  write_json(summary, g_options.json_path);

  benchmark::Shutdown();
  g_clock.reset();
  KVROPE_BENCH_CUDA(cudaStreamDestroy(stream));
  KVROPE_BENCH_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  return 0;
}
