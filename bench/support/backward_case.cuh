// A backward case's tensors, shared by its variants, and its check against the float64 CPU reference
// (docs/spec.md §1.7).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <kvrope/kvrope.cuh>
#include <kvrope/reference/cpu_backward.hpp>

#include "verify/naive/naive_backward.cuh"
#include "verify/check_backward.hpp"

#include "cases.hpp"
#include "check.cuh"
#include "device.cuh"
#include "fill.cuh"
#include "options.cuh"
#include "runner.cuh"

namespace kvrope_bench {

template <typename T>
struct CaseData : CaseDataBase {
  using Pos = int64_t;
  int64_t B = 0, H = 0, S = 0, Smax = 0, D = 0;
  size_t cache_elems = 0, state_elems = 0, token_elems = 0;
  bool with_workspace = true;

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

  CaseData(const LeaderboardCase& lc, const Options& opt, int fill_blocks, cudaStream_t stream) {
    case_id = lc.id;
    B = lc.batch;
    H = lc.heads;
    S = lc.seq_len;
    Smax = lc.cache_len;
    D = lc.head_dim;
    with_workspace = opt.workspace;
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

    const uint64_t seed = splitmix64(opt.seed ^ (static_cast<uint64_t>(lc.id) << 32));
    fill_normal(gk.as<T>(), static_cast<int64_t>(cache_elems), seed + 1, fill_blocks, stream);
    fill_normal(gv.as<T>(), static_cast<int64_t>(cache_elems), seed + 2, fill_blocks, stream);
    fill_normal(k.as<T>(), static_cast<int64_t>(state_elems), seed + 3, fill_blocks, stream);
    fill_normal(cos.as<T>(), static_cast<int64_t>(token_elems), seed + 4, fill_blocks, stream);
    fill_normal(sin.as<T>(), static_cast<int64_t>(token_elems), seed + 5, fill_blocks, stream);

    pos_h.resize(static_cast<size_t>(S));
    const std::vector<int64_t> p = make_positions(positions_of(lc, opt), S, Smax, seed);
    std::copy(p.begin(), p.end(), pos_h.begin());
    KVROPE_BENCH_CUDA(cudaMemcpy(pos.as<Pos>(), pos_h.data(), pos.bytes(), cudaMemcpyHostToDevice));
    KVROPE_BENCH_CUDA(cudaMemset(error_flag.as<int>(), 0, sizeof(int)));
    KVROPE_BENCH_CUDA(cudaMemset(workspace.as<void>(), 0, workspace.bytes()));  // once: the kernel leaves it zero
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
    p.workspace = with_workspace ? workspace.as<void>() : nullptr;
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
      naive_ws = DeviceBuffer(kvrope::reference::naive_backward_workspace_bytes(out_of_place()));
      naive_ws_ready = true;
    }
    *bytes = naive_ws.bytes();
    return naive_ws.as<void>();
  }

  // Poisons the outputs (all bits set: NaN in every dtype) so an output left unwritten fails the check.
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

  // Compares what the call wrote with the float64 reference; empty when everything matches.
  std::string check(const DeviceBuffer& cache_k_out, const DeviceBuffer& cache_v_out) {
    copy_inputs_to_host();
    const HostArray<T> gks_h = to_host<T>(gks), gvs_h = to_host<T>(gvs);
    const HostArray<T> gcos_h = to_host<T>(gcos), gsin_h = to_host<T>(gsin);
    const HostArray<T> gk_out_h = to_host<T>(cache_k_out), gv_out_h = to_host<T>(cache_v_out);
    kvrope::verify::BackwardOutputs<T> out;
    out.grad_key_states = kvrope::bhsd(static_cast<const T*>(gks_h.data()), H, S, D);
    out.grad_value_states = kvrope::bhsd(static_cast<const T*>(gvs_h.data()), H, S, D);
    out.grad_key_cache_input = kvrope::bhsd(static_cast<const T*>(gk_out_h.data()), H, Smax, D);
    out.grad_value_cache_input = kvrope::bhsd(static_cast<const T*>(gv_out_h.data()), H, Smax, D);
    out.grad_cos = kvrope::bsd(static_cast<const T*>(gcos_h.data()), S, D);
    out.grad_sin = kvrope::bsd(static_cast<const T*>(gsin_h.data()), S, D);
    const kvrope::verify::CheckResult r = kvrope::verify::check_backward(host_inputs(), out);
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

}  // namespace kvrope_bench
