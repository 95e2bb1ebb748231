// Runs the fused backward (out-of-place) on random bf16 data, checks it against the float64 CPU
// reference and prints the outcome. Exits 77 (skipped) when there is no GPU.
#include <kvrope/kvrope.cuh>
#include <kvrope/reference/cpu_backward.hpp>

#include "compare_with_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#define CHECK_CUDA(call)                                                                           \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

using T = __nv_bfloat16;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const int64_t B = 2, H = 8, S = 64, L = 512, D = 128;
  const size_t cache = B * H * L * D, tok = B * H * S * D, tab = B * S * D;

  // Random inputs on the host; positions are a shuffled subset of the cache rows.
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  auto random = [&](size_t n) {
    std::vector<T> v(n);
    for (T& x : v) x = __float2bfloat16(normal(rng));
    return v;
  };
  std::vector<T> h_gk = random(cache), h_gv = random(cache), h_key = random(tok), h_cos = random(tab),
                 h_sin = random(tab);
  std::vector<int64_t> rows(L);
  for (int64_t i = 0; i < L; ++i) rows[i] = i;
  std::shuffle(rows.begin(), rows.end(), rng);
  std::vector<int64_t> h_pos(rows.begin(), rows.begin() + S);

  // Device buffers: inputs, then the six outputs.
  T *gk, *gv, *key, *cos, *sin, *gks, *gvs, *gcos, *gsin, *gk_in, *gv_in;
  int64_t* pos;
  int* flag;
  void* workspace;  // optional: lets the blocks share a large cache's copy (docs/api.md)
  for (auto [p, n] : {std::pair{&gk, cache},
                      {&gv, cache},
                      {&key, tok},
                      {&cos, tab},
                      {&sin, tab},
                      {&gks, tok},
                      {&gvs, tok},
                      {&gcos, tab},
                      {&gsin, tab},
                      {&gk_in, cache},
                      {&gv_in, cache}})
    CHECK_CUDA(cudaMalloc(p, n * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&pos, S * sizeof(int64_t)));
  CHECK_CUDA(cudaMalloc(&flag, sizeof(int)));
  CHECK_CUDA(cudaMalloc(&workspace, kvrope::kBackwardWorkspaceBytes));
  CHECK_CUDA(cudaMemcpy(gk, h_gk.data(), cache * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(gv, h_gv.data(), cache * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(key, h_key.data(), tok * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(cos, h_cos.data(), tab * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(sin, h_sin.data(), tab * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(pos, h_pos.data(), S * sizeof(int64_t), cudaMemcpyHostToDevice));

  // The call: every tensor is a contiguous BHSD (or BSD) view.
  kvrope::BackwardParams<T> p;
  p.batch = B, p.heads = H, p.seq_len = S, p.cache_len = L, p.head_dim = D;
  p.grad_key_cache = kvrope::bhsd<const T>(gk, H, L, D);
  p.grad_value_cache = kvrope::bhsd<const T>(gv, H, L, D);
  p.key_states = kvrope::bhsd<const T>(key, H, S, D);
  p.cos = kvrope::bsd<const T>(cos, S, D);
  p.sin = kvrope::bsd<const T>(sin, S, D);
  p.cache_position = pos;
  p.grad_key_states = kvrope::bhsd(gks, H, S, D);
  p.grad_value_states = kvrope::bhsd(gvs, H, S, D);
  p.grad_cos = kvrope::bsd(gcos, S, D);
  p.grad_sin = kvrope::bsd(gsin, S, D);
  p.grad_key_cache_input = kvrope::bhsd(gk_in, H, L, D);
  p.grad_value_cache_input = kvrope::bhsd(gv_in, H, L, D);
  p.error_flag = flag;
  p.workspace = workspace;

  if (kvrope::Status s = kvrope::reset_error_flag(flag); !s) return 1;
  if (kvrope::Status s = kvrope::reset_workspace(workspace); !s) return 1;  // once: calls leave it zero
  // HeadDims<128>: this program knows its head dim, so only that instance is compiled (docs/api.md).
  const kvrope::Status status = kvrope::kv_cache_rope_backward<kvrope::HeadDims<128>>(p);
  if (!status) {
    std::printf("launch failed: %s (%s)\n", kvrope::to_string(status.code), status.field ? status.field : "-");
    return 1;
  }
  const kvrope::Status flag_status = kvrope::read_error_flag(flag);  // synchronizes
  std::printf("positions: %s\n", flag_status ? "all in range" : kvrope::to_string(flag_status.code));

  // Copy the outputs back and compare with the float64 reference.
  auto back = [](const T* d, size_t n) {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  };
  std::vector<T> o_gks = back(gks, tok), o_gvs = back(gvs, tok), o_gcos = back(gcos, tab), o_gsin = back(gsin, tab),
                 o_gk_in = back(gk_in, cache), o_gv_in = back(gv_in, cache);
  CHECK_CUDA(cudaGetLastError());
  kvrope::BackwardParams<T> host = p;
  host.grad_key_cache = kvrope::bhsd<const T>(h_gk.data(), H, L, D);
  host.grad_value_cache = kvrope::bhsd<const T>(h_gv.data(), H, L, D);
  host.key_states = kvrope::bhsd<const T>(h_key.data(), H, S, D);
  host.cos = kvrope::bsd<const T>(h_cos.data(), S, D);
  host.sin = kvrope::bsd<const T>(h_sin.data(), S, D);
  host.cache_position = h_pos.data();
  // Every output of the call in float64, dense and contiguous like this program's buffers (grad_cos and
  // grad_sin: [B, S, R], one table a batch; here R = D).
  const kvrope::reference::BackwardGold gold = kvrope::reference::cpu_backward(host);
  const int64_t wrong = wrong_computed(o_gks, gold.grad_key_states) + wrong_computed(o_gcos, gold.grad_cos) +
                        wrong_computed(o_gsin, gold.grad_sin) + wrong_copied(o_gvs, gold.grad_value_states) +
                        wrong_copied(o_gk_in, gold.grad_key_cache_input) +
                        wrong_copied(o_gv_in, gold.grad_value_cache_input);
  const size_t checked = 2 * tok + 2 * tab + 2 * cache;
  std::printf("kv_cache_rope_backward bf16 B=%lld H=%lld S=%lld S_max=%lld D=%lld: %zu values checked, %lld wrong\n",
              (long long)B, (long long)H, (long long)S, (long long)L, (long long)D, checked, (long long)wrong);

  for (T* ptr : {gk, gv, key, cos, sin, gks, gvs, gcos, gsin, gk_in, gv_in}) cudaFree(ptr);
  cudaFree(pos);
  cudaFree(flag);
  cudaFree(workspace);
  return wrong == 0 && flag_status ? 0 : 1;
}
