// The kvrope ops' schemas (namespace kvrope) and their CUDA implementations, which check their
// arguments (checks.cpp) before any launch; kvrope's validate() checks them again. The CPU
// implementations, the fake (meta) ones and autograd are registered in Python (kvrope_torch/_ops.py).
#include <ATen/cuda/EmptyTensor.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <array>

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
}

TORCH_LIBRARY_IMPL(kvrope, ADInplaceOrView, m) {
  m.impl("forward_", &forward_inplace_versions);
  m.impl("backward_", &backward_inplace_versions);
}

TORCH_LIBRARY_IMPL(kvrope, CUDA, m) {
  m.impl("forward", &forward_cuda_functional);
  m.impl("forward_", &forward_inplace_cuda);
  m.impl("backward", &backward_cuda_functional);
  m.impl("backward_", &backward_cuda_inplace);
}

}  // namespace kvrope_torch
