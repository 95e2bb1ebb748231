// The naive serving forward: the serving step as two-call engines run it (docs/spec.md §6), two simple
// launches. Launch 1 is vLLM's rotary_embedding: q and k rotated in place (or into query_out / key_out)
// from the table cache by positions, one thread a pair, after the optional per-head RMSNorm. Launch 2 is
// vLLM's reshape_and_cache_flash: the rotated k and v copied into the cache rows of slot_mapping, one
// thread an element, quantized to fp8 (x / scale, satfinite) when the cache is fp8. It is what the
// benchmark compares kv_cache_rope_append with (verify/naive/: not installed; the GPU tests check it
// against the float64 reference too, so that the baseline the benchmark times is right).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include <kvrope/append.cuh>
#include <kvrope/append_params.cuh>
#include <kvrope/core/dtype.cuh>
#include <kvrope/core/rotary.cuh>
#include <kvrope/core/status.cuh>
#include <kvrope/error_flag.cuh>

namespace kvrope::reference {

namespace naive_app {

inline constexpr int kCopyThreads = 256;
inline constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;  // launch 1 loops over rows beyond this

inline int copy_blocks(int64_t n) {
  const int64_t blocks = (n + kCopyThreads - 1) / kCopyThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

template <typename T, typename C, typename Pos>
__device__ inline bool position_ok(const AppendParams<T, C, Pos>& p, int64_t t) {
  const int64_t pos = static_cast<int64_t>(p.positions[t]);
  return pos >= 0 && pos < p.max_position;
}

template <typename T, typename C, typename Pos>
__device__ inline float table_at(const AppendParams<T, C, Pos>& p, int64_t i) {
  return p.cos_sin_cache_f32 ? p.cos_sin_cache_f32[i] : to_float(p.cos_sin_cache[i]);
}

// A value of T (already rounded: what launch 1 stored) as the cache stores it: itself, or fp8_satfinite(x /
// scale) with an IEEE division (nvcc's default -prec-div=true).
template <typename T, typename C>
__device__ inline C to_cache(T x, const float* scale, bool per_head, int64_t head) {
  if constexpr (std::is_same_v<C, T>) {
    return x;
  } else {
    const float s = scale == nullptr ? 1.0f : scale[per_head ? head : 0];
    constexpr __nv_fp8_interpretation_t kind = std::is_same_v<C, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    C out;
    out.__x = __nv_cvt_float_to_fp8(to_float(x) / s, __NV_SATFINITE, kind);
    return out;
  }
}

// Launch 1. A block a head row (q heads first, then k heads, token-major), a thread a rotated pair or a
// pass-through element, so that each thread reads its elements before any thread of the row writes (in
// place is safe). With a norm weight the row's sum of squares goes through shared memory, summed by every
// thread in the same order. A token whose position is out of range writes nothing.
template <typename T, typename C, typename Pos>
__global__ void rotary_embedding(AppendParams<T, C, Pos> p, int64_t rows) {
  extern __shared__ float squares[];  // one a thread
  const int64_t D = p.head_dim, R = p.rotary_dim == 0 ? D : p.rotary_dim, half = R / 2;
  const int64_t row_heads = p.query_heads + p.heads;
  const int items = static_cast<int>(D - half);  // == blockDim.x
  const int w = static_cast<int>(threadIdx.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // uniform over the block (barriers below)
    const int64_t t = row / row_heads, j = row % row_heads;
    if (!position_ok(p, t)) {
      if (j == 0 && w == 0 && p.error_flag) atomicOr(p.error_flag, kErrorPositionIdOutOfRange);
      continue;
    }
    const bool is_q = j < p.query_heads;
    const int64_t h = is_q ? j : j - p.query_heads;
    const T* in = is_q ? p.query.row(t, h) : p.key.row(t, h);
    T* out = is_q ? (p.query_out.data ? p.query_out.row(t, h) : p.query.row(t, h))
                  : (p.key_out.data ? p.key_out.row(t, h) : p.key.row(t, h));
    const T* weight = is_q ? p.query_norm_weight : p.key_norm_weight;
    // This thread's elements: the pair (ea, eb), or the pass-through element ea (eb < 0).
    const bool pair = w < half;
    const bool half_style = p.style == RotaryStyle::kRotateHalf;
    const int64_t ea = pair ? (half_style ? w : 2 * w) : R + (w - half);
    const int64_t eb = pair ? (half_style ? w + half : 2 * w + 1) : -1;
    float xa = to_float(in[ea]);
    float xb = pair ? to_float(in[eb]) : 0.0f;
    if (weight) {  // x * rsqrt(mean(x^2) + eps) * w, in fp32
      squares[w] = xa * xa + xb * xb;
      __syncthreads();
      float sum = 0.0f;
      for (int i = 0; i < items; ++i) sum += squares[i];
      __syncthreads();  // squares is the next row's
      const float inv_rms = 1.0f / sqrtf(sum / static_cast<float>(D) + p.norm_eps);
      const float plus = p.norm_weight_plus_one ? 1.0f : 0.0f;
      xa = xa * inv_rms * (to_float(weight[ea]) + plus);
      if (pair) xb = xb * inv_rms * (to_float(weight[eb]) + plus);
    }
    if (!pair) {
      out[ea] = weight ? from_float<T>(xa) : in[ea];
      continue;
    }
    const int64_t tr = static_cast<int64_t>(p.positions[t]);
    const float c = table_at(p, tr * R + w), s = table_at(p, tr * R + half + w);
    out[ea] = from_float<T>(xa * c - xb * s);
    out[eb] = from_float<T>(xb * c + xa * s);
  }
}

// Launch 2: one thread an element of a token's k and v rows. A negative slot writes nothing; a slot at or
// above num_pages * page_size writes nothing and is reported; so is nothing of a token whose position is out
// of range (launch 1 reported it). Repeated slots race, as in vLLM.
template <typename T, typename C, typename Pos>
__global__ void reshape_and_cache(AppendParams<T, C, Pos> p, TokenHeads<const T> keys, int64_t n) {
  const int64_t D = p.head_dim, H = p.heads, slots = p.num_pages * p.page_size;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = i % D, h = (i / D) % H, t = i / (D * H);
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0 || !position_ok(p, t)) continue;
    if (slot >= slots) {
      if (h == 0 && d == 0 && p.error_flag) atomicOr(p.error_flag, kErrorSlotOutOfRange);
      continue;
    }
    const int64_t page = slot / p.page_size, offset = slot % p.page_size;
    p.key_cache.row(page, offset, h)[d] = to_cache<T, C>(keys.row(t, h)[d], p.key_scale, p.scale_per_head, h);
    p.value_cache.row(page, offset, h)[d] = to_cache<T, C>(p.value.row(t, h)[d], p.value_scale, p.scale_per_head, h);
  }
}

}  // namespace naive_app

//! The serving forward in two launches, as vLLM runs it: rotary_embedding (q and k, optionally RMS-normed,
//! rotated in fp32 and rounded once to T) then reshape_and_cache_flash (RoPE(k) as rounded to T, and v, into
//! the cache rows, quantized from those T values when C is fp8, as kv_cache_rope_append quantizes). The rotated
//! k must land somewhere between the two launches: `key_in_place` or `key_out` is required. Unlike
//! kv_cache_rope_append, repeated slots race (the last token is not guaranteed to win). Validates as
//! kv_cache_rope_append does and launches nothing when the parameters are invalid.
template <typename T, typename C, typename Pos>
Status naive_append(const AppendParams<T, C, Pos>& p, cudaStream_t stream = nullptr) {
  if (Status s = validate(p); !s) return s;
  const int64_t T_ = p.tokens, H = p.heads, D = p.head_dim;
  const int64_t R = effective_rotary_dim(p.rotary_dim, D);
  if (T_ * H > 0 && !p.key_in_place && !p.key_out.data)
    return kvrope::detail::fail(StatusCode::kNullPointer, "key_out");
  const int64_t rows = T_ * (p.query_heads + H);
  const int items = static_cast<int>(D - R / 2);  // threads a row
  if (rows > 0) {
    const int blocks = static_cast<int>(rows < naive_app::kMaxRowBlocks ? rows : naive_app::kMaxRowBlocks);
    naive_app::rotary_embedding<T, C, Pos><<<blocks, items, sizeof(float) * items, stream>>>(p, rows);
  }
  const int64_t n = T_ * H * D;
  if (n > 0) {
    const TokenHeads<const T> keys = p.key_out.data ? TokenHeads<const T>(p.key_out) : TokenHeads<const T>(p.key);
    naive_app::reshape_and_cache<T, C, Pos>
        <<<naive_app::copy_blocks(n), naive_app::kCopyThreads, 0, stream>>>(p, keys, n);
  }
  return kvrope::detail::cuda_status(cudaGetLastError(), "naive kernel launch");
}

}  // namespace kvrope::reference
