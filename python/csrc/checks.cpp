// The ops' argument checks, the one copy: an error names the argument and what was expected (TypeError
// for a dtype, ValueError otherwise). The CUDA ops call them before any launch (ops.cpp: a call pays no
// Python for them); the CPU and fake ops through kvrope_torch._C.check_* (python.cpp, from _ops.py).
// kvrope's own validate() then checks what only the parameter structs show (row strides, overlapping
// outputs, the kernels' size limits) before a launch.
#include <ATen/ATen.h>

#include <array>
#include <cfloat>
#include <string>
#include <vector>

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

// "torch.float16": a dtype as Python prints it (c10::toString's "Half" is C++'s name).
std::string dtype_name(at::ScalarType t) { return "torch." + c10::getDtypeNames(t).first; }

// The tensor the others are compared with: its name, dtype and device.
struct Like {
  const char* name;
  const at::Tensor& x;
};

void check_last_dim(const char* name, const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.numel() == 0 || x.stride(-1) == 1, "kvrope: ", name,
                    "'s last dim must be contiguous (stride 1), not ", std::to_string(x.stride(-1)));
}

void check_rows(const char* name, const at::Tensor& x, const Like& like, at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(x.device() == like.x.device(), "kvrope: ", name, " is on ", x.device().str(), ", ", like.name,
                    " on ", like.x.device().str());
  TORCH_CHECK_TYPE(x.scalar_type() == like.x.scalar_type(), "kvrope: ", name, " is ", dtype_name(x.scalar_type()), ", ",
                   like.name, " ", dtype_name(like.x.scalar_type()), ": every float tensor has one dtype");
  TORCH_CHECK_VALUE(x.sizes() == shape, "kvrope: ", name, " has shape ", dims(x.sizes()), ", expected ", dims(shape));
  check_last_dim(name, x);
}

// Positions on `like`'s device, int32 or int64.
void check_index_type(const char* name, const at::Tensor& p, const Like& like) {
  TORCH_CHECK_VALUE(p.device() == like.x.device(), "kvrope: ", name, " is on ", p.device().str(), ", ", like.name,
                    " on ", like.x.device().str());
  TORCH_CHECK_TYPE(p.scalar_type() == at::kInt || p.scalar_type() == at::kLong, "kvrope: ", name,
                   " must be int32 or int64, not ", dtype_name(p.scalar_type()));
}

// Positions [S], or also [B, S] where batch > 0.
void check_positions(const char* name, const at::Tensor& p, const Like& like, int64_t s, int64_t batch = 0) {
  check_index_type(name, p, like);
  const bool flat = p.dim() == 1 && p.size(0) == s;
  const bool batched = batch > 0 && p.dim() == 2 && p.size(0) == batch && p.size(1) == s;
  TORCH_CHECK_VALUE(flat || batched, "kvrope: ", name, " has shape ", dims(p.sizes()), ", expected [",
                    std::to_string(s), "]",
                    batch > 0 ? " or [" + std::to_string(batch) + ", " + std::to_string(s) + "]" : std::string());
  TORCH_CHECK_VALUE(p.numel() == 0 || p.stride(-1) == 1, "kvrope: ", name, " must be contiguous");
}

// The call's first float tensor, [layout] (`rank` dims), in a dtype the op computes in (bf16, fp16, fp32; on the
// CPU also fp64): the others are compared with it.
void check_first_dtype(const char* name, const at::Tensor& x, const char* layout, int64_t rank) {
  TORCH_CHECK_VALUE(x.dim() == rank, "kvrope: ", name, " must be [", layout, "], got ", dims(x.sizes()));
  const auto t = x.scalar_type();
  const bool ok = t == at::kBFloat16 || t == at::kHalf || t == at::kFloat || (!x.is_cuda() && t == at::kDouble);
  TORCH_CHECK_TYPE(ok, "kvrope: ", name, " is ", dtype_name(t), ": ",
                   c10::DeviceTypeName(x.device().type(), /*lower_case=*/true),
                   " tensors must be bfloat16, float16, float32", x.is_cuda() ? "" : " or float64");
}

// The call's first tensor of head rows [layout] (`rank` dims): a supported dtype on its device, D even,
// the last dim contiguous (kvrope's row structs have no stride for it).
void check_first_rows(const char* name, const at::Tensor& x, const char* layout, int64_t rank = 4) {
  check_first_dtype(name, x, layout, rank);
  TORCH_CHECK_VALUE(x.size(-1) % 2 == 0, "kvrope: ", name, "'s head_dim must be even, not ",
                    std::to_string(x.size(-1)));
  check_last_dim(name, x);
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

// A table cache [max_pos, R] on `like`'s device, in its dtype or fp32, contiguous; returns R.
int64_t check_table_cache(const at::Tensor& c, const Like& like, int64_t d) {
  TORCH_CHECK_VALUE(c.dim() == 2 && c.size(1) % 2 == 0 && c.size(1) > 0 && c.size(1) <= d,
                    "kvrope: cos_sin_cache must be [max_pos, R] with R even in (0, D=", std::to_string(d), "], got ",
                    dims(c.sizes()));
  TORCH_CHECK_TYPE(
      (c.scalar_type() == like.x.scalar_type() || c.scalar_type() == at::kFloat) && c.device() == like.x.device(),
      "kvrope: cos_sin_cache must be on ", like.name, "'s device, in its dtype or float32");
  TORCH_CHECK_VALUE(c.is_contiguous(), "kvrope: cos_sin_cache must be contiguous");
  return c.size(1);
}

void check_on_device(const char* name, const at::Tensor& x, const Like& like) {
  TORCH_CHECK_VALUE(x.device() == like.x.device(), "kvrope: ", name, " is on ", x.device().str(), ", ", like.name,
                    " on ", like.x.device().str());
}

// The caches' element type from the dtype of `cache` (named `name`; `like` the tensor whose dtype is q's) and
// kv_cache_dtype ("auto": the tensor's dtype says; uint8, vLLM's fp8 storage and FlashInfer's NVFP4 codes, needs
// the format named). `nvfp4`: whether the op has NVFP4 caches.
CacheType cache_type_of(const char* name, const at::Tensor& cache, const Like& like, const std::string& kind,
                        bool nvfp4) {
  const std::string formats = nvfp4 ? "'fp8', 'fp8_e4m3', 'fp8_e5m2' or 'nvfp4'" : "'fp8', 'fp8_e4m3' or 'fp8_e5m2'";
  TORCH_CHECK_VALUE(
      kind == "auto" || kind == "fp8" || kind == "fp8_e4m3" || kind == "fp8_e5m2" || (nvfp4 && kind == "nvfp4"),
      "kvrope: kv_cache_dtype must be 'auto', ", formats, ", not '", kind, "'");
  const bool e4m3 = kind == "fp8" || kind == "fp8_e4m3", e5m2 = kind == "fp8_e5m2";
  const auto c = cache.scalar_type(), t = like.x.scalar_type();
  if (kind == "nvfp4") {
    TORCH_CHECK_TYPE(c == at::kByte, "kvrope: kv_cache_dtype 'nvfp4' takes uint8 caches: ", name, " is ",
                     dtype_name(c));
    return CacheType::kNvfp4;
  }
  if (c == at::kByte) {
    TORCH_CHECK_VALUE(e4m3 || e5m2, "kvrope: a uint8 cache needs kv_cache_dtype ", formats, ", not 'auto'");
    return e4m3 ? CacheType::kFp8E4m3 : CacheType::kFp8E5m2;
  }
  const bool known = c == t || c == at::kFloat8_e4m3fn || c == at::kFloat8_e5m2;
  TORCH_CHECK_TYPE(known, "kvrope: ", name, " must be ", like.name, "'s dtype (", dtype_name(t),
                   "), float8_e4m3fn, float8_e5m2 or uint8, not ", dtype_name(c));
  const CacheType type = c == t                    ? CacheType::kSame
                         : c == at::kFloat8_e4m3fn ? CacheType::kFp8E4m3
                                                   : CacheType::kFp8E5m2;
  const bool agrees = kind == "auto" || (type == CacheType::kFp8E4m3 && e4m3) || (type == CacheType::kFp8E5m2 && e5m2);
  TORCH_CHECK_TYPE(agrees, "kvrope: kv_cache_dtype '", kind, "' does not match ", name, "'s dtype ", dtype_name(c));
  return type;
}

// A per-tensor scale (one element) or, where h > 0, per-head scales [H] of an fp8 or NVFP4 cache, float32; true
// when per head.
bool check_scale(const char* name, const at::Tensor& s, const Like& like, int64_t h, CacheType cache) {
  TORCH_CHECK_VALUE(cache != CacheType::kSame, "kvrope: ", name,
                    h > 0 ? " needs an fp8 or NVFP4 cache" : " needs an fp8 cache");
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "kvrope: ", name, " must be float32, not ",
                   dtype_name(s.scalar_type()));
  check_on_device(name, s, like);
  const bool one = s.dim() <= 1 && s.numel() == 1, per_head = h > 0 && s.dim() == 1 && s.size(0) == h;
  TORCH_CHECK_VALUE(one || per_head, "kvrope: ", name,
                    h > 0 ? " must have one element or shape [H] (H=" + std::to_string(h) + "), got "
                          : std::string(" must have one element, got "),
                    dims(s.sizes()));
  TORCH_CHECK_VALUE(s.is_contiguous(), "kvrope: ", name, " must be contiguous");
  return !one;
}

// The append's query_out: q's dtype, or float8_e4m3fn (what fp8 attention reads: kvrope's query_out_fp8);
// q's shape, on its device, the last dim contiguous. An fp8 of another format is refused by name (the
// kernel writes e4m3 only).
void check_query_out(const at::Tensor& out, const at::Tensor& q, const Like& like) {
  const auto t = out.scalar_type();
  if (t != at::kFloat8_e4m3fn) {
    TORCH_CHECK_TYPE(!c10::isFloat8Type(t), "kvrope: query_out is ", dtype_name(t),
                     ": an fp8 query_out must be float8_e4m3fn");
    return check_rows("query_out", out, like, q.sizes());
  }
  check_on_device("query_out", out, like);
  TORCH_CHECK_VALUE(out.sizes() == q.sizes(), "kvrope: query_out has shape ", dims(out.sizes()), ", expected ",
                    dims(q.sizes()));
  check_last_dim("query_out", out);
}

// query_out's per-tensor scale (stored = fp8_satfinite(x / q_scale)): an fp8 query_out's only, float32,
// one element on the device (the kernel reads it there: nothing synchronizes).
void check_q_scale(const at::Tensor& s, const c10::optional<at::Tensor>& query_out, const Like& like) {
  TORCH_CHECK_VALUE(query_out.has_value() && query_out->scalar_type() == at::kFloat8_e4m3fn,
                    "kvrope: q_scale needs an fp8 query_out (float8_e4m3fn)");
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "kvrope: q_scale must be float32, not ", dtype_name(s.scalar_type()));
  check_on_device("q_scale", s, like);
  TORCH_CHECK_VALUE(s.numel() == 1, "kvrope: q_scale must have one element, got ", dims(s.sizes()));
}

// The append's positions: [T], or with mrope_section [3, T] (three streams, any stride between them).
void check_append_positions(const at::Tensor& p, const Like& like, int64_t n, bool mrope) {
  if (!mrope) {
    TORCH_CHECK_VALUE(p.dim() != 2 || p.size(0) != 3 || p.size(1) != n, "kvrope: positions has shape ", dims(p.sizes()),
                      ": multimodal positions [3, T] need mrope_section");
    return check_positions("positions", p, like, n);
  }
  check_index_type("positions", p, like);
  TORCH_CHECK_VALUE(p.dim() == 2 && p.size(0) == 3 && p.size(1) == n, "kvrope: positions has shape ", dims(p.sizes()),
                    ", expected [3, ", std::to_string(n), "] with mrope_section");
  TORCH_CHECK_VALUE(p.numel() == 0 || p.stride(-1) == 1, "kvrope: positions' last dim must be contiguous (stride 1)");
}

// mrope_section: three non-negative ints summing to R/2, the pairs of the table's R.
void check_mrope_section(const std::vector<int64_t>& s, int64_t r) {
  const bool three = s.size() == 3;
  const bool ok = three && s[0] >= 0 && s[1] >= 0 && s[2] >= 0 && s[0] <= r / 2 && s[1] <= r / 2 && s[2] <= r / 2 &&
                  s[0] + s[1] + s[2] == r / 2;
  TORCH_CHECK_VALUE(ok,
                    "kvrope: mrope_section must be three non-negative ints summing to R/2 = ", std::to_string(r / 2),
                    " (R = cos_sin_cache.shape[-1]), not ", dims(s));
}

// An NVFP4 cache's block scales (FlashInfer's kv_cache_sf): float8_e4m3fn, on key's device, the caches' shape
// with D / 16 in the last dim (`shape`), that dim contiguous.
void check_block_scales(const char* name, const c10::optional<at::Tensor>& sf, const Like& like,
                        const std::vector<int64_t>& shape) {
  TORCH_CHECK_VALUE(sf.has_value(), "kvrope: an NVFP4 cache (kv_cache_dtype 'nvfp4') needs ", name,
                    ", its block scales");
  const at::Tensor& x = *sf;
  check_on_device(name, x, like);
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat8_e4m3fn, "kvrope: ", name, " must be float8_e4m3fn, not ",
                   dtype_name(x.scalar_type()));
  TORCH_CHECK_VALUE(x.sizes() == at::IntArrayRef(shape), "kvrope: ", name, " has shape ", dims(x.sizes()),
                    ", expected ", dims(shape), " (the caches' with D / 16 last)");
  check_last_dim(name, x);
}

// The appends' slot_mapping: [T] int64, contiguous, on `like`'s device.
void check_slot_mapping(const at::Tensor& slots, const Like& like, int64_t n) {
  check_on_device("slot_mapping", slots, like);
  TORCH_CHECK_TYPE(slots.scalar_type() == at::kLong, "kvrope: slot_mapping must be int64, not ",
                   dtype_name(slots.scalar_type()));
  TORCH_CHECK_VALUE(slots.dim() == 1 && slots.size(0) == n, "kvrope: slot_mapping has shape ", dims(slots.sizes()),
                    ", expected [", std::to_string(n), "]");
  TORCH_CHECK_VALUE(slots.is_contiguous(), "kvrope: slot_mapping must be contiguous");
}

void check_error_flag(const c10::optional<at::Tensor>& flag, const Like& like) {
  if (!flag.has_value()) return;
  const at::Tensor& f = *flag;
  TORCH_CHECK_VALUE(f.scalar_type() == at::kInt && f.numel() == 1 && f.device() == like.x.device(),
                    "kvrope: error_flag must be an int32 tensor of one element on ", like.name, "'s device");
}

// The MLA append's query_out [T, Hq, N + R]: q_pe's dtype or float8_e4m3fn, on its device, the last dim
// contiguous. N is query_nope's (given) or any (query_out's first N dims are then left as they are).
void check_mla_query_out(const at::Tensor& out, const at::Tensor& q_pe, const c10::optional<at::Tensor>& q_nope,
                         const Like& like) {
  const auto t = out.scalar_type();
  if (t == at::kFloat8_e4m3fn) {
    check_on_device("query_out", out, like);
  } else {
    TORCH_CHECK_TYPE(!c10::isFloat8Type(t), "kvrope: query_out is ", dtype_name(t),
                     ": an fp8 query_out must be float8_e4m3fn");
    check_rows("query_out", out, like, out.sizes());
  }
  const int64_t n = q_pe.size(0), hq = q_pe.size(1), r = q_pe.size(2);
  if (q_nope.has_value()) {
    const std::array<int64_t, 3> rows{n, hq, q_nope->size(2) + r};
    TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(rows), "kvrope: query_out has shape ", dims(out.sizes()),
                      ", expected [T, Hq, N + R] = ", dims(rows), " (N = query_nope's, R = query_pe's)");
  } else {
    TORCH_CHECK_VALUE(out.dim() == 3 && out.size(0) == n && out.size(1) == hq && out.size(2) >= r,
                      "kvrope: query_out has shape ", dims(out.sizes()),
                      ", expected [T, Hq, N + R] with T=", std::to_string(n), ", Hq=", std::to_string(hq),
                      ", R=", std::to_string(r), " (RoPE(q_pe) in its last R dims)");
  }
  check_last_dim("query_out", out);
}

// The MLA caches [pages, P, width]: on `like`'s device, the last dim contiguous.
void check_mla_cache(const char* name, const at::Tensor& c, const Like& like, const std::array<int64_t, 3>& shape,
                     const char* layout) {
  check_on_device(name, c, like);
  TORCH_CHECK_VALUE(c.sizes() == at::IntArrayRef(shape), "kvrope: ", name, " has shape ", dims(c.sizes()),
                    ", expected ", layout, " = ", dims(shape));
  check_last_dim(name, c);
}

}  // namespace

CacheType check_mla_append(const MlaTensors& t) {
  check_first_dtype("kv_c", t.kv_c, "T, L", 2);
  check_last_dim("kv_c", t.kv_c);
  const Like c{"kv_c", t.kv_c};
  const int64_t n = t.kv_c.size(0), l = t.kv_c.size(1);
  TORCH_CHECK_VALUE(l > 0, "kvrope: kv_c must be [T, L] with L > 0, got ", dims(t.kv_c.sizes()));
  const at::Tensor& k_pe = t.k_pe;
  TORCH_CHECK_VALUE(k_pe.dim() == 2 && k_pe.size(0) == n && k_pe.size(1) > 0 && k_pe.size(1) % 2 == 0,
                    "kvrope: k_pe must be [T, R] with T=", std::to_string(n), " and R even and positive, got ",
                    dims(k_pe.sizes()));
  check_rows("k_pe", k_pe, c, k_pe.sizes());
  const int64_t r = k_pe.size(1);
  if (t.query_pe.has_value()) {
    const at::Tensor& q = *t.query_pe;
    TORCH_CHECK_VALUE(q.dim() == 3 && q.size(0) == n && q.size(2) == r,
                      "kvrope: query_pe must be [T, Hq, R] with T=", std::to_string(n), ", R=", std::to_string(r),
                      " (k_pe's), got ", dims(q.sizes()));
    check_rows("query_pe", q, c, q.sizes());
    if (t.query_nope.has_value()) {
      const at::Tensor& nope = *t.query_nope;
      TORCH_CHECK_VALUE(t.query_out.has_value(),
                        "kvrope: query_nope needs query_out (it is copied into query_out's first N dims)");
      TORCH_CHECK_VALUE(nope.dim() == 3 && nope.size(0) == n && nope.size(1) == q.size(1),
                        "kvrope: query_nope must be [T, Hq, N] with T=", std::to_string(n),
                        ", Hq=", std::to_string(q.size(1)), " (query_pe's), got ", dims(nope.sizes()));
      check_rows("query_nope", nope, c, nope.sizes());
    }
    if (t.query_out.has_value()) check_mla_query_out(*t.query_out, q, t.query_nope, c);
  } else {
    TORCH_CHECK_VALUE(!t.query_nope.has_value(), "kvrope: query_nope needs query_pe");
    TORCH_CHECK_VALUE(!t.query_out.has_value(), "kvrope: query_out needs query_pe");
  }
  if (t.q_scale.has_value()) check_q_scale(*t.q_scale, t.query_out, c);
  check_positions("positions", t.positions, c, n);
  check_slot_mapping(t.slot_mapping, c, n);
  const at::Tensor& table = t.cos_sin_cache;
  TORCH_CHECK_VALUE(table.dim() == 2 && table.size(1) == r,
                    "kvrope: cos_sin_cache must be [max_pos, R] with R=", std::to_string(r), " (k_pe's), got ",
                    dims(table.sizes()));
  TORCH_CHECK_TYPE((table.scalar_type() == t.kv_c.scalar_type() || table.scalar_type() == at::kFloat) &&
                       table.device() == t.kv_c.device(),
                   "kvrope: cos_sin_cache must be on kv_c's device, in its dtype or float32");
  TORCH_CHECK_VALUE(table.is_contiguous(), "kvrope: cos_sin_cache must be contiguous");
  // The caches: latent_cache [pages, P, L + R] alone (vLLM's), or [pages, P, L] beside rope_cache [pages, P, R]
  // (FlashInfer's ckv and kpe); one dtype, strides their own.
  const at::Tensor& lc = t.latent_cache;
  TORCH_CHECK_VALUE(lc.dim() == 3, "kvrope: latent_cache must be [pages, P, L + R], or [pages, P, L] with rope_cache, ",
                    "got ", dims(lc.sizes()));
  check_on_device("latent_cache", lc, c);
  const CacheType cache = cache_type_of("latent_cache", lc, c, t.kv_cache_dtype, /*nvfp4=*/false);
  const int64_t pages = lc.size(0), page_size = lc.size(1);
  if (t.rope_cache.has_value()) {
    const at::Tensor& rc = *t.rope_cache;
    check_mla_cache("latent_cache", lc, c, {pages, page_size, l}, "[pages, P, L] (with rope_cache)");
    check_on_device("rope_cache", rc, c);
    TORCH_CHECK_TYPE(rc.scalar_type() == lc.scalar_type(), "kvrope: rope_cache is ", dtype_name(rc.scalar_type()),
                     ", latent_cache ", dtype_name(lc.scalar_type()), ": the caches have one dtype");
    check_mla_cache("rope_cache", rc, c, {pages, page_size, r}, "[pages, P, R] (latent_cache's pages and P)");
  } else {
    check_mla_cache("latent_cache", lc, c, {pages, page_size, l + r}, "[pages, P, L + R] (without rope_cache)");
  }
  if (t.kv_scale.has_value()) check_scale("kv_scale", *t.kv_scale, c, 0, cache);
  check_error_flag(t.error_flag, c);
  TORCH_CHECK_VALUE(t.style == 0 || t.style == 1, "kvrope: style must be 0 (rotate_half) or 1 (interleaved), not ",
                    std::to_string(t.style));
  return cache;
}

CacheType check_append(AppendTensors& t) {
  check_first_rows("key", t.key, "T, H, D", 3);
  const Like k{"key", t.key};
  const int64_t n = t.key.size(0), h = t.key.size(1), d = t.key.size(2);
  const std::array<int64_t, 3> token_rows{n, h, d};
  check_rows("value", t.value, k, token_rows);
  if (t.query.has_value()) {
    const at::Tensor& q = *t.query;
    TORCH_CHECK_VALUE(q.dim() == 3 && q.size(0) == n && q.size(2) == d,
                      "kvrope: query must be [T, Hq, D] with T=", std::to_string(n), ", D=", std::to_string(d),
                      ", got ", dims(q.sizes()));
    check_rows("query", q, k, q.sizes());
    if (t.query_out.has_value()) check_query_out(*t.query_out, q, k);
  } else {
    TORCH_CHECK_VALUE(!t.query_out.has_value(), "kvrope: query_out needs query");
    TORCH_CHECK_VALUE(!t.query_norm_weight.has_value(), "kvrope: query_norm_weight needs query");
  }
  if (t.q_scale.has_value()) check_q_scale(*t.q_scale, t.query_out, k);
  if (t.key_out.has_value()) {
    TORCH_CHECK_VALUE(!t.key_in_place, "kvrope: key_in_place and key_out exclude each other");
    check_rows("key_out", *t.key_out, k, token_rows);
  }
  const bool mrope = !t.mrope_section.empty();
  check_append_positions(t.positions, k, n, mrope);
  TORCH_CHECK_VALUE(mrope || !t.mrope_interleaved, "kvrope: mrope_interleaved needs mrope_section");
  check_slot_mapping(t.slot_mapping, k, n);
  const int64_t r = check_table_cache(t.cos_sin_cache, k, d);
  if (mrope) check_mrope_section(t.mrope_section, r);
  // The caches: [pages, P, H, D] or [slots, H, D] (NVFP4: D / 2 bytes of codes), one shape and dtype, strides
  // their own.
  const at::Tensor& kc = t.key_cache;
  TORCH_CHECK_VALUE(kc.dim() == 4 || kc.dim() == 3, "kvrope: key_cache must be [pages, P, H, D] or [slots, H, D], got ",
                    dims(kc.sizes()));
  check_on_device("key_cache", kc, k);
  const CacheType cache = cache_type_of("key_cache", kc, k, t.kv_cache_dtype, /*nvfp4=*/true);
  const bool nvfp4 = cache == CacheType::kNvfp4;
  std::vector<int64_t> cache_shape(kc.sizes().begin(), kc.sizes().end());
  cache_shape[kc.dim() - 2] = h;
  cache_shape[kc.dim() - 1] = nvfp4 ? d / 2 : d;
  TORCH_CHECK_VALUE(kc.sizes() == at::IntArrayRef(cache_shape), "kvrope: key_cache has shape ", dims(kc.sizes()),
                    ", expected ", dims(cache_shape), " (an HND cache [pages, H, P, D] as its transpose(1, 2)",
                    nvfp4 ? "; NVFP4: D / 2 bytes a row)" : ")");
  check_on_device("value_cache", t.value_cache, k);
  TORCH_CHECK_TYPE(t.value_cache.scalar_type() == kc.scalar_type(), "kvrope: value_cache is ",
                   dtype_name(t.value_cache.scalar_type()), ", key_cache ", dtype_name(kc.scalar_type()),
                   ": the caches have one dtype");
  TORCH_CHECK_VALUE(t.value_cache.sizes() == kc.sizes(), "kvrope: value_cache has shape ", dims(t.value_cache.sizes()),
                    ", expected ", dims(kc.sizes()));
  check_last_dim("key_cache", kc);
  check_last_dim("value_cache", t.value_cache);
  if (nvfp4) {
    // A block of 16 values is one chunk of neighbouring lanes (kvrope's detail/append/formats.cuh): D and R
    // multiples of 32, D at most 64 chunks of 16 bytes (kvrope's validate also asks 16-byte aligned rows).
    const int64_t most = t.key.scalar_type() == at::kFloat ? 256 : 512;
    TORCH_CHECK_VALUE(d % 32 == 0 && d <= most,
                      "kvrope: an NVFP4 cache needs key's head_dim a multiple of 32, at most ", std::to_string(most),
                      " in ", dtype_name(t.key.scalar_type()), ", not ", std::to_string(d));
    TORCH_CHECK_VALUE(r % 32 == 0, "kvrope: an NVFP4 cache needs the rotary dim R = cos_sin_cache.shape[-1] a ",
                      "multiple of 32, not ", std::to_string(r));
    std::vector<int64_t> sf_shape = cache_shape;
    sf_shape.back() = d / 16;
    check_block_scales("key_cache_sf", t.key_cache_sf, k, sf_shape);
    check_block_scales("value_cache_sf", t.value_cache_sf, k, sf_shape);
  } else {
    TORCH_CHECK_VALUE(!t.key_cache_sf.has_value(),
                      "kvrope: key_cache_sf needs an NVFP4 cache (kv_cache_dtype 'nvfp4')");
    TORCH_CHECK_VALUE(!t.value_cache_sf.has_value(),
                      "kvrope: value_cache_sf needs an NVFP4 cache (kv_cache_dtype 'nvfp4')");
  }
  bool per_head[2] = {false, false};
  if (t.k_scale.has_value()) per_head[0] = check_scale("k_scale", *t.k_scale, k, h, cache);
  if (t.v_scale.has_value()) per_head[1] = check_scale("v_scale", *t.v_scale, k, h, cache);
  TORCH_CHECK_VALUE(!(t.k_scale.has_value() && t.v_scale.has_value()) || per_head[0] == per_head[1],
                    "kvrope: k_scale and v_scale must both be per-tensor or both per-head");
  const std::array<int64_t, 1> weight{d};
  if (t.query_norm_weight.has_value()) check_rows("query_norm_weight", *t.query_norm_weight, k, weight);
  if (t.key_norm_weight.has_value()) check_rows("key_norm_weight", *t.key_norm_weight, k, weight);
  TORCH_CHECK_VALUE(t.norm_eps >= 0.0 && t.norm_eps <= FLT_MAX, "kvrope: norm_eps must be a non-negative number, not ",
                    std::to_string(t.norm_eps));
  check_error_flag(t.error_flag, k);
  t.rotary_dim = rotation_of(t.rotary_dim, t.style, r, d);
  return cache;
}

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
  // S from the tables (cos [B or 1, S, R]), as the forward takes it from key_states: a cache_position of
  // another length is then named as such.
  const int64_t s = cos.dim() == 3 ? cos.size(1) : cache_position.size(0);
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
