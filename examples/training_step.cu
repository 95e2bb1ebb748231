// A training step through a static KV cache: the forward writes RoPE(k) and v into the caches at
// cache_position (and returns RoPE(k) for the attention), then, given the gradients that reach the
// caches, the backward gives those of k, v, the tables and the incoming caches. Interleaved style with
// partial rotary (R = D / 2), bf16. Both steps are checked against the float64 references.
// Exits 77 (skipped) when there is no GPU.
#include <kvrope/kvrope.cuh>
#include <kvrope/reference/cpu_backward.hpp>
#include <kvrope/reference/cpu_forward.hpp>

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

// A device copy of a host vector.
template <typename U>
U* upload(const std::vector<U>& host) {
  U* device = nullptr;
  if (cudaMalloc(&device, host.size() * sizeof(U)) != cudaSuccess) return nullptr;
  cudaMemcpy(device, host.data(), host.size() * sizeof(U), cudaMemcpyHostToDevice);
  return device;
}
template <typename U>
std::vector<U> download(const U* device, size_t n) {
  std::vector<U> host(n);
  cudaMemcpy(host.data(), device, n * sizeof(U), cudaMemcpyDeviceToHost);
  return host;
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const int64_t B = 2, H = 4, S = 16, L = 64, D = 64, R = D / 2;
  const size_t cache = B * H * L * D, tok = B * H * S * D, tab = B * S * R;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto random = [&](size_t n) {
    std::vector<T> v(n);
    for (T& x : v) x = __float2bfloat16(normal(rng));
    return v;
  };
  const std::vector<T> h_k = random(tok), h_v = random(tok), h_cos = random(tab), h_sin = random(tab);
  const std::vector<T> h_kc = random(cache), h_vc = random(cache);
  std::vector<int64_t> h_pos(S);
  for (int64_t t = 0; t < S; ++t) h_pos[t] = 20 + t;  // this step's rows of the cache

  // Forward: the caches updated in place, RoPE(k) returned.
  T *k = upload(h_k), *v = upload(h_v), *cos = upload(h_cos), *sin = upload(h_sin);
  T *kc = upload(h_kc), *vc = upload(h_vc), *k_out = upload(std::vector<T>(tok));
  int64_t* pos = upload(h_pos);
  kvrope::ForwardParams<T> f;
  f.batch = B, f.heads = H, f.seq_len = S, f.cache_len = L, f.head_dim = D, f.rotary_dim = R;
  f.style = kvrope::RotaryStyle::kInterleaved;
  f.key_states = kvrope::bhsd<const T>(k, H, S, D);
  f.value_states = kvrope::bhsd<const T>(v, H, S, D);
  f.key_cache = kvrope::bhsd(kc, H, L, D);
  f.value_cache = kvrope::bhsd(vc, H, L, D);
  f.key_out = kvrope::bhsd(k_out, H, S, D);
  f.cos = kvrope::bsd<const T>(cos, S, R);
  f.sin = kvrope::bsd<const T>(sin, S, R);
  f.cache_position = pos;
  if (kvrope::Status s = kvrope::kv_cache_rope_forward(f); !s) {
    std::printf("forward failed: %s (%s)\n", kvrope::to_string(s.code), s.field ? s.field : "-");
    return 1;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<T> o_kc = download(kc, cache), o_vc = download(vc, cache), o_kout = download(k_out, tok);
  kvrope::ForwardParams<T> fin = f;  // the same call on the host copies taken before it
  fin.key_states = kvrope::bhsd<const T>(h_k.data(), H, S, D);
  fin.value_states = kvrope::bhsd<const T>(h_v.data(), H, S, D);
  std::vector<T> kc_before = h_kc, vc_before = h_vc, kout_before(tok);
  fin.key_cache = kvrope::bhsd(kc_before.data(), H, L, D);
  fin.value_cache = kvrope::bhsd(vc_before.data(), H, L, D);
  fin.key_out = kvrope::bhsd(kout_before.data(), H, S, D);
  fin.cos = kvrope::bsd<const T>(h_cos.data(), S, R);
  fin.sin = kvrope::bsd<const T>(h_sin.data(), S, R);
  fin.cache_position = h_pos.data();
  // Every output in float64, dense and contiguous like this program's buffers: the caches, key_out.
  const kvrope::reference::ForwardGold fgold = kvrope::reference::cpu_forward(fin);
  const int64_t fwrong = wrong_computed(o_kc, fgold.key_cache) + wrong_copied(o_vc, fgold.value_cache) +
                         wrong_computed(o_kout, fgold.key_out);
  std::printf("forward:  %zu values checked, %lld mismatches\n", 2 * cache + tok, static_cast<long long>(fwrong));

  // Backward: the gradients reaching the caches give those of k, v, the tables and the old caches.
  const std::vector<T> h_gk = random(cache), h_gv = random(cache);
  T *gk = upload(h_gk), *gv = upload(h_gv);
  T *gks = upload(std::vector<T>(tok)), *gvs = upload(std::vector<T>(tok));
  T *gcos = upload(std::vector<T>(tab)), *gsin = upload(std::vector<T>(tab));
  T *gk_in = upload(std::vector<T>(cache)), *gv_in = upload(std::vector<T>(cache));
  kvrope::BackwardParams<T> g;
  g.batch = B, g.heads = H, g.seq_len = S, g.cache_len = L, g.head_dim = D, g.rotary_dim = R;
  g.style = kvrope::RotaryStyle::kInterleaved;
  g.grad_key_cache = kvrope::bhsd<const T>(gk, H, L, D);
  g.grad_value_cache = kvrope::bhsd<const T>(gv, H, L, D);
  g.key_states = kvrope::bhsd<const T>(k, H, S, D);
  g.cos = kvrope::bsd<const T>(cos, S, R);
  g.sin = kvrope::bsd<const T>(sin, S, R);
  g.cache_position = pos;
  g.grad_key_states = kvrope::bhsd(gks, H, S, D);
  g.grad_value_states = kvrope::bhsd(gvs, H, S, D);
  g.grad_cos = kvrope::bsd(gcos, S, R);
  g.grad_sin = kvrope::bsd(gsin, S, R);
  g.grad_key_cache_input = kvrope::bhsd(gk_in, H, L, D);
  g.grad_value_cache_input = kvrope::bhsd(gv_in, H, L, D);
  if (kvrope::Status s = kvrope::kv_cache_rope_backward<kvrope::HeadDims<64>>(g); !s) {  // D = 64 compiled alone
    std::printf("backward failed: %s (%s)\n", kvrope::to_string(s.code), s.field ? s.field : "-");
    return 1;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<T> o_gks = download(gks, tok), o_gvs = download(gvs, tok), o_gcos = download(gcos, tab),
                       o_gsin = download(gsin, tab), o_gk_in = download(gk_in, cache), o_gv_in = download(gv_in, cache);
  kvrope::BackwardParams<T> gin = g;
  gin.grad_key_cache = kvrope::bhsd<const T>(h_gk.data(), H, L, D);
  gin.grad_value_cache = kvrope::bhsd<const T>(h_gv.data(), H, L, D);
  gin.key_states = kvrope::bhsd<const T>(h_k.data(), H, S, D);
  gin.cos = kvrope::bsd<const T>(h_cos.data(), S, R);
  gin.sin = kvrope::bsd<const T>(h_sin.data(), S, R);
  gin.cache_position = h_pos.data();
  // grad_cos and grad_sin: [B, S, R], one table a batch, as the reference gives them.
  const kvrope::reference::BackwardGold bgold = kvrope::reference::cpu_backward(gin);
  const int64_t bwrong = wrong_computed(o_gks, bgold.grad_key_states) + wrong_copied(o_gvs, bgold.grad_value_states) +
                         wrong_computed(o_gcos, bgold.grad_cos) + wrong_computed(o_gsin, bgold.grad_sin) +
                         wrong_copied(o_gk_in, bgold.grad_key_cache_input) +
                         wrong_copied(o_gv_in, bgold.grad_value_cache_input);
  std::printf("backward: %zu values checked, %lld mismatches\n", 2 * tok + 2 * tab + 2 * cache,
              static_cast<long long>(bwrong));
  for (void* p :
       {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(cos), static_cast<void*>(sin),
        static_cast<void*>(kc), static_cast<void*>(vc), static_cast<void*>(k_out), static_cast<void*>(pos),
        static_cast<void*>(gk), static_cast<void*>(gv), static_cast<void*>(gks), static_cast<void*>(gvs),
        static_cast<void*>(gcos), static_cast<void*>(gsin), static_cast<void*>(gk_in), static_cast<void*>(gv_in)})
    cudaFree(p);
  return fwrong == 0 && bwrong == 0 ? 0 : 1;
}
