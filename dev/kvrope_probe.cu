// kvrope_probe: one shape of the backward, launched a few times, for profilers (Nsight Compute,
// Nsight Systems). kvrope_bench links CUPTI for its own clock, which a profiler would compete with;
// this program launches the kernels and nothing else (bf16, contiguous BHSD, cache_position = arange).
//
//   kvrope_probe B S S_max [variant=fused|inplace] [launches=3] [H=8] [D=128]
//   ncu --cache-control all -k regex:backward_kernel build/dev/kvrope_probe 1 691 2048
//   KVROPE_FLUSH=1 ncu --cache-control none ...   (the protocol's flush by writes before each launch)
#include "verify/launch_policy.cuh"
#include <kvrope/kvrope.cuh>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_exit.cuh"
#include "l2_flush.cuh"  // bench/support

using T = __nv_bfloat16;

__global__ void probe_fill(T* out, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ salt;
    h ^= h >> 15;
    out[i] = __float2bfloat16(static_cast<float>(h & 0xffff) / 32768.0f - 1.0f);
  }
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s B S S_max [fused|inplace] [launches] [H] [D]\n", argv[0]);
    return 2;
  }
  const int64_t B = std::atoll(argv[1]), S = std::atoll(argv[2]), L = std::atoll(argv[3]);
  const bool in_place = argc > 4 && std::strcmp(argv[4], "inplace") == 0;
  const int launches = argc > 5 ? std::atoi(argv[5]) : 3;
  const int64_t H = argc > 6 ? std::atoll(argv[6]) : 8, D = argc > 7 ? std::atoll(argv[7]) : 128;
  if (S > L) {
    std::fprintf(stderr, "S must be at most S_max (positions are arange(S))\n");
    return 2;
  }
  std::vector<T*> bufs;
  auto alloc = [&](size_t n, uint32_t salt) {
    T* p = nullptr;
    KVROPE_TOOL_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    probe_fill<<<1024, 256>>>(p, n, salt);
    KVROPE_TOOL_CUDA(cudaGetLastError());
    bufs.push_back(p);
    return p;
  };
  std::vector<int64_t> h_pos(S);
  std::iota(h_pos.begin(), h_pos.end(), int64_t{0});
  int64_t* pos = nullptr;
  KVROPE_TOOL_CUDA(cudaMalloc(&pos, std::max<int64_t>(S, 1) * sizeof(int64_t)));
  KVROPE_TOOL_CUDA(cudaMemcpy(pos, h_pos.data(), S * sizeof(int64_t), cudaMemcpyHostToDevice));
  // Buffers of a (b, s, l) problem (contiguous BHSD, positions arange), filled, and both variants'
  // params over them (`salt` varies the fill; the cache-input gradients only out of place).
  auto make_problem = [&](int64_t b, int64_t s, int64_t l, uint32_t salt, bool with_cache_grads,
                          kvrope::BackwardInPlaceParams<T>& ip, kvrope::BackwardParams<T>& op) {
    const size_t cache = b * H * l * D, tok = b * H * s * D, tab = b * s * D;
    T *gk = alloc(cache, salt + 1), *gv = alloc(cache, salt + 2), *key = alloc(tok, salt + 3);
    T *cos = alloc(tab, salt + 4), *sin = alloc(tab, salt + 5);
    ip.batch = b, ip.heads = H, ip.seq_len = s, ip.cache_len = l, ip.head_dim = D;
    ip.grad_key_cache = kvrope::bhsd(gk, H, l, D);
    ip.grad_value_cache = kvrope::bhsd(gv, H, l, D);
    ip.key_states = kvrope::bhsd<const T>(key, H, s, D);
    ip.cos = kvrope::bsd<const T>(cos, s, D);
    ip.sin = kvrope::bsd<const T>(sin, s, D);
    ip.cache_position = pos;  // arange: its first s positions
    ip.grad_key_states = kvrope::bhsd(alloc(tok, salt + 6), H, s, D);
    ip.grad_value_states = kvrope::bhsd(alloc(tok, salt + 7), H, s, D);
    ip.grad_cos = kvrope::bsd(alloc(tab, salt + 8), s, D);
    ip.grad_sin = kvrope::bsd(alloc(tab, salt + 9), s, D);
    static_cast<kvrope::BackwardCommon<T, int64_t>&>(op) = ip;
    op.grad_key_cache = kvrope::bhsd<const T>(gk, H, l, D);
    op.grad_value_cache = kvrope::bhsd<const T>(gv, H, l, D);
    op.grad_key_cache_input = kvrope::bhsd(with_cache_grads ? alloc(cache, salt + 10) : nullptr, H, l, D);
    op.grad_value_cache_input = kvrope::bhsd(with_cache_grads ? alloc(cache, salt + 11) : nullptr, H, l, D);
  };
  kvrope::BackwardInPlaceParams<T> ip;
  kvrope::BackwardParams<T> op;
  make_problem(B, S, L, 0, !in_place, ip, op);

  // Launch parameters: the device's policy, with any of these environment variables changing one
  // field of it: KVROPE_SPEC (bulk_speculate_chunks), KVROPE_SPEC_ROUNDS (bulk_speculate_mask_rounds),
  // KVROPE_MIN_CHUNKS (bulk_min_chunks_per_block), KVROPE_STAGES (bulk_stages), KVROPE_CHUNK
  // (bulk_chunk_bytes), KVROPE_SHARE_MIN (bulk_share_min_chunks_per_block), KVROPE_BLOCK (block_threads),
  // KVROPE_DECODE_MIB (decode_copy_max_mib); KVROPE_WORKSPACE (0: no workspace), KVROPE_FLUSH (below).
  int device = 0, major = 0;
  KVROPE_TOOL_CUDA(cudaGetDevice(&device));
  KVROPE_TOOL_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  kvrope::experimental::LaunchPolicy policy = kvrope::experimental::default_policy(major);
  auto env_int = [](const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
  };
  policy.bulk_speculate_chunks = env_int("KVROPE_SPEC", policy.bulk_speculate_chunks);
  policy.bulk_speculate_mask_rounds = env_int("KVROPE_SPEC_ROUNDS", policy.bulk_speculate_mask_rounds);
  policy.bulk_min_chunks_per_block = env_int("KVROPE_MIN_CHUNKS", policy.bulk_min_chunks_per_block);
  policy.bulk_stages = env_int("KVROPE_STAGES", policy.bulk_stages);
  policy.bulk_chunk_bytes = env_int("KVROPE_CHUNK", policy.bulk_chunk_bytes);
  policy.bulk_share_min_chunks_per_block = env_int("KVROPE_SHARE_MIN", policy.bulk_share_min_chunks_per_block);
  policy.block_threads = env_int("KVROPE_BLOCK", policy.block_threads);
  policy.decode_copy_max_mib = env_int("KVROPE_DECODE_MIB", policy.decode_copy_max_mib);
  // KVROPE_FLUSH: 1 writes a buffer of twice the L2 before each launch (the protocol's flush, which
  // leaves dirty lines), 2 reads it (a diagnostic: clean lines), 0 (the default) none: profilers flush
  // themselves unless told not to, as `ncu --cache-control none` is.
  const int flush_mode = env_int("KVROPE_FLUSH", 0);
  if (flush_mode < 0 || flush_mode > 2) {
    std::fprintf(stderr, "KVROPE_FLUSH is 0 (none), 1 (writes) or 2 (reads)\n");
    return 2;
  }
  const bool flush_l2 = flush_mode != 0;
  if (env_int("KVROPE_WORKSPACE", 1) != 0) {  // zeroed once: the kernel leaves it zero
    KVROPE_TOOL_CUDA(cudaMalloc(&op.workspace, kvrope::kBackwardWorkspaceBytes));
    KVROPE_TOOL_CUDA(cudaMemset(op.workspace, 0, kvrope::kBackwardWorkspaceBytes));
  }

  kvrope::experimental::LaunchConfig config{};
  const kvrope::Status planned = in_place ? kvrope::experimental::plan_backward(ip, &policy, &config)
                                          : kvrope::experimental::plan_backward(op, &policy, &config);
  if (!planned) {
    std::fprintf(stderr, "plan: %s (%s)\n", kvrope::to_string(planned.code), planned.field ? planned.field : "");
    return 1;
  }
  const kvrope::BackwardPlan& plan = config.plan;
  const char* kernel = plan.kernel == kvrope::BackwardKernel::kFused    ? "fused"
                       : plan.kernel == kvrope::BackwardKernel::kDecode ? "decode"
                                                                        : "none";
  std::printf(
      "B %lld S %lld S_max %lld H %lld D %lld %s: kernel %s grid %d block %d shared %d token_warps %d"
      " parts %d bulk %d chunk_rows %d speculated %d token_zeros %d prefetch %d shared_chunks %lld%s\n",
      static_cast<long long>(B), static_cast<long long>(S), static_cast<long long>(L), static_cast<long long>(H),
      static_cast<long long>(D), in_place ? "inplace" : "fused", kernel, plan.grid, plan.block, plan.shared_bytes,
      config.token_warps, config.token_parts, static_cast<int>(plan.bulk_copy), config.bulk_chunk_rows,
      config.bulk_speculated_chunks, static_cast<int>(config.token_zeros), static_cast<int>(config.token_prefetch),
      static_cast<long long>(config.bulk_shared_chunks),
      flush_mode == 1   ? " (L2 flushed by writes)"
      : flush_mode == 2 ? " (L2 flushed by reads)"
                        : " (no flush of its own)");
  cudaEvent_t start, stop;
  KVROPE_TOOL_CUDA(cudaEventCreate(&start));
  KVROPE_TOOL_CUDA(cudaEventCreate(&stop));
  int l2 = 0;
  KVROPE_TOOL_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  uint4* flush = nullptr;
  uint32_t* flush_sink = nullptr;
  if (flush_l2) {
    KVROPE_TOOL_CUDA(cudaMalloc(&flush, 2 * size_t(l2)));
    KVROPE_TOOL_CUDA(cudaMalloc(&flush_sink, sizeof(uint32_t)));
    KVROPE_TOOL_CUDA(cudaMemset(flush, 0x5a, 2 * size_t(l2)));
  }
  for (int i = 0; i < launches; ++i) {
    if (flush_mode == 1) KVROPE_TOOL_CUDA(cudaMemset(flush, i, 2 * size_t(l2)));
    if (flush_mode == 2) {
      kvrope_bench::l2_read_flush<<<1024, 256>>>(flush, 2 * int64_t{l2} / 16, 1u, flush_sink);  // (0x5a bytes: sum 0)
      KVROPE_TOOL_CUDA(cudaGetLastError());
    }
    KVROPE_TOOL_CUDA(cudaDeviceSynchronize());
    KVROPE_TOOL_CUDA(cudaEventRecord(start));
    const kvrope::Status s = in_place ? kvrope::experimental::kv_cache_rope_backward(ip, policy)
                                      : kvrope::experimental::kv_cache_rope_backward(op, policy);
    KVROPE_TOOL_CUDA(cudaEventRecord(stop));
    KVROPE_TOOL_CUDA(cudaEventSynchronize(stop));
    if (!s) {
      std::fprintf(stderr, "launch: %s (%s)\n", kvrope::to_string(s.code), s.field ? s.field : "");
      return 1;
    }
    float ms = 0;
    KVROPE_TOOL_CUDA(cudaEventElapsedTime(&ms, start, stop));
    std::printf("launch %d: %.2f us (events)\n", i, ms * 1000.0f);
  }
  for (T* p : bufs) KVROPE_TOOL_CUDA(cudaFree(p));
  if (flush_l2) {
    KVROPE_TOOL_CUDA(cudaFree(flush));
    KVROPE_TOOL_CUDA(cudaFree(flush_sink));
  }
  KVROPE_TOOL_CUDA(cudaFree(pos));
  return 0;
}
