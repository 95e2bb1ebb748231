// Host tests of validate() for the forward: each invalid input gets its own status and field (runs
// without a GPU: validation happens before any CUDA call).
#include <kvrope/kvrope.cuh>

// No macro of kvrope's reaches the code that includes it, in the host or the device pass.
#if defined(KVROPE_UNROLL) || defined(KVROPE_HAS_BULK_COPY) || defined(KVROPE_DECODE_BOUNDS)
#error "a kvrope header leaks a macro"
#endif

#include <string>
#include <vector>

#include "support/catch.hpp"

using namespace kvrope;

namespace {
using T = __nv_bfloat16;
constexpr int64_t B = 2, H = 4, Hq = 8, S = 8, L = 32, D = 64, P = 100;

// Host buffers standing in for device memory: validate() never dereferences them.
struct Buffers {
  std::vector<T> k = std::vector<T>(B * H * S * D), v = k, k_out = k;
  std::vector<T> kc = std::vector<T>(B * H * L * D), vc = kc;
  std::vector<T> q = std::vector<T>(B * Hq * S * D), q_out = q;
  std::vector<T> cos = std::vector<T>(B * S * D), sin = cos, cache = std::vector<T>(P * D);
  std::vector<float> cache_f32 = std::vector<float>(P * D);
  std::vector<int64_t> pos = std::vector<int64_t>(S), ids = std::vector<int64_t>(B * S);

  ForwardParams<T> per_token() {
    ForwardParams<T> p;
    p.batch = B, p.heads = H, p.seq_len = S, p.cache_len = L, p.head_dim = D;
    p.key_states = bhsd<const T>(k.data(), H, S, D);
    p.value_states = bhsd<const T>(v.data(), H, S, D);
    p.key_cache = bhsd(kc.data(), H, L, D);
    p.value_cache = bhsd(vc.data(), H, L, D);
    p.key_out = bhsd(k_out.data(), H, S, D);
    p.cache_position = pos.data();
    p.cos = bsd<const T>(cos.data(), S, D);
    p.sin = bsd<const T>(sin.data(), S, D);
    return p;
  }
  ForwardParams<T> table_cache() {
    ForwardParams<T> p = per_token();
    p.cos = {};
    p.sin = {};
    p.cos_sin_cache = cache.data();
    p.max_position = P;
    p.position_ids = ids.data();
    p.position_ids_batch_stride = S;
    return p;
  }
};

void expect(const ForwardParams<T>& p, StatusCode code, const char* field) {
  const Status s = validate(p);
  INFO("got " << to_string(s.code) << " / " << (s.field ? s.field : "(none)"));
  CHECK(s.code == code);
  CHECK(std::string(s.field ? s.field : "") == std::string(field ? field : ""));
}
}  // namespace

TEST_CASE("forward: valid parameters pass, with either table source and q in place or out", "[host][validate]") {
  Buffers buf;
  expect(buf.per_token(), StatusCode::kSuccess, nullptr);
  auto p = buf.table_cache();
  expect(p, StatusCode::kSuccess, nullptr);
  p.query_heads = Hq;
  p.query = bhsd(buf.q.data(), Hq, S, D);
  expect(p, StatusCode::kSuccess, nullptr);  // in place
  p.query_out = bhsd(buf.q_out.data(), Hq, S, D);
  expect(p, StatusCode::kSuccess, nullptr);
  p.key_out = {};  // optional
  p.rotary_dim = D / 2;
  p.style = RotaryStyle::kInterleaved;
  expect(p, StatusCode::kSuccess, nullptr);
}

TEST_CASE("forward: sizes, rotary_dim, table sources", "[host][validate]") {
  Buffers buf;
  auto p = buf.per_token();
  p.rotary_dim = D + 2;
  expect(p, StatusCode::kInvalidRotaryDim, "rotary_dim");
  p.rotary_dim = 5;
  expect(p, StatusCode::kInvalidRotaryDim, "rotary_dim");
  p = buf.per_token();
  p.query_heads = -1;
  expect(p, StatusCode::kInvalidSize, "query_heads");
  p = buf.per_token();
  p.cos_sin_cache = buf.cache.data();  // two table sources
  expect(p, StatusCode::kConflictingFields, "cos");
  p = buf.table_cache();
  p.cos_sin_cache_f32 = buf.cache_f32.data();
  expect(p, StatusCode::kConflictingFields, "cos_sin_cache");
  p = buf.table_cache();
  p.position_ids_batch_stride = 3;
  expect(p, StatusCode::kInvalidStride, "position_ids_batch_stride");
  p = buf.table_cache();
  p.position_ids = nullptr;
  expect(p, StatusCode::kNullPointer, "position_ids");
  p = buf.per_token();
  p.sin = {};
  expect(p, StatusCode::kNullPointer, "sin");
  p = buf.per_token();
  p.query_heads = Hq;  // q asked for, no q
  expect(p, StatusCode::kNullPointer, "query");
}

TEST_CASE("forward: outputs may overlap nothing", "[host][validate]") {
  Buffers buf;
  auto p = buf.per_token();
  p.key_cache = bhsd(const_cast<T*>(buf.k.data()), H, S, D);  // the cache over k
  p.cache_len = S;
  p.value_cache = bhsd(buf.vc.data(), H, S, D);
  expect(p, StatusCode::kAliasedBuffers, "key_cache");
  CHECK(std::string(validate(p).other) == "key_states");
  p = buf.per_token();
  p.key_out = bhsd(buf.kc.data(), H, S, D);  // inside the key cache
  expect(p, StatusCode::kAliasedBuffers, "key_out");
  p = buf.per_token();
  p.key_cache.seq_stride = D / 2;  // its rows overlap
  expect(p, StatusCode::kOverlappingRows, "key_cache.seq_stride");
}

TEST_CASE("forward: the error flag's second cause has a status of its own", "[host][validate]") {
  CHECK(std::string(to_string(StatusCode::kPositionIdOutOfRange)) == "position id out of range");
  CHECK(kErrorPositionIdOutOfRange != kErrorPositionOutOfRange);
}

TEST_CASE("forward: q in place as a view of one fused qkv projection beside k and v passes", "[host][validate]") {
  // Phi-3's fused projection [B, S, (Hq + 2 H) D] seen as q [B, Hq, S, D], k and v [B, H, S, D]: the
  // same strides, different head counts, rows interleaved but disjoint. Judged on address ranges, q
  // (an output in place) overlapped k and was refused (kAliasedBuffers, "query" / "key_states").
  std::vector<T> qkv(B * S * (Hq + 2 * H) * D);
  std::vector<T> kc(B * H * L * D), vc(kc.size());
  std::vector<T> cos(B * S * D), sin(cos.size());
  std::vector<int64_t> pos(S);
  const int64_t token = (Hq + 2 * H) * D;
  auto view = [&](int64_t offset) { return HeadRows<T>{qkv.data() + offset, S * token, D, token}; };
  ForwardParams<T> p;
  p.batch = B, p.heads = H, p.seq_len = S, p.cache_len = L, p.head_dim = D, p.query_heads = Hq;
  p.query = view(0);
  p.key_states = view(Hq * D);
  p.value_states = view((Hq + H) * D);
  p.key_cache = bhsd(kc.data(), H, L, D);
  p.value_cache = bhsd(vc.data(), H, L, D);
  p.cache_position = pos.data();
  p.cos = bsd<const T>(cos.data(), S, D);
  p.sin = bsd<const T>(sin.data(), S, D);
  expect(p, StatusCode::kSuccess, nullptr);
  // key_out written over v's heads of the same buffer does overlap: still refused.
  p.key_out = view((Hq + H) * D);
  const Status s = validate(p);
  CHECK(s.code == StatusCode::kAliasedBuffers);
  CHECK(std::string(s.field) == "key_out");
  CHECK(std::string(s.other) == "value_states");
  // q one head wider than its share reaches k's first head: refused.
  p.key_out = {};
  p.query_heads = Hq + 1;
  CHECK(validate(p).code == StatusCode::kAliasedBuffers);
}
