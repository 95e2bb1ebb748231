// Host tests of validate(): every invalid input gets its own status and field, and a rejected call
// neither launches nor writes (runs without a GPU: validation happens before any CUDA call).
#include <kvrope/kvrope.cuh>

#include <cstring>
#include <string>
#include <vector>

#include "support/catch.hpp"

using namespace kvrope;

namespace {
using T = float;
constexpr int64_t B = 2, H = 4, S = 8, L = 32, D = 128;

// Host buffers standing in for device memory: validate() never dereferences them. Each has a row of slack, so
// that a view the tests shift by part of a row overlaps its own buffer only, wherever the heap put the others.
struct Buffers {
  std::vector<T> gk = std::vector<T>(B * H * L * D + D), gv = gk, gk_in = gk, gv_in = gk;
  std::vector<T> key = std::vector<T>(B * H * S * D + D), gks = key, gvs = key;
  std::vector<T> cos = std::vector<T>(B * S * D + D), sin = cos, gcos = cos, gsin = cos;
  std::vector<int64_t> pos = std::vector<int64_t>(S);

  template <typename P>
  void common(P& p) {
    p.batch = B, p.heads = H, p.seq_len = S, p.cache_len = L, p.head_dim = D;
    p.key_states = bhsd<const T>(key.data(), H, S, D);
    p.cos = bsd<const T>(cos.data(), S, D);
    p.sin = bsd<const T>(sin.data(), S, D);
    p.cache_position = pos.data();
    p.grad_key_states = bhsd(gks.data(), H, S, D);
    p.grad_value_states = bhsd(gvs.data(), H, S, D);
    p.grad_cos = bsd(gcos.data(), S, D);
    p.grad_sin = bsd(gsin.data(), S, D);
  }
  BackwardParams<T> out_of_place() {
    BackwardParams<T> p;
    common(p);
    p.grad_key_cache = bhsd<const T>(gk.data(), H, L, D);
    p.grad_value_cache = bhsd<const T>(gv.data(), H, L, D);
    p.grad_key_cache_input = bhsd(gk_in.data(), H, L, D);
    p.grad_value_cache_input = bhsd(gv_in.data(), H, L, D);
    return p;
  }
  BackwardInPlaceParams<T> in_place() {
    BackwardInPlaceParams<T> p;
    common(p);
    p.grad_key_cache = bhsd(gk.data(), H, L, D);
    p.grad_value_cache = bhsd(gv.data(), H, L, D);
    return p;
  }
};

template <typename P>
void expect(const P& p, StatusCode code, const char* field) {
  const Status s = validate(p);
  INFO("got " << to_string(s.code) << " / " << (s.field ? s.field : "(none)"));
  CHECK(s.code == code);
  CHECK(std::string(s.field ? s.field : "") == std::string(field ? field : ""));
}
}  // namespace

TEST_CASE("valid parameters pass", "[host][validate]") {
  Buffers buf;
  expect(buf.out_of_place(), StatusCode::kSuccess, nullptr);
  expect(buf.in_place(), StatusCode::kSuccess, nullptr);
  auto p = buf.out_of_place();
  p.grad_cos = {};
  p.grad_sin = {};
  p.key_states = {};  // not read without the table gradients
  expect(p, StatusCode::kSuccess, nullptr);
  p = buf.out_of_place();
  p.cos.batch_stride = 0;  // one table broadcast over the batch
  expect(p, StatusCode::kSuccess, nullptr);
  p = buf.out_of_place();
  p.grad_key_cache = bshd<const T>(buf.gk.data(), H, L, D);
  p.grad_key_cache_input = bshd(buf.gk_in.data(), H, L, D);
  expect(p, StatusCode::kSuccess, nullptr);
}

TEST_CASE("sizes", "[host][validate]") {
  Buffers buf;
  auto p = buf.out_of_place();
  p.batch = -1;
  expect(p, StatusCode::kInvalidSize, "batch");
  p = buf.out_of_place();
  p.heads = -2;
  expect(p, StatusCode::kInvalidSize, "heads");
  p = buf.out_of_place();
  p.seq_len = -1;
  expect(p, StatusCode::kInvalidSize, "seq_len");
  p = buf.out_of_place();
  p.cache_len = -1;
  expect(p, StatusCode::kInvalidSize, "cache_len");
  p = buf.out_of_place();
  p.head_dim = 127;
  expect(p, StatusCode::kInvalidHeadDim, "head_dim");
  p.head_dim = 0;
  expect(p, StatusCode::kInvalidHeadDim, "head_dim");
  p = buf.out_of_place();
  p.cache_len = int64_t{1} << 33;
  expect(p, StatusCode::kTooLarge, "cache_len");
}

TEST_CASE("null pointers", "[host][validate]") {
  Buffers buf;
  auto p = buf.out_of_place();
  p.grad_key_cache.data = nullptr;
  expect(p, StatusCode::kNullPointer, "grad_key_cache");
  p = buf.out_of_place();
  p.cache_position = nullptr;
  expect(p, StatusCode::kNullPointer, "cache_position");
  p = buf.out_of_place();
  p.key_states.data = nullptr;  // needed for grad_cos / grad_sin
  expect(p, StatusCode::kNullPointer, "key_states");
  p = buf.out_of_place();
  p.grad_value_cache_input.data = nullptr;
  expect(p, StatusCode::kNullPointer, "grad_value_cache_input");
  auto q = buf.in_place();
  q.grad_value_cache.data = nullptr;
  expect(q, StatusCode::kNullPointer, "grad_value_cache");
  // Empty tensors may be null.
  p = buf.out_of_place();
  p.seq_len = 0;
  p.cache_position = nullptr;
  p.key_states = {};
  p.grad_key_states = {};
  expect(p, StatusCode::kSuccess, nullptr);
  BackwardParams<T> empty;
  empty.head_dim = 64;
  expect(empty, StatusCode::kSuccess, nullptr);
}

TEST_CASE("strides", "[host][validate]") {
  Buffers buf;
  auto p = buf.out_of_place();
  p.grad_key_states.seq_stride = -D;
  expect(p, StatusCode::kInvalidStride, "grad_key_states.seq_stride");
  p = buf.out_of_place();
  p.cos.batch_stride = -1;
  expect(p, StatusCode::kInvalidStride, "cos.batch_stride");
  p = buf.out_of_place();
  p.grad_key_states.seq_stride = D / 2;  // rows overlap
  expect(p, StatusCode::kOverlappingRows, "grad_key_states.seq_stride");
  p = buf.out_of_place();
  p.grad_cos.batch_stride = 0;  // summed over the batch: both table gradients or neither
  expect(p, StatusCode::kInvalidStride, "grad_sin.batch_stride");
  p.grad_sin.batch_stride = 0;
  expect(p, StatusCode::kSuccess, nullptr);
  p = buf.out_of_place();
  p.grad_cos.seq_stride = 0;  // a summed table still has one row a token
  expect(p, StatusCode::kOverlappingRows, "grad_cos.seq_stride");
  p = buf.out_of_place();
  p.rotary_dim = D + 2;
  expect(p, StatusCode::kInvalidRotaryDim, "rotary_dim");
  p.rotary_dim = 3;
  expect(p, StatusCode::kInvalidRotaryDim, "rotary_dim");
  p.rotary_dim = 0;
  p.style = static_cast<RotaryStyle>(7);
  expect(p, StatusCode::kInvalidStyle, "style");
  p.style = RotaryStyle::kRotateHalf;
  p.rotary_dim = D / 2;  // the tables [B, S, R] then need only R columns
  expect(p, StatusCode::kSuccess, nullptr);
  p = buf.out_of_place();
  p.grad_value_cache_input.head_stride = L * D / 2;  // heads overlap
  expect(p, StatusCode::kOverlappingRows, "grad_value_cache_input.head_stride");
}

TEST_CASE("aliasing", "[host][validate]") {
  Buffers buf;
  auto p = buf.out_of_place();
  p.grad_key_cache_input = bhsd(buf.gk.data(), H, L, D);  // output = input
  expect(p, StatusCode::kAliasedBuffers, "grad_key_cache_input");
  p = buf.out_of_place();
  p.grad_value_states = bhsd(buf.gks.data() + D, H, S, D);  // overlaps another output
  expect(p, StatusCode::kAliasedBuffers, "grad_value_states");
  p = buf.out_of_place();
  p.grad_cos = bsd(buf.cos.data(), S, D);
  expect(p, StatusCode::kAliasedBuffers, "grad_cos");
  auto q = buf.in_place();
  q.grad_key_states = bhsd(buf.gk.data(), H, S, D);  // in-place: gK is written, so it is an output
  expect(q, StatusCode::kAliasedBuffers, "grad_key_cache");
  // The status names both buffers of an overlap.
  p = buf.out_of_place();
  p.grad_key_cache_input = bhsd(buf.gk.data(), H, L, D);
  CHECK(std::string(validate(p).other) == "grad_key_cache");
  p = buf.out_of_place();
  p.grad_value_states = bhsd(buf.gks.data() + D, H, S, D);
  CHECK(std::string(validate(p).other) == "grad_key_states");

  // Two outputs interleaved in one buffer without sharing an element (a fused [B, S, 2, H, D]
  // gradient) are accepted; shifting one of them by half a row makes them collide.
  std::vector<T> kv(B * S * 2 * H * D);
  p = buf.out_of_place();
  p.grad_key_states = {kv.data(), S * 2 * H * D, D, 2 * H * D};
  p.grad_value_states = {kv.data() + H * D, S * 2 * H * D, D, 2 * H * D};
  expect(p, StatusCode::kSuccess, nullptr);
  p.grad_value_states.data = kv.data() + H * D + D / 2;
  expect(p, StatusCode::kAliasedBuffers, "grad_value_states");
}

TEST_CASE("a rejected launch writes nothing and needs no GPU", "[host][validate]") {
  Buffers buf;
  auto p = buf.out_of_place();
  p.head_dim = 3;
  std::vector<T> before = buf.gks;
  std::memset(buf.gks.data(), 0x5A, buf.gks.size() * sizeof(T));
  before = buf.gks;
  CHECK(kv_cache_rope_backward<HeadDims<>>(p).code ==
        StatusCode::kInvalidHeadDim);  // (no compiled head dim: a quick build)
  auto q = buf.in_place();
  q.cache_position = nullptr;
  CHECK(kv_cache_rope_backward<HeadDims<>>(q).code == StatusCode::kNullPointer);
  CHECK(std::memcmp(before.data(), buf.gks.data(), before.size() * sizeof(T)) == 0);
}

TEST_CASE("the workspace: optional, 4-byte aligned, its own memory", "[host][validate]") {
  Buffers buf;
  uint32_t words[4] = {};
  auto p = buf.out_of_place();
  p.workspace = words;
  expect(p, StatusCode::kSuccess, nullptr);
  p.workspace = reinterpret_cast<char*>(words) + 2;
  expect(p, StatusCode::kMisaligned, "workspace");
  p.workspace = buf.gk.data() + 8;  // inside an input
  expect(p, StatusCode::kAliasedBuffers, "workspace");
  p.workspace = buf.gks.data();  // the first bytes of an output
  const Status s = validate(p);
  CHECK(s.code == StatusCode::kAliasedBuffers);
  CHECK(to_string(StatusCode::kMisaligned) == std::string("pointer not aligned as required"));
}
