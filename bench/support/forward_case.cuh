// One case of a forward suite: its tensors (shared by its variants; one case is alive at a time), the bytes a
// variant must move, and the check of a call against the float64 CPU reference (docs/spec.md §2).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <kvrope/kvrope.cuh>
#include <kvrope/reference/cpu_forward.hpp>

#include "verify/naive/naive_forward.cuh"
#include "verify/check_forward.hpp"

#include "cases.hpp"
#include "check.cuh"
#include "device.cuh"
#include "fill.cuh"
#include "options.cuh"
#include "runner.cuh"

namespace kvrope_bench {

// The rotary convention of a forward variant: the style and R (rotate-half R = D but for half_r64: R = D / 2).
struct FwdShape {
  kvrope::RotaryStyle style = kvrope::RotaryStyle::kRotateHalf;
  int64_t rotary_dim = 0;
};

inline FwdShape fwd_shape(FwdVariant v, int64_t head_dim) {
  if (v == FwdVariant::kInterleaved) return {kvrope::RotaryStyle::kInterleaved, head_dim};
  if (v == FwdVariant::kHalfR64) return {kvrope::RotaryStyle::kRotateHalf, head_dim / 2};
  return {kvrope::RotaryStyle::kRotateHalf, head_dim};
}

inline const char* style_name(kvrope::RotaryStyle s) {
  return s == kvrope::RotaryStyle::kInterleaved ? "interleaved" : "rotate_half";
}

// Least bytes a forward call moves: k and v read (2 B H S D), the tables read (2 B S R), the cache rows written
// (2 B H S D) and k_out written (B H S D); no q in these suites (it would add 2 B Hq S D).
inline double forward_bytes(const LeaderboardCase& lc, int64_t rotary_dim, size_t elem_bytes) {
  const double b = static_cast<double>(lc.batch), s = static_cast<double>(lc.seq_len);
  const double h = static_cast<double>(lc.heads), d = static_cast<double>(lc.head_dim);
  const double r = static_cast<double>(rotary_dim), e = static_cast<double>(elem_bytes);
  return e * (5 * b * h * s * d + 2 * b * s * r);
}

template <typename T>
struct ForwardCaseData : CaseDataBase {
  using Pos = int64_t;
  int64_t B = 0, H = 0, S = 0, Smax = 0, D = 0;
  size_t cache_elems = 0, state_elems = 0, table_elems = 0;
  uint64_t seed = 0;
  int fill_blocks = 0;

  // Inputs (the tables [B, S, D]; a variant with R < D reads their first B S R elements as [B, S, R]), the
  // caches (random: rows no token writes are checked too), k_out, the naive reference's workspace.
  DeviceBuffer k, v, cos, sin, pos, key_cache, value_cache, key_out, error_flag, naive_ws;

  // Host copies of the inputs and of the caches before a call, made at the first check.
  HostArray<T> k_h, v_h, cos_h, sin_h, key_cache_h, value_cache_h, key_out_h;
  std::vector<Pos> pos_h;
  bool host_ready = false;

  ForwardCaseData(const LeaderboardCase& lc, const Options& opt, int blocks, cudaStream_t stream) {
    case_id = lc.id;
    B = lc.batch;
    H = lc.heads;
    S = lc.seq_len;
    Smax = lc.cache_len;
    D = lc.head_dim;
    fill_blocks = blocks;
    cache_elems = static_cast<size_t>(B * H * Smax * D);
    state_elems = static_cast<size_t>(B * H * S * D);
    table_elems = static_cast<size_t>(B * S * D);
    k = DeviceBuffer(state_elems * sizeof(T));
    v = DeviceBuffer(state_elems * sizeof(T));
    cos = DeviceBuffer(table_elems * sizeof(T));
    sin = DeviceBuffer(table_elems * sizeof(T));
    key_cache = DeviceBuffer(cache_elems * sizeof(T));
    value_cache = DeviceBuffer(cache_elems * sizeof(T));
    key_out = DeviceBuffer(state_elems * sizeof(T));
    pos = DeviceBuffer(static_cast<size_t>(S) * sizeof(Pos));
    error_flag = DeviceBuffer(sizeof(int));

    seed = splitmix64(opt.seed ^ (static_cast<uint64_t>(lc.id) << 32) ^ 0xF0F0ull);
    fill_normal(k.as<T>(), static_cast<int64_t>(state_elems), seed + 1, fill_blocks, stream);
    fill_normal(v.as<T>(), static_cast<int64_t>(state_elems), seed + 2, fill_blocks, stream);
    fill_normal(cos.as<T>(), static_cast<int64_t>(table_elems), seed + 3, fill_blocks, stream);
    fill_normal(sin.as<T>(), static_cast<int64_t>(table_elems), seed + 4, fill_blocks, stream);
    reset_caches(stream);

    pos_h.resize(static_cast<size_t>(S));
    const std::vector<int64_t> p = make_positions(positions_of(lc, opt), S, Smax, seed);
    std::copy(p.begin(), p.end(), pos_h.begin());
    KVROPE_BENCH_CUDA(cudaMemcpy(pos.as<Pos>(), pos_h.data(), pos.bytes(), cudaMemcpyHostToDevice));
    KVROPE_BENCH_CUDA(cudaMemset(error_flag.as<int>(), 0, sizeof(int)));
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  // The caches' initial random contents, the same bits every time (the same seeds).
  void reset_caches(cudaStream_t stream) const {
    fill_normal(key_cache.as<T>(), static_cast<int64_t>(cache_elems), seed + 5, fill_blocks, stream);
    fill_normal(value_cache.as<T>(), static_cast<int64_t>(cache_elems), seed + 6, fill_blocks, stream);
  }

  // The call of a variant: per-token tables [B, S, R] (batch stride S R, as Hugging Face passes them),
  // cache_position arange(S) (or random rows), in place into the caches, k_out on, no q.
  kvrope::ForwardParams<T, Pos> params(const FwdShape& shape) const {
    kvrope::ForwardParams<T, Pos> p;
    p.batch = B;
    p.heads = H;
    p.seq_len = S;
    p.cache_len = Smax;
    p.head_dim = D;
    p.rotary_dim = shape.rotary_dim;
    p.style = shape.style;
    p.key_states = kvrope::bhsd(static_cast<const T*>(k.as<T>()), H, S, D);
    p.value_states = kvrope::bhsd(static_cast<const T*>(v.as<T>()), H, S, D);
    p.key_cache = kvrope::bhsd(key_cache.as<T>(), H, Smax, D);
    p.value_cache = kvrope::bhsd(value_cache.as<T>(), H, Smax, D);
    p.cache_position = pos.as<const Pos>();
    p.key_out = kvrope::bhsd(key_out.as<T>(), H, S, D);
    p.cos = kvrope::bsd(static_cast<const T*>(cos.as<T>()), S, shape.rotary_dim);
    p.sin = kvrope::bsd(static_cast<const T*>(sin.as<T>()), S, shape.rotary_dim);
    p.error_flag = error_flag.as<int>();
    return p;
  }

  void* naive_workspace(const kvrope::ForwardParams<T, Pos>& p, size_t* bytes) {
    const size_t need = kvrope::reference::naive_forward_workspace_bytes(p);
    if (naive_ws.bytes() < need) naive_ws = DeviceBuffer(need);
    *bytes = naive_ws.bytes();
    return naive_ws.as<void>();
  }

  // Before the checked call: the caches reset to their initial contents, k_out poisoned (all bits set: NaN in
  // every dtype, so an element left unwritten fails), and the host copies of the inputs taken the first time.
  void prepare_check(cudaStream_t stream) {
    reset_caches(stream);
    KVROPE_BENCH_CUDA(cudaMemsetAsync(key_out.as<void>(), 0xFF, key_out.bytes(), stream));
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
    if (host_ready) return;
    k_h = to_host<T>(k);
    v_h = to_host<T>(v);
    cos_h = to_host<T>(cos);
    sin_h = to_host<T>(sin);
    key_cache_h = to_host<T>(key_cache);
    value_cache_h = to_host<T>(value_cache);
    key_out_h = to_host<T>(key_out);
    host_ready = true;
  }

  // Compares the whole caches and k_out after the checked call of `dev` with the float64 reference; empty
  // when everything matches.
  std::string check(const kvrope::ForwardParams<T, Pos>& dev) const {
    const HostArray<T> kc = to_host<T>(key_cache), vc = to_host<T>(value_cache), ko = to_host<T>(key_out);
    kvrope::ForwardParams<T, Pos> in = dev;  // the inputs as the reference takes them: host copies
    in.key_states.data = k_h.data();
    in.value_states.data = v_h.data();
    in.key_cache.data = key_cache_h.data();
    in.value_cache.data = value_cache_h.data();
    in.key_out.data = key_out_h.data();
    in.cos.data = cos_h.data();
    in.sin.data = sin_h.data();
    in.cache_position = pos_h.data();
    in.error_flag = nullptr;
    kvrope::verify::ForwardOutputs<T> out;
    out.key_cache = kvrope::bhsd(static_cast<const T*>(kc.data()), H, Smax, D);
    out.value_cache = kvrope::bhsd(static_cast<const T*>(vc.data()), H, Smax, D);
    out.key_out = kvrope::bhsd(static_cast<const T*>(ko.data()), H, S, D);
    const kvrope::verify::CheckResult r = kvrope::verify::check_forward(in, out);
    if (r.ok()) return std::string();
    return "check failed: " + std::to_string(r.mismatches) + " of " + std::to_string(r.checked) +
           " elements mismatch; first: " + r.first_mismatch;
  }

  int read_error_flag() const {
    int flag = 0;
    KVROPE_BENCH_CUDA(cudaMemcpy(&flag, error_flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost));
    return flag;
  }
};

}  // namespace kvrope_bench
