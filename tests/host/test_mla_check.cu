// Host tests of the MLA append's GPU-test check (tests/support/mla_case.hpp), without a GPU: the outputs a correct
// call leaves (emulate_mla: the reference's values rounded to T, fp8 codes) pass it for every configuration the
// GPU test draws from (layouts, q outputs, styles, slots, sizes, offsets and pads, caches in T and fp8); one
// wrong element of each kind, an element outside the rows changed, or a missing flag bit fails it. The same for
// the benchmark's row-by-row checker, verify/check_mla.hpp (within the rows: what lies outside them it leaves to
// its caller).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/mla_case.hpp"
#include "verify/check_mla.hpp"

using namespace kvrope;
using namespace kvrope::testing;

namespace {

template <typename U>
void fill_normal_host(std::vector<U>& v, int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  v.resize(static_cast<size_t>(n));
  for (auto& e : v) e = from_float<U>(normal(rng));
}
template <typename U>
void fill_poison(std::vector<U>& v, int64_t n) {
  v.resize(static_cast<size_t>(n));
  if (n) std::memset(static_cast<void*>(v.data()), 0xFF, v.size() * sizeof(U));
}

// The buffers before a call, as the GPU test makes them: inputs random normal, outputs 0xFF.
template <typename T, typename C, typename Pos>
MlaSnapshot<T, C> before_call(const MlaCase<Pos>& k) {
  std::mt19937_64 rng(k.cfg.seed);
  MlaSnapshot<T, C> s;
  fill_normal_host(s.q, k.q_size, rng);
  fill_normal_host(s.q_nope, k.q_nope_size, rng);
  fill_normal_host(s.kv, k.kv_size, rng);
  if (k.cfg.table_f32)
    fill_normal_host(s.table_f32, k.table_size, rng);
  else
    fill_normal_host(s.table, k.table_size, rng);
  if (k.cfg.q_fp8())
    fill_poison(s.q_out8, k.out_size);
  else
    fill_poison(s.q_out, k.out_size);
  fill_poison(s.cache, k.cache_size);
  fill_poison(s.ckv, k.ckv_size);
  fill_poison(s.kpe, k.kpe_size);
  return s;
}

// The first index below `size` for which pred(index) holds, or -1.
template <typename Pred>
int64_t find_index(int64_t size, Pred pred) {
  for (int64_t i = 0; i < size; ++i)
    if (pred(i)) return i;
  return -1;
}

template <typename T, typename C, typename Pos>
void check_case(const MlaConfig& c) {
  INFO(c.describe());
  const MlaCase<Pos> k(c, kIsFp8<C>);
  const MlaSnapshot<T, C> before = before_call<T, C, Pos>(k);
  int flag = 0;
  const MlaSnapshot<T, C> after = emulate_mla(k, before, &flag);
  const MlaCheckResult r = check_mla(k, before, after, flag);
  INFO("checked " << r.checked << ", mismatches " << r.bad << ": " << r.first);
  REQUIRE(r.ok());
  CHECK(r.checked > 0);

  // A missing required bit, or a bit the call may not set.
  if (flag != 0) CHECK(!check_mla(k, before, after, 0).ok());
  CHECK(!check_mla(k, before, after, flag | 8).ok());

  // One cache element changed: a written one by far more than the tolerance, or one of a slot (or a pad) the call
  // must not write.
  const std::vector<C>& cache = c.split ? after.ckv : after.cache;
  const std::vector<C>& was = c.split ? before.ckv : before.cache;
  const auto size = static_cast<int64_t>(cache.size());
  const int64_t written = find_index(size, [&](int64_t i) { return std::memcmp(&cache[i], &was[i], sizeof(C)) != 0; });
  const int64_t untouched =
      find_index(size, [&](int64_t i) { return std::memcmp(&cache[i], &was[i], sizeof(C)) == 0; });
  for (const int64_t at : {written, untouched}) {
    if (at < 0) continue;
    MlaSnapshot<T, C> wrong = after;
    std::vector<C>& buf = c.split ? wrong.ckv : wrong.cache;
    if constexpr (kIsFp8<C>) {
      uint8_t b;
      std::memcpy(&b, &buf[at], 1);
      b = static_cast<uint8_t>(b ^ 0x40);  // an exponent bit
      std::memcpy(&buf[at], &b, 1);
    } else {
      buf[at] = from_float<C>(std::memcmp(&cache[at], &was[at], sizeof(C)) == 0 ? 1.0f : to_float(buf[at]) + 3.0f);
    }
    INFO("cache element " << at);
    CHECK(!check_mla(k, before, wrong, flag).ok());
  }

  // One q element changed: in place, in q (a written one, or q_nope's, which is never written); out of place, in
  // the output (a copy of q_nope changed by one ulp must fail: it is bit for bit).
  if (c.query_heads > 0 && c.tokens > 0) {
    MlaSnapshot<T, C> wrong = after;
    if (!c.q_out()) {
      const int64_t at = k.q_pe_at(0, 0, 0);
      wrong.q[at] = from_float<T>(to_float(wrong.q[at]) + 3.0f);
      CHECK(!check_mla(k, before, wrong, flag).ok());
      wrong = after;
      if (c.fused_q && c.nope_dim > 0) {
        wrong.q[c.offset] = from_float<T>(7.0f);  // q_nope's first element, row (0, 0)
        CHECK(!check_mla(k, before, wrong, flag).ok());
      }
    } else if (c.q_fp8()) {
      const int64_t t = find_index(c.tokens, [&](int64_t u) {
        const int64_t p = static_cast<int64_t>(k.pos[static_cast<size_t>(u)]);
        return p >= 0 && p < k.max_position;
      });
      if (t >= 0) {
        const int64_t at = k.out_at(t, 0, c.nope_dim);
        uint8_t b;
        std::memcpy(&b, &wrong.q_out8[at], 1);
        b = static_cast<uint8_t>(b ^ 0x40);
        std::memcpy(&wrong.q_out8[at], &b, 1);
        CHECK(!check_mla(k, before, wrong, flag).ok());
      }
    } else {
      const int64_t t = find_index(c.tokens, [&](int64_t u) {
        const int64_t p = static_cast<int64_t>(k.pos[static_cast<size_t>(u)]);
        return p >= 0 && p < k.max_position;
      });
      if (t >= 0 && c.q_nope() && c.nope_dim > 0) {
        const int64_t at = k.out_at(t, 0, 0);
        uint16_t bits = 0;
        std::memcpy(&bits, &wrong.q_out[at], 2);
        bits = static_cast<uint16_t>(bits ^ 1);  // one ulp (fp32: of its low half)
        std::memcpy(static_cast<void*>(&wrong.q_out[at]), &bits, 2);
        CHECK(!check_mla(k, before, wrong, flag).ok());
      }
    }
  }
}

// verify::check_mla's outputs: the buffers of `after`, laid out as host_args lays out those of `before`.
template <typename T, typename C, typename Pos>
verify::MlaOutputs<T, C> outputs_of(const MlaCase<Pos>& k, const MlaSnapshot<T, C>& after) {
  const reference::MlaHostArgs<T, C, Pos> a = k.host_args(after);
  verify::MlaOutputs<T, C> o;
  o.query_pe = a.query_pe;
  o.query_nope = a.query_nope;
  o.query_out = a.query_out;
  o.query_out_fp8 = a.query_out_fp8;
  o.kv_c = a.kv_c;
  o.k_pe = a.k_pe;
  o.caches = a.caches;
  return o;
}

template <typename U>
void flip(U& x, bool far) {
  if constexpr (sizeof(U) == 1) {
    uint8_t b;
    std::memcpy(&b, &x, 1);
    b = static_cast<uint8_t>(b ^ (far ? 0x40 : 0x01));
    std::memcpy(&x, &b, 1);
  } else {
    x = from_float<U>(to_float(x) + 3.0f);
  }
}

template <typename T, typename C, typename Pos>
void check_verify_case(const MlaConfig& c) {
  INFO(c.describe());
  const MlaCase<Pos> k(c, kIsFp8<C>);
  const MlaSnapshot<T, C> before = before_call<T, C, Pos>(k);
  int flag = 0;
  const MlaSnapshot<T, C> after = emulate_mla(k, before, &flag);
  const reference::MlaHostArgs<T, C, Pos> in = k.host_args(before);
  const verify::CheckResult r = verify::check_mla(in, outputs_of(k, after));
  INFO("checked " << r.checked << ", mismatches " << r.mismatches << ": " << r.first_mismatch);
  REQUIRE(r.ok());
  // Every row element: q_pe's and q_nope's (and the output's), kv_c's and k_pe's, and every slot's L + R.
  const int64_t heads = c.query_heads * c.tokens, W = c.nope_dim + c.rotary_dim, row = c.latent_dim + c.rotary_dim;
  CHECK(r.checked == heads * W * (c.q_out() ? 2 : 1) + (c.tokens + k.num_slots) * row);

  const std::vector<int64_t> writer = reference::mla_slot_writers(in);
  const auto written = std::find_if(writer.begin(), writer.end(), [](int64_t t) { return t >= 0; });
  const auto untouched = std::find_if(writer.begin(), writer.end(), [](int64_t t) { return t < 0; });
  // One cache element changed: kv_c's and RoPE(k_pe)'s of a written slot, the first of a slot no token writes.
  for (const auto& [it, d] : {std::pair{written, int64_t{0}}, std::pair{written, c.latent_dim + c.rotary_dim - 1},
                              std::pair{untouched, int64_t{0}}}) {
    if (it == writer.end()) continue;
    const int64_t s = it - writer.begin();
    MlaSnapshot<T, C> wrong = after;
    std::vector<C>& buf = c.split ? (d < c.latent_dim ? wrong.ckv : wrong.kpe) : wrong.cache;
    flip(buf[k.cache_at(s, d)], true);
    INFO("slot " << s << " element " << d);
    CHECK(!verify::check_mla(in, outputs_of(k, wrong)).ok());
  }
  // kv changed (an input: never written).
  {
    MlaSnapshot<T, C> wrong = after;
    flip(wrong.kv[c.offset], true);
    CHECK(!verify::check_mla(in, outputs_of(k, wrong)).ok());
  }
  // q: the first element of q_pe's row (0, 0) (in place: rotated; out: left as it was), the first q_nope element
  // (never written), and a written element of the output: RoPE(q_pe)'s first, and a copy of q_nope's by one ulp.
  if (c.query_heads == 0 || c.tokens == 0) return;
  const int64_t t = find_index(c.tokens, [&](int64_t u) { return reference::mla_token_valid(in, u); });
  if (t < 0) return;
  MlaSnapshot<T, C> wrong = after;
  flip(wrong.q[k.q_pe_at(t, 0, 0)], true);
  CHECK(!verify::check_mla(in, outputs_of(k, wrong)).ok());
  if (c.nope_dim > 0) {
    wrong = after;
    std::vector<T>& nope = c.fused_q ? wrong.q : wrong.q_nope;
    flip(nope[c.fused_q ? k.q_pe_at(t, 0, 0) - c.nope_dim : c.offset + t * k.nope_tok], true);
    CHECK(!verify::check_mla(in, outputs_of(k, wrong)).ok());
  }
  if (!c.q_out()) return;
  for (const int64_t d : {c.nope_dim, int64_t{0}}) {
    if (d == 0 && (!c.q_nope() || c.nope_dim == 0)) continue;
    wrong = after;
    if (c.q_fp8())
      flip(wrong.q_out8[k.out_at(t, 0, d)], d >= c.nope_dim);
    else if (d >= c.nope_dim)
      flip(wrong.q_out[k.out_at(t, 0, d)], true);
    else {
      uint16_t bits = 0;
      std::memcpy(&bits, &wrong.q_out[k.out_at(t, 0, d)], 2);
      bits = static_cast<uint16_t>(bits ^ 1);  // one ulp (fp32: of its low half)
      std::memcpy(static_cast<void*>(&wrong.q_out[k.out_at(t, 0, d)]), &bits, 2);
    }
    INFO("query_out element " << d);
    CHECK(!verify::check_mla(in, outputs_of(k, wrong)).ok());
  }
}

}  // namespace

TEST_CASE("mla check: a correct call's outputs pass, one wrong element fails", "[host][mla]") {
  uint64_t seed = 1;
  for (const MlaShape& shape : kShapes)
    for (const bool split : {false, true})
      for (const MlaQMode qmode : kQModes) {
        MlaConfig c;
        c.seed = seed++;
        set_shape(c, shape);
        c.split = split;
        c.qmode = qmode;
        c.style = c.seed % 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
        c.tokens = 3 + static_cast<int64_t>(c.seed % 11);
        c.query_heads = c.seed % 7 == 0 ? 0 : 4;
        c.fused_q = c.seed % 3 != 2;
        c.table_f32 = c.seed % 3 != 1;
        c.page_size = c.seed % 3 == 0 ? 1 : 16;
        c.slots = kSlots[c.seed % 4];
        c.offset = c.seed % 4 == 1 ? 1 : 0;
        c.pad = c.seed % 5 == 0 ? 0 : c.seed % 5 == 1 ? 3 : 16;
        c.scales = c.seed % 3 != 0;
        check_case<__nv_bfloat16, __nv_bfloat16, int64_t>(c);
        check_case<float, __nv_fp8_e4m3, int32_t>(c);
        check_case<__half, __nv_fp8_e5m2, int64_t>(c);
      }
}

TEST_CASE("mla verify::check_mla: a correct call's outputs pass, one wrong element fails", "[host][mla]") {
  uint64_t seed = 101;
  for (const MlaShape& shape : kShapes)
    for (const bool split : {false, true})
      for (const MlaQMode qmode : kQModes) {
        MlaConfig c;
        c.seed = seed++;
        set_shape(c, shape);
        c.split = split;
        c.qmode = qmode;
        c.style = c.seed % 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
        c.tokens = 3 + static_cast<int64_t>(c.seed % 11);
        c.query_heads = c.seed % 7 == 0 ? 0 : 4;
        c.fused_q = c.seed % 3 != 2;
        c.page_size = c.seed % 3 == 0 ? 1 : 16;
        c.slots = kSlots[c.seed % 4];
        c.pad = c.seed % 5 == 0 ? 0 : 16;
        check_verify_case<__nv_bfloat16, __nv_bfloat16, int64_t>(c);
        check_verify_case<__nv_bfloat16, __nv_fp8_e4m3, int64_t>(c);
        check_verify_case<float, __nv_fp8_e5m2, int32_t>(c);
      }
}
