// The C++ side of kvrope_torch: the tensors of each op, their checks (checks.cpp) and the per-dtype
// CUDA entry points (ops_cuda.cpp, over the launchers of launch.h).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>

#include <string>
#include <vector>

namespace kvrope_torch {

//! The dispatcher's handle of op `name` ("kvrope::backward"), typed by its C++ signature.
template <typename Signature>
c10::TypedOperatorHandle<Signature> typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

//! kvrope::forward_: k, v rotated / copied into the caches at cache_position (in place), RoPE(k) into
//! key_out when given, q rotated into query_out (or in place when query_out is absent).
struct ForwardTensors {
  at::Tensor key_states, value_states, key_cache, value_cache, cache_position;
  c10::optional<at::Tensor> cos, sin, cos_sin_cache, position_ids, query, query_out, key_out, error_flag;
  int64_t rotary_dim = 0, style = 0;
};

//! kvrope::backward / backward_: the gradients of k, v (and of cos, sin when grad_cos is given) from
//! the caches' gradients; out of place into grad_*_cache_input, or in place when those are absent.
struct BackwardTensors {
  at::Tensor grad_key_cache, grad_value_cache, cache_position, cos, sin, grad_key_states, grad_value_states;
  c10::optional<at::Tensor> key_states, grad_cos, grad_sin, grad_key_cache_input, grad_value_cache_input, error_flag;
  int64_t rotary_dim = 0, style = 0;
};

//! kvrope::rope_append_ (the serving forward, docs/spec.md §6): q [T, Hq, D] and k [T, H, D] optionally
//! RMS-normed and rotated (q in place or into query_out, in q's dtype or fp8 e4m3 divided by q_scale; k
//! into key_out, or in place with key_in_place), RoPE(k) and v written to the caches' rows of
//! slot_mapping, quantized for fp8 and NVFP4 caches. A cache is [pages, P, H, D] by its strides (NHD, or HND
//! as its transpose(1, 2) view) or flat [slots, H, D]; an NVFP4 cache's rows are D / 2 bytes of codes, its
//! block scales (key_cache_sf, value_cache_sf) the same shape with D / 16 e4m3 bytes. With mrope_section,
//! positions is [3, T] (mRoPE).
struct AppendTensors {
  c10::optional<at::Tensor> query;
  at::Tensor key, value, positions, cos_sin_cache, key_cache, value_cache, slot_mapping;
  c10::optional<at::Tensor> query_out, key_out, query_norm_weight, key_norm_weight, k_scale, v_scale, error_flag,
      q_scale, key_cache_sf, value_cache_sf;
  bool key_in_place = false, norm_weight_plus_one = false;
  bool enable_pdl = false;  // a programmatic dependent launch (kvrope::AppendParams::enable_pdl)
  // mRoPE: positions [3, T] with three sections (empty: positions [T])
  std::vector<int64_t> mrope_section;
  bool mrope_interleaved = false;
  double norm_eps = 1e-6;
  std::string kv_cache_dtype = "auto";
  int64_t rotary_dim = 0, style = 0;
};

//! kvrope::mla_append_ (the MLA latent-cache append, docs/spec.md §6.6; kvrope::MlaAppendParams): q_pe
//! [T, Hq, R] rotated in place or into query_out [T, Hq, N + R] (q's dtype, or fp8 e4m3 divided by q_scale),
//! q_nope [T, Hq, N] copied into query_out's first N dims when given; the latent row [kv_c | RoPE(k_pe)] of
//! each token written to slot slot_mapping[t] of latent_cache [pages, P, L + R] (vLLM's one cache) or, with
//! rope_cache, of latent_cache [pages, P, L] and rope_cache [pages, P, R] (FlashInfer's ckv and kpe), quantized
//! for fp8 caches (kv_scale, one element).
struct MlaTensors {
  c10::optional<at::Tensor> query_pe;
  at::Tensor kv_c, k_pe, positions, cos_sin_cache, latent_cache, slot_mapping;
  c10::optional<at::Tensor> rope_cache, query_nope, query_out, kv_scale, q_scale, error_flag;
  std::string kv_cache_dtype = "auto";
  int64_t style = 1;        // kvrope::RotaryStyle: 0 rotate-half, 1 interleaved (DeepSeek's)
  bool enable_pdl = false;  // a programmatic dependent launch (kvrope::MlaAppendParams::enable_pdl)
};

//! The element type of a call's caches: q's dtype, fp8 (a float8 tensor, or uint8 named by kv_cache_dtype), or
//! NVFP4 (uint8, kv_cache_dtype 'nvfp4').
enum class CacheType : int { kSame, kFp8E4m3, kFp8E5m2, kNvfp4 };

//! The CUDA forward's checks (every tensor of `t`, rotary_dim, style); returns kvrope's rotary_dim (the
//! tables' R; 0 for R = D).
int64_t check_forward(const ForwardTensors& t);
//! The CUDA backward's checks (inputs only: the op allocates its outputs); returns kvrope's rotary_dim.
int64_t check_backward(const at::Tensor& grad_key_cache, const at::Tensor& grad_value_cache,
                       const c10::optional<at::Tensor>& key_states, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& cache_position, int64_t rotary_dim, int64_t style, bool table_grads);

//! The CUDA serving forward's checks; returns the caches' type and sets t.rotary_dim to kvrope's.
CacheType check_append(AppendTensors& t);
//! The MLA append's checks; returns the caches' type (kSame, kFp8E4m3 or kFp8E5m2).
CacheType check_mla_append(const MlaTensors& t);

enum class DType : int { kBf16, kFp16, kFp32 };

template <DType kDType>
void forward_cuda(const ForwardTensors& t);
template <DType kDType>
void backward_cuda(const BackwardTensors& t);
template <DType kDType>
void append_cuda(const AppendTensors& t, CacheType cache);
template <DType kDType>
void mla_append_cuda(const MlaTensors& t, CacheType cache);

}  // namespace kvrope_torch
