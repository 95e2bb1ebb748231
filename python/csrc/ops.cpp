// The kvrope ops' schemas (namespace kvrope) and their CUDA implementations, which check their
// arguments (checks.cpp) before any launch; kvrope's validate() checks them again. The CPU
// implementations, the fake (meta) ones and autograd are registered in Python (kvrope_torch/_ops.py).
#include <ATen/cuda/EmptyTensor.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <array>
#include <string>

#include "ops.h"

namespace kvrope_torch {
namespace {

template <typename Tensors>
void dispatch_dtype(const at::Tensor& x, const Tensors& t, void (*bf16)(const Tensors&), void (*fp16)(const Tensors&),
                    void (*fp32)(const Tensors&)) {
  switch (x.scalar_type()) {
    case at::kBFloat16: return bf16(t);
    case at::kHalf: return fp16(t);
    case at::kFloat: return fp32(t);
    default: TORCH_CHECK(false, "kvrope: CUDA tensors must be bfloat16, float16 or float32, not ", x.scalar_type());
  }
}

void run_forward(const ForwardTensors& t) {
  dispatch_dtype(t.key_states, t, &forward_cuda<DType::kBf16>, &forward_cuda<DType::kFp16>,
                 &forward_cuda<DType::kFp32>);
}
void run_backward(const BackwardTensors& t) {
  dispatch_dtype(t.grad_key_cache, t, &backward_cuda<DType::kBf16>, &backward_cuda<DType::kFp16>,
                 &backward_cuda<DType::kFp32>);
}

void forward_inplace_cuda(const at::Tensor& key_states, const at::Tensor& value_states, const at::Tensor& key_cache,
                          const at::Tensor& value_cache, const at::Tensor& cache_position,
                          const c10::optional<at::Tensor>& cos, const c10::optional<at::Tensor>& sin,
                          const c10::optional<at::Tensor>& cos_sin_cache, const c10::optional<at::Tensor>& position_ids,
                          const c10::optional<at::Tensor>& query, const c10::optional<at::Tensor>& query_out,
                          const c10::optional<at::Tensor>& key_out, const c10::optional<at::Tensor>& error_flag,
                          int64_t rotary_dim, int64_t style) {
  ForwardTensors t{key_states,   value_states, key_cache, value_cache, cache_position, cos,        sin,  cos_sin_cache,
                   position_ids, query,        query_out, key_out,     error_flag,     rotary_dim, style};
  t.rotary_dim = check_forward(t);
  run_forward(t);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_cuda_functional(
    const at::Tensor& key_states, const at::Tensor& value_states, const at::Tensor& key_cache,
    const at::Tensor& value_cache, const at::Tensor& cache_position, const at::Tensor& cos, const at::Tensor& sin,
    int64_t rotary_dim, int64_t style) {
  ForwardTensors t{key_states, value_states, key_cache, value_cache, cache_position, cos,  sin, {}, {},
                   {},         {},           {},        {},          rotary_dim,     style};
  t.rotary_dim = check_forward(t);
  t.key_cache = key_cache.clone();
  t.value_cache = value_cache.clone();
  t.key_out = at::empty_like(key_states);
  run_forward(t);
  return {t.key_cache, t.value_cache, *t.key_out};
}

// kvrope::rope_append_ on CUDA: checks (checks.cpp), then the launch for q's dtype and the caches' type.
void append_inplace_cuda(const c10::optional<at::Tensor>& query, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& positions, const at::Tensor& cos_sin_cache, const at::Tensor& key_cache,
                         const at::Tensor& value_cache, const at::Tensor& slot_mapping,
                         const c10::optional<at::Tensor>& query_out, const c10::optional<at::Tensor>& key_out,
                         bool key_in_place, const c10::optional<at::Tensor>& query_norm_weight,
                         const c10::optional<at::Tensor>& key_norm_weight, double norm_eps, bool norm_weight_plus_one,
                         c10::string_view kv_cache_dtype, const c10::optional<at::Tensor>& k_scale,
                         const c10::optional<at::Tensor>& v_scale, const c10::optional<at::Tensor>& error_flag,
                         int64_t rotary_dim, int64_t style, const c10::optional<at::Tensor>& q_scale, bool enable_pdl,
                         c10::IntArrayRef mrope_section, bool mrope_interleaved,
                         const c10::optional<at::Tensor>& key_cache_sf,
                         const c10::optional<at::Tensor>& value_cache_sf) {
  AppendTensors t;
  t.query = query;
  t.key = key;
  t.value = value;
  t.positions = positions;
  t.cos_sin_cache = cos_sin_cache;
  t.key_cache = key_cache;
  t.value_cache = value_cache;
  t.slot_mapping = slot_mapping;
  t.query_out = query_out;
  t.key_out = key_out;
  t.key_in_place = key_in_place;
  t.query_norm_weight = query_norm_weight;
  t.key_norm_weight = key_norm_weight;
  t.norm_eps = norm_eps;
  t.norm_weight_plus_one = norm_weight_plus_one;
  t.kv_cache_dtype = std::string(kv_cache_dtype);
  t.k_scale = k_scale;
  t.v_scale = v_scale;
  t.error_flag = error_flag;
  t.rotary_dim = rotary_dim;
  t.style = style;
  t.q_scale = q_scale;
  t.enable_pdl = enable_pdl;
  t.mrope_section.assign(mrope_section.begin(), mrope_section.end());
  t.mrope_interleaved = mrope_interleaved;
  t.key_cache_sf = key_cache_sf;
  t.value_cache_sf = value_cache_sf;
  const CacheType cache = check_append(t);
  switch (t.key.scalar_type()) {
    case at::kBFloat16: return append_cuda<DType::kBf16>(t, cache);
    case at::kHalf: return append_cuda<DType::kFp16>(t, cache);
    default: return append_cuda<DType::kFp32>(t, cache);  // (check_append allows these three)
  }
}

// kvrope::mla_append_ on CUDA: checks (checks.cpp), then the launch for kv_c's dtype and the caches' type.
void mla_append_inplace_cuda(const c10::optional<at::Tensor>& query_pe, const at::Tensor& kv_c, const at::Tensor& k_pe,
                             const at::Tensor& positions, const at::Tensor& cos_sin_cache,
                             const at::Tensor& latent_cache, const at::Tensor& slot_mapping,
                             const c10::optional<at::Tensor>& rope_cache, const c10::optional<at::Tensor>& query_nope,
                             const c10::optional<at::Tensor>& query_out, c10::string_view kv_cache_dtype,
                             const c10::optional<at::Tensor>& kv_scale, const c10::optional<at::Tensor>& q_scale,
                             const c10::optional<at::Tensor>& error_flag, int64_t style, bool enable_pdl) {
  MlaTensors t;
  t.query_pe = query_pe;
  t.kv_c = kv_c;
  t.k_pe = k_pe;
  t.positions = positions;
  t.cos_sin_cache = cos_sin_cache;
  t.latent_cache = latent_cache;
  t.slot_mapping = slot_mapping;
  t.rope_cache = rope_cache;
  t.query_nope = query_nope;
  t.query_out = query_out;
  t.kv_cache_dtype = std::string(kv_cache_dtype);
  t.kv_scale = kv_scale;
  t.q_scale = q_scale;
  t.error_flag = error_flag;
  t.style = style;
  t.enable_pdl = enable_pdl;
  const CacheType cache = check_mla_append(t);
  switch (kv_c.scalar_type()) {
    case at::kBFloat16: return mla_append_cuda<DType::kBf16>(t, cache);
    case at::kHalf: return mla_append_cuda<DType::kFp16>(t, cache);
    default: return mla_append_cuda<DType::kFp32>(t, cache);  // (check_mla_append allows these three)
  }
}

// A contiguous tensor of `sizes` like `like` (a CUDA tensor), allocated without a trip through the
// dispatcher: each output costs a call host time (docs/benchmarks.md, "PyTorch comparison"). Every
// output has an allocation of its own: torch's custom-op contract (opcheck) has outputs alias nothing.
at::Tensor empty_rows(at::IntArrayRef sizes, const at::Tensor& like) {
  return at::Tensor(at::detail::empty_cuda(sizes, like.scalar_type(), like.device(), c10::nullopt));
}

// The backward's outputs, contiguous (as the CPU and fake implementations make them), and the call:
// out of place into new cache-input gradients, or in place (the caches' gradients become them). The
// table gradients have the tables' shape ([B, S, R], or [1, S, R] when shared: summed over B), or
// none without table gradients.
struct BackwardOutputs {
  at::Tensor gk, gv, gc, gs, gkc, gvc;
};
BackwardOutputs backward_into_new(const at::Tensor& grad_key_cache, const at::Tensor& grad_value_cache,
                                  const c10::optional<at::Tensor>& key_states, const at::Tensor& cos,
                                  const at::Tensor& sin, const at::Tensor& cache_position, int64_t rotary_dim,
                                  int64_t style, bool table_grads_wanted, bool in_place) {
  rotary_dim = check_backward(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim, style,
                              table_grads_wanted);
  const auto B = grad_key_cache.size(0), H = grad_key_cache.size(1), D = grad_key_cache.size(3);
  const std::array<int64_t, 4> token_rows{B, H, cache_position.size(0), D};
  const std::array<int64_t, 1> none{0};
  const at::IntArrayRef table = table_grads_wanted ? cos.sizes() : at::IntArrayRef(none);
  BackwardOutputs o{empty_rows(token_rows, grad_key_cache),
                    empty_rows(token_rows, grad_key_cache),
                    empty_rows(table, cos),
                    empty_rows(table, cos),
                    {},
                    {}};
  if (!in_place) {
    o.gkc = empty_rows(grad_key_cache.sizes(), grad_key_cache);
    o.gvc = empty_rows(grad_value_cache.sizes(), grad_value_cache);
  }
  auto given = [](const at::Tensor& x, bool on) { return on ? c10::optional<at::Tensor>(x) : c10::nullopt; };
  run_backward({grad_key_cache,
                grad_value_cache,
                cache_position,
                cos,
                sin,
                o.gk,
                o.gv,
                key_states,
                given(o.gc, table_grads_wanted),
                given(o.gs, table_grads_wanted),
                given(o.gkc, !in_place),
                given(o.gvc, !in_place),
                {},
                rotary_dim,
                style});
  return o;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_cuda_functional(
    const at::Tensor& grad_key_cache, const at::Tensor& grad_value_cache, const c10::optional<at::Tensor>& key_states,
    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& cache_position, int64_t rotary_dim, int64_t style,
    bool table_grads_wanted) {
  BackwardOutputs o = backward_into_new(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position,
                                        rotary_dim, style, table_grads_wanted, false);
  return {o.gk, o.gv, o.gc, o.gs, o.gkc, o.gvc};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_cuda_inplace(
    const at::Tensor& grad_key_cache, const at::Tensor& grad_value_cache, const c10::optional<at::Tensor>& key_states,
    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& cache_position, int64_t rotary_dim, int64_t style,
    bool table_grads_wanted) {
  BackwardOutputs o = backward_into_new(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position,
                                        rotary_dim, style, table_grads_wanted, true);
  return {o.gk, o.gv, o.gc, o.gs};
}

// The in-place ops' ADInplaceOrView kernels: the op below them, then the version counter of every
// tensor it wrote, as torch's own in-place ops do, so that autograd detects a tensor it saved and one of
// these ops changed (a custom op gets no such bump from torch; its CPU kernels bump by their writes).
void bump(const c10::optional<at::Tensor>& x) {
  if (x.has_value() && x->defined()) torch::autograd::increment_version(*x);
}

void forward_inplace_versions(c10::DispatchKeySet keys, const at::Tensor& key_states, const at::Tensor& value_states,
                              const at::Tensor& key_cache, const at::Tensor& value_cache,
                              const at::Tensor& cache_position, const c10::optional<at::Tensor>& cos,
                              const c10::optional<at::Tensor>& sin, const c10::optional<at::Tensor>& cos_sin_cache,
                              const c10::optional<at::Tensor>& position_ids, const c10::optional<at::Tensor>& query,
                              const c10::optional<at::Tensor>& query_out, const c10::optional<at::Tensor>& key_out,
                              const c10::optional<at::Tensor>& error_flag, int64_t rotary_dim, int64_t style) {
  static const auto op = typed_op<decltype(forward_inplace_cuda)>("kvrope::forward_");
  {
    const at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatch(keys & c10::after_ADInplaceOrView_keyset, key_states, value_states, key_cache, value_cache,
                  cache_position, cos, sin, cos_sin_cache, position_ids, query, query_out, key_out, error_flag,
                  rotary_dim, style);
  }
  bump(key_cache);
  bump(value_cache);
  bump(query_out.has_value() ? query_out : query);
  bump(key_out);
  bump(error_flag);
}

void append_inplace_versions(c10::DispatchKeySet keys, const c10::optional<at::Tensor>& query, const at::Tensor& key,
                             const at::Tensor& value, const at::Tensor& positions, const at::Tensor& cos_sin_cache,
                             const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slot_mapping,
                             const c10::optional<at::Tensor>& query_out, const c10::optional<at::Tensor>& key_out,
                             bool key_in_place, const c10::optional<at::Tensor>& query_norm_weight,
                             const c10::optional<at::Tensor>& key_norm_weight, double norm_eps,
                             bool norm_weight_plus_one, c10::string_view kv_cache_dtype,
                             const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                             const c10::optional<at::Tensor>& error_flag, int64_t rotary_dim, int64_t style,
                             const c10::optional<at::Tensor>& q_scale, bool enable_pdl, c10::IntArrayRef mrope_section,
                             bool mrope_interleaved, const c10::optional<at::Tensor>& key_cache_sf,
                             const c10::optional<at::Tensor>& value_cache_sf) {
  static const auto op = typed_op<decltype(append_inplace_cuda)>("kvrope::rope_append_");
  {
    const at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatch(keys & c10::after_ADInplaceOrView_keyset, query, key, value, positions, cos_sin_cache, key_cache,
                  value_cache, slot_mapping, query_out, key_out, key_in_place, query_norm_weight, key_norm_weight,
                  norm_eps, norm_weight_plus_one, kv_cache_dtype, k_scale, v_scale, error_flag, rotary_dim, style,
                  q_scale, enable_pdl, mrope_section, mrope_interleaved, key_cache_sf, value_cache_sf);
  }
  bump(key_cache);
  bump(value_cache);
  bump(key_cache_sf);
  bump(value_cache_sf);
  bump(query_out.has_value() ? query_out : query);
  bump(key_out);
  if (key_in_place) bump(key);
  bump(error_flag);
}

void mla_append_inplace_versions(c10::DispatchKeySet keys, const c10::optional<at::Tensor>& query_pe,
                                 const at::Tensor& kv_c, const at::Tensor& k_pe, const at::Tensor& positions,
                                 const at::Tensor& cos_sin_cache, const at::Tensor& latent_cache,
                                 const at::Tensor& slot_mapping, const c10::optional<at::Tensor>& rope_cache,
                                 const c10::optional<at::Tensor>& query_nope,
                                 const c10::optional<at::Tensor>& query_out, c10::string_view kv_cache_dtype,
                                 const c10::optional<at::Tensor>& kv_scale, const c10::optional<at::Tensor>& q_scale,
                                 const c10::optional<at::Tensor>& error_flag, int64_t style, bool enable_pdl) {
  static const auto op = typed_op<decltype(mla_append_inplace_cuda)>("kvrope::mla_append_");
  {
    const at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatch(keys & c10::after_ADInplaceOrView_keyset, query_pe, kv_c, k_pe, positions, cos_sin_cache,
                  latent_cache, slot_mapping, rope_cache, query_nope, query_out, kv_cache_dtype, kv_scale, q_scale,
                  error_flag, style, enable_pdl);
  }
  bump(latent_cache);
  bump(rope_cache);
  bump(query_out.has_value() ? query_out : query_pe);
  bump(error_flag);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_inplace_versions(
    c10::DispatchKeySet keys, const at::Tensor& grad_key_cache, const at::Tensor& grad_value_cache,
    const c10::optional<at::Tensor>& key_states, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& cache_position, int64_t rotary_dim, int64_t style, bool table_grads) {
  static const auto op = typed_op<decltype(backward_cuda_inplace)>("kvrope::backward_");
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> out;
  {
    const at::AutoDispatchBelowADInplaceOrView guard;
    out = op.redispatch(keys & c10::after_ADInplaceOrView_keyset, grad_key_cache, grad_value_cache, key_states, cos,
                        sin, cache_position, rotary_dim, style, table_grads);
  }
  bump(grad_key_cache);
  bump(grad_value_cache);
  return out;
}

}  // namespace

TORCH_LIBRARY(kvrope, m) {
  // The functional forward (autograd): new caches and RoPE(k); per-token tables [B or 1, S, R].
  m.def(
      "forward(Tensor key_states, Tensor value_states, Tensor key_cache, Tensor value_cache, "
      "Tensor cache_position, Tensor cos, Tensor sin, int rotary_dim=0, int style=0) -> (Tensor, Tensor, Tensor)");
  // The inference forward: the caches, key_out, query (or query_out) and error_flag written in place.
  m.def(
      "forward_(Tensor key_states, Tensor value_states, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor cache_position, Tensor? cos, Tensor? sin, Tensor? cos_sin_cache, Tensor? position_ids, "
      "Tensor(c!)? query, Tensor(d!)? query_out, Tensor(e!)? key_out, Tensor(f!)? error_flag, int rotary_dim=0, "
      "int style=0) -> ()");
  // The backward out of place: grad k, v, cos, sin (empty unless table_grads), and of the incoming caches.
  m.def(
      "backward(Tensor grad_key_cache, Tensor grad_value_cache, Tensor? key_states, Tensor cos, Tensor sin, "
      "Tensor cache_position, int rotary_dim=0, int style=0, bool table_grads=True) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // The backward in place: the caches' gradients become the incoming caches' (rows cache_position zeroed).
  m.def(
      "backward_(Tensor(a!) grad_key_cache, Tensor(b!) grad_value_cache, Tensor? key_states, Tensor cos, "
      "Tensor sin, Tensor cache_position, int rotary_dim=0, int style=0, bool table_grads=True) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
  // The serving forward (docs/spec.md §6): q (in place, or into query_out: q's dtype, or float8_e4m3fn
  // divided by q_scale) and k (into key_out, or in place with key_in_place) optionally normed and rotated;
  // RoPE(k) and v into the caches' slots (NVFP4: with their block scales key_cache_sf, value_cache_sf).
  // q_scale, enable_pdl (a programmatic dependent launch), mRoPE (mrope_section: positions [3, T]) and the
  // block scales come last (added later): callers by position keep working.
  m.def(
      "rope_append_(Tensor(a!)? query, Tensor(b!) key, Tensor value, Tensor positions, Tensor cos_sin_cache, "
      "Tensor(c!) key_cache, Tensor(d!) value_cache, Tensor slot_mapping, Tensor(e!)? query_out=None, "
      "Tensor(f!)? key_out=None, bool key_in_place=False, Tensor? query_norm_weight=None, "
      "Tensor? key_norm_weight=None, float norm_eps=1e-06, bool norm_weight_plus_one=False, "
      "str kv_cache_dtype=\"auto\", Tensor? k_scale=None, Tensor? v_scale=None, Tensor(g!)? error_flag=None, "
      "int rotary_dim=0, int style=0, Tensor? q_scale=None, bool enable_pdl=False, int[] mrope_section=[], "
      "bool mrope_interleaved=False, Tensor(h!)? key_cache_sf=None, Tensor(i!)? value_cache_sf=None) -> ()");
  // The MLA latent-cache append (docs/spec.md §6.6): q_pe rotated in place or into query_out (q's dtype, or
  // float8_e4m3fn divided by q_scale; query_nope copied into its first N dims when given); [kv_c | RoPE(k_pe)]
  // into the slots of latent_cache [pages, P, L + R], or of latent_cache [pages, P, L] and rope_cache
  // [pages, P, R]; style 1 (interleaved) by default, as DeepSeek's checkpoints.
  m.def(
      "mla_append_(Tensor(a!)? query_pe, Tensor kv_c, Tensor k_pe, Tensor positions, Tensor cos_sin_cache, "
      "Tensor(b!) latent_cache, Tensor slot_mapping, Tensor(c!)? rope_cache=None, Tensor? query_nope=None, "
      "Tensor(d!)? query_out=None, str kv_cache_dtype=\"auto\", Tensor? kv_scale=None, Tensor? q_scale=None, "
      "Tensor(e!)? error_flag=None, int style=1, bool enable_pdl=False) -> ()");
}

TORCH_LIBRARY_IMPL(kvrope, ADInplaceOrView, m) {
  m.impl("rope_append_", &append_inplace_versions);
  m.impl("mla_append_", &mla_append_inplace_versions);
  m.impl("forward_", &forward_inplace_versions);
  m.impl("backward_", &backward_inplace_versions);
}

TORCH_LIBRARY_IMPL(kvrope, CUDA, m) {
  m.impl("forward", &forward_cuda_functional);
  m.impl("forward_", &forward_inplace_cuda);
  m.impl("backward", &backward_cuda_functional);
  m.impl("backward_", &backward_cuda_inplace);
  m.impl("rope_append_", &append_inplace_cuda);
  m.impl("mla_append_", &mla_append_inplace_cuda);
}

}  // namespace kvrope_torch
