// Host tests of the overlap check on the views models make of one fused qkv projection, for every op that
// checks overlap (forward, backward, append), every batch, decode (S = 1) and prefill: Phi-3's slices of
// [B, S, (Hq + 2 H) D] and GPT-NeoX's per-head [q k v] of [B, S, H, 3 D], with the strides torch gives
// them (a size-1 dim gets the stride of what is inside it). No GPU: validate() reads no memory.
#include <kvrope/kvrope.cuh>

#include <cstdint>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_append.hpp"

using namespace kvrope;

namespace {

using T = __nv_bfloat16;

enum class Model { kPhi3, kGptNeoX };

// q (which 0), k (1) or v (2) of one fused projection of `batch` x `seq` tokens, as [B, heads, S, D]
// element offsets and strides, read off torch 2.11:
//   Phi-3:    qkv[..., lo:hi].view(B, S, -1, D).transpose(1, 2)
//   GPT-NeoX: qkv.view(B, S, -1, 3 D).transpose(1, 2).chunk(3, dim=-1)
struct View {
  int64_t offset, heads, batch_stride, head_stride, seq_stride;
};
View fused_view(Model m, int which, int64_t batch, int64_t seq, int64_t hq, int64_t h, int64_t d) {
  if (m == Model::kGptNeoX) {
    const int64_t width = 3 * h * d;
    return {which * d, h, seq * width, 3 * d, h * 3 * d};
  }
  const int64_t width = (hq + 2 * h) * d, heads = which == 0 ? hq : h;
  const int64_t seq_stride = seq == 1 ? heads * d : width;
  return {which == 0   ? 0
          : which == 1 ? hq * d
                       : (hq + h) * d,
          heads, batch == 1 ? seq_stride * seq : seq * width, d, seq_stride};
}
int64_t fused_elements(Model m, int64_t batch, int64_t seq, int64_t hq, int64_t h, int64_t d) {
  return batch * seq * (m == Model::kGptNeoX ? 3 * h * d : (hq + 2 * h) * d);
}

template <typename U>
HeadRows<U> rows(U* base, const View& v) {
  return HeadRows<U>{base + v.offset, v.batch_stride, v.head_stride, v.seq_stride};
}

struct Shape {
  Model model;
  int64_t hq, h, d;
};
// Phi-3-mini (MHA 32), Phi-3-medium (GQA 40 / 10), a GQA 32 / 8; GPT-NeoX (MHA 32, D 80 and 128).
const std::vector<Shape> kShapes{{Model::kPhi3, 32, 32, 96},
                                 {Model::kPhi3, 40, 10, 128},
                                 {Model::kPhi3, 32, 8, 96},
                                 {Model::kGptNeoX, 32, 32, 80},
                                 {Model::kGptNeoX, 32, 32, 128}};
const int64_t kBatches[] = {1, 2, 3, 16};
const int64_t kSeqs[] = {1, 7};

const char* name(Model m) { return m == Model::kPhi3 ? "Phi-3" : "GPT-NeoX"; }

}  // namespace

TEST_CASE("fused qkv views: forward, q in place beside k and v", "[host][validate]") {
  constexpr int64_t L = 64;
  for (const Shape& sh : kShapes)
    for (const int64_t b : kBatches)
      for (const int64_t s : kSeqs) {
        const int64_t d = sh.d, h = sh.h;
        std::vector<T> qkv(fused_elements(sh.model, b, s, sh.hq, h, d)), kc(b * h * L * d), vc(kc.size());
        std::vector<T> cos(b * s * d), sin(cos.size());
        std::vector<int64_t> pos(s);
        ForwardParams<T> p;
        p.batch = b, p.heads = h, p.seq_len = s, p.cache_len = L, p.head_dim = d, p.query_heads = sh.hq;
        p.query = rows(qkv.data(), fused_view(sh.model, 0, b, s, sh.hq, h, d));
        p.key_states = rows<const T>(qkv.data(), fused_view(sh.model, 1, b, s, sh.hq, h, d));
        p.value_states = rows<const T>(qkv.data(), fused_view(sh.model, 2, b, s, sh.hq, h, d));
        p.key_cache = bhsd(kc.data(), h, L, d);
        p.value_cache = bhsd(vc.data(), h, L, d);
        p.cache_position = pos.data();
        p.cos = bsd<const T>(cos.data(), s, d);
        p.sin = bsd<const T>(sin.data(), s, d);
        INFO(name(sh.model) << " Hq " << sh.hq << " H " << h << " D " << d << " B " << b << " S " << s);
        CHECK(validate(p).ok());
        // q shifted onto k's first rows: refused, naming both.
        p.query.data += sh.model == Model::kPhi3 ? d : d / 2;
        const Status st = validate(p);
        CHECK(st.code == StatusCode::kAliasedBuffers);
        CHECK(std::string(st.field) == "query");
      }
}

TEST_CASE("fused qkv views: backward, the gradients of k and v into one fused gradient", "[host][validate]") {
  constexpr int64_t L = 64;
  for (const Shape& sh : kShapes)
    for (const int64_t b : kBatches)
      for (const int64_t s : kSeqs) {
        const int64_t d = sh.d, h = sh.h, n = fused_elements(sh.model, b, s, sh.hq, h, d);
        std::vector<T> qkv(n), grad_qkv(n), gk(b * h * L * d), gv(gk.size()), gk_in(gk.size()), gv_in(gk.size());
        std::vector<T> cos(b * s * d), sin(cos.size());
        std::vector<int64_t> pos(s);
        BackwardParams<T> p;
        p.batch = b, p.heads = h, p.seq_len = s, p.cache_len = L, p.head_dim = d;
        p.key_states = rows<const T>(qkv.data(), fused_view(sh.model, 1, b, s, sh.hq, h, d));
        p.cos = bsd<const T>(cos.data(), s, d);
        p.sin = bsd<const T>(sin.data(), s, d);
        p.cache_position = pos.data();
        p.grad_key_states = rows(grad_qkv.data(), fused_view(sh.model, 1, b, s, sh.hq, h, d));
        p.grad_value_states = rows(grad_qkv.data(), fused_view(sh.model, 2, b, s, sh.hq, h, d));
        p.grad_key_cache = bhsd<const T>(gk.data(), h, L, d);
        p.grad_value_cache = bhsd<const T>(gv.data(), h, L, d);
        p.grad_key_cache_input = bhsd(gk_in.data(), h, L, d);
        p.grad_value_cache_input = bhsd(gv_in.data(), h, L, d);
        INFO(name(sh.model) << " Hq " << sh.hq << " H " << h << " D " << d << " B " << b << " S " << s);
        CHECK(validate(p).ok());
        BackwardInPlaceParams<T> ip;
        static_cast<BackwardCommon<T>&>(ip) = p;
        ip.grad_key_cache = bhsd(gk.data(), h, L, d);
        ip.grad_value_cache = bhsd(gv.data(), h, L, d);
        CHECK(validate(ip).ok());
        p.grad_value_states.data -= d / 2;  // onto k's last elements
        const Status st = validate(p);
        CHECK(st.code == StatusCode::kAliasedBuffers);
        CHECK(std::string(st.field) == "grad_value_states");
      }
}

TEST_CASE("fused qkv views: append, q and k in place, every token count", "[host][validate]") {
  for (const Shape& sh : kShapes)
    for (const int64_t b : kBatches)
      for (const int64_t s : kSeqs) {
        // The append's tokens are ragged: [T, heads, D] of T = B S tokens, torch's strides for T = 1.
        const int64_t t = b * s, d = sh.d, h = sh.h;
        AppendParams<T, T> p = fake_append<T>(t, h, sh.hq, d);
        T* qkv = p.query.data;
        auto heads = [&](int which) {
          const View v = fused_view(sh.model, which, 1, t, sh.hq, h, d);
          return TokenHeads<T>{qkv + v.offset, v.seq_stride, v.head_stride};
        };
        p.query = heads(0);
        p.key = heads(1);
        p.value = TokenHeads<const T>(heads(2));
        p.key_in_place = true;
        INFO(name(sh.model) << " Hq " << sh.hq << " H " << h << " D " << d << " T " << t);
        CHECK(validate(p).ok());
        p.key.data -= d / 2;  // onto q's (Phi-3) or the head's q (GPT-NeoX) last elements
        CHECK(validate(p).code == StatusCode::kAliasedBuffers);
      }
}

TEST_CASE("overlap: views of different strides are compared row by row", "[host][validate]") {
  using detail::Layout;
  // One buffer of rows of 8 elements: a takes the even rows (head stride 16), b every fourth from row 1
  // (head stride 32), 2 tokens each: disjoint, though their strides differ and their ranges interleave.
  const char* names[3] = {"s0", "s1", "s2"};
  auto view = [&](int64_t first_row, int64_t heads, int64_t head_stride) {
    return Layout{"v",
                  reinterpret_cast<const void*>(0x1000 + 2 * first_row * 8),
                  2,
                  8,
                  3,
                  {2, heads, 1},
                  {1024, head_stride, 0},
                  {names[0], names[1], names[2]}};
  };
  CHECK_FALSE(detail::overlaps(view(0, 32, 16), view(1, 16, 32)));
  CHECK_FALSE(detail::overlaps(view(1, 16, 32), view(0, 32, 16)));
  CHECK(detail::overlaps(view(0, 32, 16), view(2, 16, 32)));  // row 2 is a's
  CHECK(detail::overlaps(view(2, 16, 32), view(0, 32, 16)));
  // Beyond the probes' limit the answer is conservative.
  CHECK(detail::overlaps(view(0, 1 << 13, 16), view(1, 1 << 12, 32)));
}
