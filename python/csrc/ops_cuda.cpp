// The CUDA entry points of kvrope_torch: tensors to kvrope's parameter structs, then kvrope's launchers
// (launch.h, compiled in launch_*.cu without torch's headers) on the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "launch.h"
#include "ops.h"

namespace kvrope_torch {

template <DType kDType>
using Elem = std::conditional_t<kDType == DType::kBf16, __nv_bfloat16,
                                std::conditional_t<kDType == DType::kFp16, __half, float>>;

template <typename T>
kvrope::HeadRows<T> head_rows(const at::Tensor& x) {  // [B, H, L, D], last dim contiguous (checks.cpp)
  return {reinterpret_cast<T*>(x.data_ptr()), x.stride(0), x.stride(1), x.stride(2)};
}
template <typename T>
kvrope::HeadRows<T> head_rows(const c10::optional<at::Tensor>& x) {
  return x.has_value() && x->defined() ? head_rows<T>(*x) : kvrope::HeadRows<T>{};
}
// [B or 1, S, R]: a table of batch 1 is shared by the batch (batch stride 0).
template <typename T>
kvrope::TokenRows<T> token_rows(const at::Tensor& x) {
  return {reinterpret_cast<T*>(x.data_ptr()), x.size(0) == 1 ? 0 : x.stride(0), x.stride(1)};
}
template <typename T>
kvrope::TokenRows<T> token_rows(const c10::optional<at::Tensor>& x) {
  return x.has_value() && x->defined() ? token_rows<T>(*x) : kvrope::TokenRows<T>{};
}
int* flag_ptr(const c10::optional<at::Tensor>& flag) {
  return flag.has_value() && flag->defined() ? flag->data_ptr<int>() : nullptr;
}

// A field of kvrope's parameters as the op's argument ("query_out_fp8.head_stride": "query_out.head_stride"),
// where the library names it otherwise; a field no argument gives (a size, an output the op allocates)
// as it is.
std::string argument_of(const char* field) {
  static const std::pair<const char*, const char*> renamed[] = {{"query_out_fp8", "query_out"},
                                                                {"cos_sin_cache_f32", "cos_sin_cache"},
                                                                {"key_scale", "k_scale"},
                                                                {"value_scale", "v_scale"},
                                                                {"query_scale", "q_scale"},
                                                                {"position_stream_stride", "positions"},
                                                                {"key_block_scales", "key_cache_sf"},
                                                                {"value_block_scales", "value_cache_sf"},
                                                                {"write_query_nope", "query_nope"},
                                                                {"kv_c_stride", "kv_c"},
                                                                {"k_pe_stride", "k_pe"}};
  const std::string f(field);
  const size_t dot = f.find('.');
  for (const auto& [library, argument] : renamed)
    if (f.compare(0, dot, library) == 0) return argument + (dot == std::string::npos ? std::string() : f.substr(dot));
  return f;
}

// A refused call names the op's arguments (checks.cpp checks the rest before, with the same names).
void check(const kvrope::Status& s, const char* op) {
  if (s.ok()) return;
  TORCH_CHECK(false, op, ": ", kvrope::to_string(s.code), s.field ? " (" + argument_of(s.field) + ")" : "",
              s.other ? " and " + argument_of(s.other) : "",
              s.cuda_error != cudaSuccess ? std::string(": ") + cudaGetErrorString(s.cuda_error) : "");
}

// A zeroed workspace of the out-of-place backward per (device, stream): each call leaves it zero, and
// calls on one stream never overlap (BackwardParams::workspace). Never freed: 8 bytes a stream, and no
// free after the CUDA context is gone at exit.
void* backward_workspace(const at::Tensor& like, cudaStream_t stream) {
  static std::mutex mutex;
  static auto* workspaces = new std::map<std::pair<int, cudaStream_t>, at::Tensor>();
  const std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& w = (*workspaces)[{like.get_device(), stream}];
  if (!w.defined()) w = at::zeros({kvrope::kBackwardWorkspaceBytes}, like.options().dtype(at::kByte));  // (on `stream`)
  return w.data_ptr();
}

// The sizes and the rotation both ops' parameters share: B, H, S, D from `rows` [B, H, S, D].
template <typename Params>
void set_shape(Params& p, const at::Tensor& rows, int64_t cache_len, int64_t rotary_dim, int64_t style) {
  p.batch = rows.size(0);
  p.heads = rows.size(1);
  p.seq_len = rows.size(2);
  p.head_dim = rows.size(3);
  p.cache_len = cache_len;
  p.rotary_dim = rotary_dim;
  p.style = style == 0 ? kvrope::RotaryStyle::kRotateHalf : kvrope::RotaryStyle::kInterleaved;
}

template <typename T, typename Pos>
void forward_typed(const ForwardTensors& t, cudaStream_t stream) {
  kvrope::ForwardParams<T, Pos> p;
  set_shape(p, t.key_states, t.key_cache.size(2), t.rotary_dim, t.style);
  p.key_states = head_rows<const T>(t.key_states);
  p.value_states = head_rows<const T>(t.value_states);
  p.key_cache = head_rows<T>(t.key_cache);
  p.value_cache = head_rows<T>(t.value_cache);
  p.cache_position = t.cache_position.data_ptr<Pos>();
  p.key_out = head_rows<T>(t.key_out);
  if (t.query.has_value() && t.query->defined()) {
    p.query_heads = t.query->size(1);
    p.query = head_rows<T>(t.query);
    p.query_out = head_rows<T>(t.query_out);
  }
  if (t.cos_sin_cache.has_value() && t.cos_sin_cache->defined()) {
    const at::Tensor& c = *t.cos_sin_cache;
    if (c.scalar_type() == at::kFloat && !std::is_same_v<T, float>)
      p.cos_sin_cache_f32 = c.data_ptr<float>();
    else
      p.cos_sin_cache = reinterpret_cast<const T*>(c.data_ptr());
    p.max_position = c.size(0);
    const at::Tensor& ids = *t.position_ids;
    p.position_ids = ids.data_ptr<Pos>();
    p.position_ids_batch_stride = ids.dim() == 2 ? ids.stride(0) : 0;
  } else {
    p.cos = token_rows<const T>(t.cos);
    p.sin = token_rows<const T>(t.sin);
  }
  p.error_flag = flag_ptr(t.error_flag);
  check(launch_forward(p, stream), "kvrope.forward");
}

template <typename T, typename Pos>
void backward_typed(const BackwardTensors& t, cudaStream_t stream) {
  auto fill = [&](kvrope::BackwardCommon<T, Pos>& p) {
    set_shape(p, t.grad_key_states, t.grad_key_cache.size(2), t.rotary_dim, t.style);
    p.key_states = head_rows<const T>(t.key_states);
    p.cos = token_rows<const T>(t.cos);
    p.sin = token_rows<const T>(t.sin);
    p.cache_position = t.cache_position.data_ptr<Pos>();
    p.grad_key_states = head_rows<T>(t.grad_key_states);
    p.grad_value_states = head_rows<T>(t.grad_value_states);
    p.grad_cos = token_rows<T>(t.grad_cos);
    p.grad_sin = token_rows<T>(t.grad_sin);
    p.error_flag = flag_ptr(t.error_flag);
  };
  if (t.grad_key_cache_input.has_value() && t.grad_key_cache_input->defined()) {
    kvrope::BackwardParams<T, Pos> p;
    fill(p);
    p.grad_key_cache = head_rows<const T>(t.grad_key_cache);
    p.grad_value_cache = head_rows<const T>(t.grad_value_cache);
    p.grad_key_cache_input = head_rows<T>(t.grad_key_cache_input);
    p.grad_value_cache_input = head_rows<T>(t.grad_value_cache_input);
    p.workspace = backward_workspace(t.grad_key_cache, stream);
    check(launch_backward(p, stream), "kvrope.backward");
  } else {
    kvrope::BackwardInPlaceParams<T, Pos> p;
    fill(p);
    p.grad_key_cache = head_rows<T>(t.grad_key_cache);
    p.grad_value_cache = head_rows<T>(t.grad_value_cache);
    check(launch_backward(p, stream), "kvrope.backward_");
  }
}

template <typename T>
kvrope::TokenHeads<T> token_heads(const at::Tensor& x) {  // [T, H, D], last dim contiguous (checks.cpp)
  return {reinterpret_cast<T*>(x.data_ptr()), x.stride(0), x.stride(1)};
}
template <typename T>
kvrope::TokenHeads<T> token_heads(const c10::optional<at::Tensor>& x) {
  return x.has_value() && x->defined() ? token_heads<T>(*x) : kvrope::TokenHeads<T>{};
}
// [pages, P, H, D] by its strides, or flat [slots, H, D] (pages of one slot).
template <typename C>
kvrope::PagedCache<C> paged_cache(const at::Tensor& c) {
  C* data = reinterpret_cast<C*>(c.data_ptr());
  if (c.dim() == 3) return {data, c.stride(0), c.stride(0), c.stride(1)};
  return {data, c.stride(0), c.stride(1), c.stride(2)};
}
template <typename T>
const T* data_or_null(const c10::optional<at::Tensor>& x) {
  return x.has_value() && x->defined() ? reinterpret_cast<const T*>(x->data_ptr()) : nullptr;
}

template <typename T, typename C, typename Pos>
void append_typed(const AppendTensors& t, cudaStream_t stream) {
  kvrope::AppendParams<T, C, Pos> p;
  p.tokens = t.key.size(0);
  p.heads = t.key.size(1);
  p.head_dim = t.key.size(2);
  p.rotary_dim = t.rotary_dim;
  p.style = t.style == 0 ? kvrope::RotaryStyle::kRotateHalf : kvrope::RotaryStyle::kInterleaved;
  if (t.query.has_value() && t.query->defined()) {
    p.query_heads = t.query->size(1);
    p.query = token_heads<T>(t.query);
    // An fp8 query_out (float8_e4m3fn, checks.cpp) is kvrope's query_out_fp8, quantized with q_scale.
    if (t.query_out.has_value() && t.query_out->scalar_type() == at::kFloat8_e4m3fn) {
      p.query_out_fp8 = token_heads<__nv_fp8_e4m3>(t.query_out);
      p.query_scale = data_or_null<float>(t.q_scale);
    } else {
      p.query_out = token_heads<T>(t.query_out);
    }
  }
  p.key = token_heads<T>(t.key);
  p.key_out = token_heads<T>(t.key_out);
  p.key_in_place = t.key_in_place;
  p.value = token_heads<const T>(t.value);
  p.positions = t.positions.data_ptr<Pos>();
  if (!t.mrope_section.empty()) {  // positions [3, T] (checks.cpp: three sections, summing to R/2)
    for (int j = 0; j < 3; ++j) p.mrope_section[j] = t.mrope_section[j];
    p.mrope_interleaved = t.mrope_interleaved;
    p.position_stream_stride = t.positions.stride(0);
  }
  const at::Tensor& table = t.cos_sin_cache;
  if (table.scalar_type() == at::kFloat && !std::is_same_v<T, float>)
    p.cos_sin_cache_f32 = table.data_ptr<float>();
  else
    p.cos_sin_cache = reinterpret_cast<const T*>(table.data_ptr());
  p.max_position = table.size(0);
  p.query_norm_weight = data_or_null<T>(t.query_norm_weight);
  p.key_norm_weight = data_or_null<T>(t.key_norm_weight);
  p.norm_eps = static_cast<float>(t.norm_eps);
  p.norm_weight_plus_one = t.norm_weight_plus_one;
  p.key_cache = paged_cache<C>(t.key_cache);
  p.value_cache = paged_cache<C>(t.value_cache);
  p.page_size = t.key_cache.dim() == 3 ? 1 : t.key_cache.size(1);
  p.num_pages = t.key_cache.size(0);
  p.slot_mapping = t.slot_mapping.data_ptr<int64_t>();
  p.key_scale = data_or_null<float>(t.k_scale);
  p.value_scale = data_or_null<float>(t.v_scale);
  if constexpr (kvrope::kIsNvfp4<C>) {  // (checks.cpp: given, the caches' shape)
    p.key_block_scales = paged_cache<__nv_fp8_e4m3>(*t.key_cache_sf);
    p.value_block_scales = paged_cache<__nv_fp8_e4m3>(*t.value_cache_sf);
  }
  p.enable_pdl = t.enable_pdl;
  const int64_t h = p.heads;
  auto per_head = [h](const c10::optional<at::Tensor>& s) {
    return s.has_value() && s->dim() == 1 && h > 1 && s->size(0) == h;
  };
  p.scale_per_head = per_head(t.k_scale) || per_head(t.v_scale);
  p.error_flag = flag_ptr(t.error_flag);
  check(launch_append(p, stream), "kvrope.rope_append_");
}

template <typename T, typename C>
void append_positions(const AppendTensors& t, cudaStream_t stream) {
  if (t.positions.scalar_type() == at::kLong)
    append_typed<T, C, int64_t>(t, stream);
  else
    append_typed<T, C, int32_t>(t, stream);
}

template <DType kDType>
void append_cuda(const AppendTensors& t, CacheType cache) {
  using T = Elem<kDType>;
  const c10::cuda::CUDAGuard guard(t.key.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  switch (cache) {
    case CacheType::kSame: return append_positions<T, T>(t, stream);
    case CacheType::kFp8E4m3: return append_positions<T, __nv_fp8_e4m3>(t, stream);
    case CacheType::kFp8E5m2: return append_positions<T, __nv_fp8_e5m2>(t, stream);
    case CacheType::kNvfp4: return append_positions<T, kvrope::nvfp4_e2m1x2>(t, stream);
  }
}

template <typename T, typename C, typename Pos>
void mla_typed(const MlaTensors& t, cudaStream_t stream) {
  kvrope::MlaAppendParams<T, C, Pos> p;
  const int64_t r = t.k_pe.size(1), l = t.kv_c.size(1);
  p.tokens = t.kv_c.size(0);
  p.rotary_dim = r;
  p.latent_dim = l;
  p.style = t.style == 0 ? kvrope::RotaryStyle::kRotateHalf : kvrope::RotaryStyle::kInterleaved;
  if (t.query_pe.has_value() && t.query_pe->defined()) {
    p.query_heads = t.query_pe->size(1);
    p.query_pe = token_heads<T>(t.query_pe);
    if (t.query_out.has_value() && t.query_out->defined()) {  // rows [N + R] (checks.cpp)
      p.nope_dim = t.query_out->size(2) - r;
      // An fp8 query_out (float8_e4m3fn) is kvrope's query_out_fp8, quantized with q_scale.
      if (t.query_out->scalar_type() == at::kFloat8_e4m3fn) {
        p.query_out_fp8 = token_heads<__nv_fp8_e4m3>(t.query_out);
        p.query_scale = data_or_null<float>(t.q_scale);
      } else {
        p.query_out = token_heads<T>(t.query_out);
      }
      if (t.query_nope.has_value() && t.query_nope->defined()) {
        p.query_nope = token_heads<const T>(t.query_nope);
        p.write_query_nope = true;
      }
    }
  }
  p.kv_c = reinterpret_cast<const T*>(t.kv_c.data_ptr());
  p.kv_c_stride = t.kv_c.stride(0);
  p.k_pe = reinterpret_cast<const T*>(t.k_pe.data_ptr());
  p.k_pe_stride = t.k_pe.stride(0);
  p.positions = t.positions.data_ptr<Pos>();
  const at::Tensor& table = t.cos_sin_cache;
  if (table.scalar_type() == at::kFloat && !std::is_same_v<T, float>)
    p.cos_sin_cache_f32 = table.data_ptr<float>();
  else
    p.cos_sin_cache = reinterpret_cast<const T*>(table.data_ptr());
  p.max_position = table.size(0);
  // [pages, P, L + R]: the rope part at +L of each row; else latent [pages, P, L] and rope [pages, P, R]
  const at::Tensor& lc = t.latent_cache;
  C* latent = reinterpret_cast<C*>(lc.data_ptr());
  p.latent_cache = {latent, lc.stride(0), lc.stride(1)};
  if (t.rope_cache.has_value() && t.rope_cache->defined()) {
    const at::Tensor& rc = *t.rope_cache;
    p.rope_cache = {reinterpret_cast<C*>(rc.data_ptr()), rc.stride(0), rc.stride(1)};
  } else {
    p.rope_cache = {latent + l, lc.stride(0), lc.stride(1)};
  }
  p.page_size = lc.size(1);
  p.num_pages = lc.size(0);
  p.slot_mapping = t.slot_mapping.data_ptr<int64_t>();
  p.kv_scale = data_or_null<float>(t.kv_scale);
  p.error_flag = flag_ptr(t.error_flag);
  p.enable_pdl = t.enable_pdl;
  check(launch_mla_append(p, stream), "kvrope.mla_append_");
}

template <DType kDType>
void mla_append_cuda(const MlaTensors& t, CacheType cache) {
  using T = Elem<kDType>;
  const c10::cuda::CUDAGuard guard(t.kv_c.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool int64_positions = t.positions.scalar_type() == at::kLong;
  switch (cache) {
    case CacheType::kFp8E4m3:
      return int64_positions ? mla_typed<T, __nv_fp8_e4m3, int64_t>(t, stream)
                             : mla_typed<T, __nv_fp8_e4m3, int32_t>(t, stream);
    case CacheType::kFp8E5m2:
      return int64_positions ? mla_typed<T, __nv_fp8_e5m2, int64_t>(t, stream)
                             : mla_typed<T, __nv_fp8_e5m2, int32_t>(t, stream);
    default:  // (check_mla_append: T, e4m3 or e5m2)
      return int64_positions ? mla_typed<T, T, int64_t>(t, stream) : mla_typed<T, T, int32_t>(t, stream);
  }
}

template <DType kDType>
void forward_cuda(const ForwardTensors& t) {
  const c10::cuda::CUDAGuard guard(t.key_states.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (t.cache_position.scalar_type() == at::kLong)
    forward_typed<Elem<kDType>, int64_t>(t, stream);
  else
    forward_typed<Elem<kDType>, int32_t>(t, stream);
}

template <DType kDType>
void backward_cuda(const BackwardTensors& t) {
  const c10::cuda::CUDAGuard guard(t.grad_key_cache.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (t.cache_position.scalar_type() == at::kLong)
    backward_typed<Elem<kDType>, int64_t>(t, stream);
  else
    backward_typed<Elem<kDType>, int32_t>(t, stream);
}

template void forward_cuda<DType::kBf16>(const ForwardTensors&);
template void forward_cuda<DType::kFp16>(const ForwardTensors&);
template void forward_cuda<DType::kFp32>(const ForwardTensors&);
template void backward_cuda<DType::kBf16>(const BackwardTensors&);
template void backward_cuda<DType::kFp16>(const BackwardTensors&);
template void backward_cuda<DType::kFp32>(const BackwardTensors&);
template void append_cuda<DType::kBf16>(const AppendTensors&, CacheType);
template void append_cuda<DType::kFp16>(const AppendTensors&, CacheType);
template void append_cuda<DType::kFp32>(const AppendTensors&, CacheType);
template void mla_append_cuda<DType::kBf16>(const MlaTensors&, CacheType);
template void mla_append_cuda<DType::kFp16>(const MlaTensors&, CacheType);
template void mla_append_cuda<DType::kFp32>(const MlaTensors&, CacheType);

}  // namespace kvrope_torch
