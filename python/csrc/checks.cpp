// The CUDA ops' argument checks, before any launch: an error names the argument and what was expected
// (TypeError for a dtype, ValueError otherwise). In C++, so that a call pays no Python for them; the CPU
// ops check in Python with the same messages (kvrope_torch/_checks.py). kvrope's own validate() checks
// again (strides, alignment) before the launch.
#include <ATen/ATen.h>

#include <array>
#include <string>

#include "ops.h"

namespace kvrope_torch {
namespace {

// "[2, 3, 9, 8]". Messages get numbers as strings (std::to_string), never streamed: on the H200
// machine's build (g++ 13, torch 2.11) an int64 or IntArrayRef streamed into a check's message crashed
// the process when the check failed (docs/benchmarks.md, "PyTorch comparison").
std::string dims(at::IntArrayRef a) {
  std::string out = "[";
  for (size_t i = 0; i < a.size(); ++i) out += (i ? ", " : "") + std::to_string(a[i]);
  return out + "]";
}

// The tensor the others are compared with: its name, dtype and device.
struct Like {
  const char* name;
  const at::Tensor& x;
};

void check_rows(const char* name, const at::Tensor& x, const Like& like, at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(x.device() == like.x.device(), "kvrope: ", name, " is on ", x.device().str(), ", ", like.name,
                    " on ", like.x.device().str());
  TORCH_CHECK_TYPE(x.scalar_type() == like.x.scalar_type(), "kvrope: ", name, " is ", c10::toString(x.scalar_type()),
                   ", ", like.name, " ", c10::toString(like.x.scalar_type()), ": every float tensor has one dtype");
  TORCH_CHECK_VALUE(x.sizes() == shape, "kvrope: ", name, " has shape ", dims(x.sizes()), ", expected ", dims(shape));
  TORCH_CHECK_VALUE(x.numel() == 0 || x.stride(-1) == 1, "kvrope: ", name,
                    "'s last dim must be contiguous (stride 1), not ", std::to_string(x.stride(-1)));
}

// Positions [S], or also [B, S] where batch > 0.
void check_positions(const char* name, const at::Tensor& p, const Like& like, int64_t s, int64_t batch = 0) {
  TORCH_CHECK_VALUE(p.device() == like.x.device(), "kvrope: ", name, " is on ", p.device().str(), ", ", like.name,
                    " on ", like.x.device().str());
  TORCH_CHECK_TYPE(p.scalar_type() == at::kInt || p.scalar_type() == at::kLong, "kvrope: ", name,
                   " must be int32 or int64, not ", c10::toString(p.scalar_type()));
  const bool flat = p.dim() == 1 && p.size(0) == s;
  const bool batched = batch > 0 && p.dim() == 2 && p.size(0) == batch && p.size(1) == s;
  TORCH_CHECK_VALUE(flat || batched, "kvrope: ", name, " has shape ", dims(p.sizes()), ", expected [",
                    std::to_string(s), "]",
                    batch > 0 ? " or [" + std::to_string(batch) + ", " + std::to_string(s) + "]" : std::string());
  TORCH_CHECK_VALUE(p.numel() == 0 || p.stride(-1) == 1, "kvrope: ", name, " must be contiguous");
}

// The call's first tensor of head rows [layout]: 4-d, a supported dtype on its device, D even, the last
// dim contiguous (kvrope's HeadRows has no stride for it).
void check_first_rows(const char* name, const at::Tensor& x, const char* layout) {
  TORCH_CHECK_VALUE(x.dim() == 4, "kvrope: ", name, " must be [", layout, "], got ", dims(x.sizes()));
  const auto t = x.scalar_type();
  const bool ok = t == at::kBFloat16 || t == at::kHalf || t == at::kFloat || (!x.is_cuda() && t == at::kDouble);
  TORCH_CHECK_TYPE(ok, "kvrope: ", c10::DeviceTypeName(x.device().type(), /*lower_case=*/true),
                   " tensors must be bfloat16, float16, float32", x.is_cuda() ? "" : " or float64", ", not ",
                   c10::toString(t));
  TORCH_CHECK_VALUE(x.size(3) % 2 == 0, "kvrope: head_dim must be even, not ", std::to_string(x.size(3)));
  TORCH_CHECK_VALUE(x.numel() == 0 || x.stride(-1) == 1, "kvrope: ", name,
                    "'s last dim must be contiguous (stride 1), not ", std::to_string(x.stride(-1)));
}

// Per-token tables [B or 1, S, R]; returns R.
int64_t check_tables(const c10::optional<at::Tensor>& cos, const c10::optional<at::Tensor>& sin, const Like& like,
                     int64_t b, int64_t s, int64_t d) {
  TORCH_CHECK_VALUE(cos.has_value() && sin.has_value(),
                    "kvrope: give cos and sin (per-token tables), or cos_sin_cache and position_ids");
  const at::Tensor& c = *cos;
  TORCH_CHECK_VALUE(c.dim() == 3 && (c.size(0) == 1 || c.size(0) == b) && c.size(1) == s,
                    "kvrope: cos must be [B, S, R] or [1, S, R] with B=", std::to_string(b), ", S=", std::to_string(s),
                    ", got ", dims(c.sizes()));
  const int64_t r = c.size(2);
  TORCH_CHECK_VALUE(r % 2 == 0 && r > 0 && r <= d,
                    "kvrope: the rotary dim R = cos.shape[-1] must be even and in (0, D=", std::to_string(d), "], not ",
                    std::to_string(r));
  check_rows("cos", c, like, c.sizes());
  check_rows("sin", *sin, like, c.sizes());
  return r;
}

// The op's rotary_dim and style arguments: rotary_dim 0 (the tables' R) or R itself; style 0 (rotate-half)
// or 1 (interleaved). Returns kvrope's rotary_dim: R, or 0 for R = D.
int64_t rotation_of(int64_t given, int64_t style, int64_t r, int64_t d) {
  TORCH_CHECK_VALUE(given == 0 || given == r, "kvrope: rotary_dim ", std::to_string(given),
                    " differs from the tables' R = ", std::to_string(r));
  TORCH_CHECK_VALUE(style == 0 || style == 1, "kvrope: style must be 0 (rotate_half) or 1 (interleaved), not ",
                    std::to_string(style));
  return r == d ? 0 : r;
}

}  // namespace

int64_t check_forward(const ForwardTensors& t) {
  check_first_rows("key_states", t.key_states, "B, H, S, D");
  const Like k{"key_states", t.key_states};
  const int64_t b = t.key_states.size(0), h = t.key_states.size(1), s = t.key_states.size(2), d = t.key_states.size(3);
  TORCH_CHECK_VALUE(t.key_cache.dim() == 4, "kvrope: key_cache must be [B, H, S_max, D], got ",
                    dims(t.key_cache.sizes()));
  const int64_t s_max = t.key_cache.size(2);
  const std::array<int64_t, 4> token_rows{b, h, s, d}, cache_rows{b, h, s_max, d};  // (named: shapes are views)
  check_rows("value_states", t.value_states, k, token_rows);
  check_rows("key_cache", t.key_cache, k, cache_rows);
  check_rows("value_cache", t.value_cache, k, cache_rows);
  check_positions("cache_position", t.cache_position, k, s);
  int64_t r = 0;
  if (t.cos_sin_cache.has_value()) {
    const at::Tensor& c = *t.cos_sin_cache;
    TORCH_CHECK_VALUE(!t.cos.has_value() && !t.sin.has_value(),
                      "kvrope: give either cos and sin or cos_sin_cache, not both");
    TORCH_CHECK_VALUE(c.dim() == 2 && c.size(1) % 2 == 0 && c.size(1) > 0 && c.size(1) <= d,
                      "kvrope: cos_sin_cache must be [max_pos, R] with R even in (0, D=", std::to_string(d), "], got ",
                      dims(c.sizes()));
    TORCH_CHECK_TYPE((c.scalar_type() == t.key_states.scalar_type() || c.scalar_type() == at::kFloat) &&
                         c.device() == t.key_states.device(),
                     "kvrope: cos_sin_cache must be on key_states' device, in its dtype or float32");
    TORCH_CHECK_VALUE(c.is_contiguous(), "kvrope: cos_sin_cache must be contiguous");
    TORCH_CHECK_VALUE(t.position_ids.has_value(), "kvrope: cos_sin_cache needs position_ids");
    check_positions("position_ids", *t.position_ids, k, s, b);
    TORCH_CHECK_TYPE(t.position_ids->scalar_type() == t.cache_position.scalar_type(),
                     "kvrope: position_ids and cache_position must have one dtype");
    r = c.size(1);
  } else {
    r = check_tables(t.cos, t.sin, k, b, s, d);
  }
  if (t.query.has_value()) {
    const at::Tensor& q = *t.query;
    TORCH_CHECK_VALUE(q.dim() == 4 && q.size(0) == b && q.size(2) == s && q.size(3) == d,
                      "kvrope: query must be [B, Hq, S, D] with B=", std::to_string(b), ", S=", std::to_string(s),
                      ", D=", std::to_string(d), ", got ", dims(q.sizes()));
    check_rows("query", q, k, q.sizes());
    if (t.query_out.has_value()) check_rows("query_out", *t.query_out, k, q.sizes());
  } else {
    TORCH_CHECK_VALUE(!t.query_out.has_value(), "kvrope: query_out needs query");
  }
  if (t.key_out.has_value()) check_rows("key_out", *t.key_out, k, t.key_states.sizes());
  if (t.error_flag.has_value()) {
    const at::Tensor& f = *t.error_flag;
    TORCH_CHECK_VALUE(f.scalar_type() == at::kInt && f.numel() == 1 && f.device() == t.key_states.device(),
                      "kvrope: error_flag must be an int32 tensor of one element on key_states' device");
  }
  return rotation_of(t.rotary_dim, t.style, r, d);
}

int64_t check_backward(const at::Tensor& grad_key_cache, const at::Tensor& grad_value_cache,
                       const c10::optional<at::Tensor>& key_states, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& cache_position, int64_t rotary_dim, int64_t style, bool table_grads) {
  check_first_rows("grad_key_cache", grad_key_cache, "B, H, S_max, D");
  const Like g{"grad_key_cache", grad_key_cache};
  const int64_t b = grad_key_cache.size(0), h = grad_key_cache.size(1), d = grad_key_cache.size(3);
  check_rows("grad_value_cache", grad_value_cache, g, grad_key_cache.sizes());
  TORCH_CHECK_VALUE(cache_position.dim() == 1, "kvrope: cache_position must be [S], got ",
                    dims(cache_position.sizes()));
  const int64_t s = cache_position.size(0);
  check_positions("cache_position", cache_position, g, s);
  const int64_t r = check_tables(cos, sin, g, b, s, d);
  if (table_grads) {
    TORCH_CHECK_VALUE(key_states.has_value(), "kvrope: table gradients need key_states");
    const std::array<int64_t, 4> token_rows{b, h, s, d};
    check_rows("key_states", *key_states, g, token_rows);
  }
  return rotation_of(rotary_dim, style, r, d);
}

}  // namespace kvrope_torch
