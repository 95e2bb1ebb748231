// GPU tests of the MLA append (docs/spec.md §6.6, kvrope/mla_append.cuh) against the float64 reference
// (kvrope/reference/cpu_mla.hpp): bf16, fp16 and fp32; caches in T, e4m3 and e5m2 (with and without kv_scale);
// vLLM's one cache and FlashInfer's two; q in place, out in T and out in fp8, with and without q_nope; both
// styles; L = 512, R = 64 (the compiled instance), generic sizes on the vector path (L = 256, R = 32) and odd
// ones on the scalar path (L = 511, R = 40), misaligned views; Hq = 16 and 128, no q; a fused q and separate
// q_pe, q_nope; padding (-1), repeated and out-of-range slots, out-of-range positions; int32 and int64 positions;
// fp32 and T tables; decode, prefill, an empty call; PDL and graph capture. Every output is poisoned (0xFF bytes)
// before each launch; every element of every output buffer is checked: a copy bit for bit (fp8: the reference's
// code), a rotated value within the tolerance of §1.7 (fp8: the code of a value in T within it), everything the
// call must not write unchanged; then the error flag.
#include <kvrope/mla_append.cuh>
#include <kvrope/reference/cpu_mla.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "support/cuda_require.hpp"
#include "support/gpu_problem.cuh"
#include "verify/check_append.hpp"  // verify::detail::fp8_within_tolerance
#include "verify/tolerance.hpp"

using namespace kvrope;
using namespace kvrope::testing;

namespace {

enum class QMode { kInPlace, kOut, kOutNope, kOutFp8, kOutFp8Nope };
// How tokens name slots: distinct ones; distinct with some -1 (padding); few slots named many times (with
// some positions out of range, whose tokens do not count as writers); out-of-range slots and positions.
enum class Slots { kDistinct, kPadding, kRepeats, kBad };
enum class Launch { kDirect, kPdl, kGraph };

const char* name(QMode m) {
  const char* names[] = {"in place", "out", "out + q_nope", "out fp8", "out fp8 + q_nope"};
  return names[static_cast<int>(m)];
}
const char* name(Slots s) {
  const char* names[] = {"distinct", "padding", "repeats", "bad"};
  return names[static_cast<int>(s)];
}

struct MlaConfig {
  int64_t tokens = 33, query_heads = 16, nope_dim = 128, rotary_dim = 64, latent_dim = 512;
  RotaryStyle style = RotaryStyle::kInterleaved;
  bool split = false;  // FlashInfer's two caches, else vLLM's one
  QMode qmode = QMode::kInPlace;
  bool fused_q = true;  // q [T, Hq, N + R]: q_nope = q, q_pe = q + N
  bool table_f32 = true;
  bool pos64 = true;
  int64_t page_size = 16;
  Slots slots = Slots::kDistinct;
  int64_t offset = 0;  // elements every view starts past its buffer (1: misaligned, the scalar path)
  int64_t pad = 16;    // elements added to every row stride (and page stride)
  bool scales = true;  // fp8: query_scale and kv_scale given, else null (1)
  float scale_magnitude = 1.0f;
  Launch launch = Launch::kDirect;
  uint64_t seed = 1;

  bool q_out() const { return qmode != QMode::kInPlace; }
  bool q_fp8() const { return qmode == QMode::kOutFp8 || qmode == QMode::kOutFp8Nope; }
  bool q_nope() const { return qmode == QMode::kOutNope || qmode == QMode::kOutFp8Nope; }
  std::string describe() const {
    std::ostringstream s;
    s << "T " << tokens << " Hq " << query_heads << " N " << nope_dim << " R " << rotary_dim << " L " << latent_dim
      << (style == RotaryStyle::kInterleaved ? " interleaved" : " rotate-half") << (split ? " split" : " concat")
      << " q " << name(qmode) << (fused_q ? " fused" : " separate") << (table_f32 ? " f32 table" : " T table")
      << (pos64 ? " int64" : " int32") << " P " << page_size << " slots " << name(slots) << " offset " << offset
      << " pad " << pad << (scales ? " scales" : " no scales") << " x" << scale_magnitude << " launch "
      << static_cast<int>(launch) << " seed " << seed;
    return s.str();
  }
};

template <typename U>
bool same_bits(const U& a, const U& b) {
  return std::memcmp(&a, &b, sizeof(U)) == 0;
}
template <typename U>
uint8_t bits8(const U& c) {
  return reference::fp8_bits(c);
}

// Every element no output row covers is bit-identical before and after the call.
template <typename U>
void expect_outside_unchanged(const char* what, const std::vector<U>& before, const std::vector<U>& after,
                              const std::vector<char>& covered) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < before.size(); ++i)
    if (!covered[i] && !same_bits(before[i], after[i]) && bad++ == 0) first = static_cast<int64_t>(i);
  INFO(what << ": " << bad << " elements outside every written row changed, the first at " << first);
  CHECK(bad == 0);
}

// Host copies of every buffer a call reads or writes.
template <typename T, typename C>
struct Snapshot {
  std::vector<T> q, q_nope, q_out, kv, table;
  std::vector<float> table_f32;
  std::vector<__nv_fp8_e4m3> q_out8;
  std::vector<C> cache, ckv, kpe;
};

// Counts the mismatches of one output buffer and keeps the first one's description.
struct Tally {
  int64_t checked = 0, bad = 0;
  std::string first;
  void expect(bool ok, const char* what, int64_t at, double got, double want) {
    ++checked;
    if (ok || bad++ > 0) return;
    std::ostringstream s;
    s << what << " [" << at << "]: got " << got << ", expected " << want;
    first = s.str();
  }
};

template <typename T, typename C, typename Pos>
struct MlaProblem {
  MlaConfig cfg;
  int64_t W = 0, num_pages = 0, max_position = 0, num_slots = 0;
  // Strides (elements).
  int64_t q_head = 0, q_tok = 0, nope_head = 0, nope_tok = 0, out_head = 0, out_tok = 0, kv_row = 0;
  int64_t lat_off = 0, lat_page = 0, rope_off = 0, rope_page = 0;
  std::vector<Pos> host_pos;
  std::vector<int64_t> host_slots;
  float host_q_scale = 1.0f, host_kv_scale = 1.0f;
  DeviceBuffer<T> q, q_nope, q_out, kv, table;
  DeviceBuffer<float> table_f32, q_scale, kv_scale;
  DeviceBuffer<__nv_fp8_e4m3> q_out8;
  DeviceBuffer<C> cache, ckv, kpe;
  DeviceBuffer<Pos> pos;
  DeviceBuffer<int64_t> slots;
  DeviceBuffer<int> flag;
  MlaAppendParams<T, C, Pos> params;

  explicit MlaProblem(const MlaConfig& c) : cfg(c) {
    const int64_t NT = c.tokens, Hq = c.query_heads, N = c.nope_dim, R = c.rotary_dim, L = c.latent_dim;
    const int64_t o = c.offset, pad = c.pad;
    W = N + R;
    std::mt19937_64 rng(c.seed * 7919 + 17);
    auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    max_position = 1000 + NT;
    num_pages = (2 * NT + 8 + c.page_size - 1) / c.page_size;
    num_slots = num_pages * c.page_size;
    make_slots(uniform);

    // q: fused [T, Hq, N + R (+ pad)] or q_pe [T, Hq, R (+ pad)] and q_nope [T, Hq, N (+ pad)].
    q_head = (c.fused_q ? W : R) + pad;
    q_tok = Hq * q_head + pad;
    q = DeviceBuffer<T>(static_cast<size_t>(Hq ? o + NT * q_tok : 0));
    if (!c.fused_q) {
      nope_head = N + pad;
      nope_tok = Hq * nope_head + pad;
      q_nope = DeviceBuffer<T>(static_cast<size_t>(Hq && N ? o + NT * nope_tok : 0));
    } else {
      nope_head = q_head;
      nope_tok = q_tok;
    }
    out_head = W + pad;
    out_tok = Hq * out_head + pad;
    if (c.q_fp8()) q_out8 = DeviceBuffer<__nv_fp8_e4m3>(static_cast<size_t>(Hq ? o + NT * out_tok : 0));
    if (c.q_out() && !c.q_fp8()) q_out = DeviceBuffer<T>(static_cast<size_t>(Hq ? o + NT * out_tok : 0));
    kv_row = L + R + pad;  // kv_c and k_pe: views of one projection [T, L + R (+ pad)]
    kv = DeviceBuffer<T>(static_cast<size_t>(o + NT * kv_row));
    if (c.table_f32)
      table_f32 = DeviceBuffer<float>(static_cast<size_t>(o + max_position * R));
    else
      table = DeviceBuffer<T>(static_cast<size_t>(o + max_position * R));
    const int64_t P = c.page_size;
    if (c.split) {
      lat_off = L + pad, lat_page = P * lat_off + pad;
      rope_off = R + pad, rope_page = P * rope_off + pad;
      ckv = DeviceBuffer<C>(static_cast<size_t>(o + num_pages * lat_page));
      kpe = DeviceBuffer<C>(static_cast<size_t>(o + num_pages * rope_page));
    } else {
      lat_off = rope_off = L + R + pad;
      lat_page = rope_page = P * lat_off + pad;
      cache = DeviceBuffer<C>(static_cast<size_t>(o + num_pages * lat_page));
    }
    if constexpr (kIsFp8<C>) {
      if (c.scales) {
        host_kv_scale = 1.25f * c.scale_magnitude;
        kv_scale = DeviceBuffer<float>(1);
        KVROPE_CUDA_REQUIRE(cudaMemcpy(kv_scale.get(), &host_kv_scale, 4, cudaMemcpyHostToDevice));
      }
    }
    if (c.q_fp8() && c.scales) {
      host_q_scale = 0.75f * c.scale_magnitude;
      q_scale = DeviceBuffer<float>(1);
      KVROPE_CUDA_REQUIRE(cudaMemcpy(q_scale.get(), &host_q_scale, 4, cudaMemcpyHostToDevice));
    }
    pos = DeviceBuffer<Pos>(static_cast<size_t>(NT));
    slots = DeviceBuffer<int64_t>(static_cast<size_t>(NT));
    if (NT) {
      KVROPE_CUDA_REQUIRE(cudaMemcpy(pos.get(), host_pos.data(), NT * sizeof(Pos), cudaMemcpyHostToDevice));
      KVROPE_CUDA_REQUIRE(cudaMemcpy(slots.get(), host_slots.data(), NT * 8, cudaMemcpyHostToDevice));
    }
    flag = DeviceBuffer<int>(1);
    uint64_t seed = c.seed * 1000;
    for (DeviceBuffer<T>* b : {&q, &q_nope, &kv, &table}) fill_random(*b, ++seed);
    fill_random(table_f32, ++seed);
    params = make_params();
  }

  template <typename Uniform>
  void make_slots(Uniform&& uniform) {
    const int64_t NT = cfg.tokens;
    host_pos.assign(static_cast<size_t>(NT), Pos{0});
    host_slots.assign(static_cast<size_t>(NT), -1);
    std::vector<int64_t> perm(static_cast<size_t>(num_slots));
    for (int64_t s = 0; s < num_slots; ++s) perm[s] = s;
    for (int64_t s = num_slots - 1; s > 0; --s) std::swap(perm[s], perm[uniform(0, s)]);
    const int64_t pool = NT / 3 + 1;
    for (int64_t t = 0; t < NT; ++t) {
      int64_t p = uniform(0, max_position - 1), s = perm[t];
      switch (cfg.slots) {
        case Slots::kDistinct: break;
        case Slots::kPadding:
          if (uniform(0, 3) == 0) s = -1;
          break;
        case Slots::kRepeats:
          s = perm[uniform(0, pool - 1)];
          if (uniform(0, 4) == 0) p = uniform(0, 1) ? max_position : -1;
          break;
        case Slots::kBad: {
          const int64_t r = uniform(0, 9);
          if (r == 0) s = num_slots + uniform(0, 100);
          if (r == 1) s = -1 - uniform(0, 5);
          if (r == 2) p = max_position + uniform(0, 1000);
          if (r == 3) p = -1 - uniform(0, 1000);
          if (r == 4) s = num_slots, p = max_position;  // both: the position's bit is required, the slot's allowed
          break;
        }
      }
      host_pos[static_cast<size_t>(t)] = static_cast<Pos>(p);
      host_slots[static_cast<size_t>(t)] = s;
    }
  }

  MlaAppendParams<T, C, Pos> make_params() {
    const MlaConfig& c = cfg;
    const int64_t N = c.nope_dim, R = c.rotary_dim, L = c.latent_dim, o = c.offset;
    MlaAppendParams<T, C, Pos> p{};
    p.tokens = c.tokens;
    p.query_heads = c.query_heads;
    p.nope_dim = N;
    p.rotary_dim = R;
    p.latent_dim = L;
    p.style = c.style;
    if (q.get()) {
      p.query_pe = {q.get() + o + (c.fused_q ? N : 0), q_tok, q_head};
      if (c.fused_q)
        p.query_nope = {q.get() + o, q_tok, q_head};
      else if (q_nope.get())
        p.query_nope = {q_nope.get() + o, nope_tok, nope_head};
    }
    if (q_out.get()) p.query_out = {q_out.get() + o, out_tok, out_head};
    if (q_out8.get()) p.query_out_fp8 = {q_out8.get() + o, out_tok, out_head};
    p.write_query_nope = c.q_nope();
    p.query_scale = q_scale.get();
    p.kv_c = kv.get() + o;
    p.kv_c_stride = kv_row;
    p.k_pe = kv.get() + o + L;
    p.k_pe_stride = kv_row;
    p.positions = pos.get();
    p.cos_sin_cache = table.get() ? table.get() + o : nullptr;
    p.cos_sin_cache_f32 = table_f32.get() ? table_f32.get() + o : nullptr;
    p.max_position = max_position;
    if (c.split) {
      p.latent_cache = {ckv.get() + o, lat_page, lat_off};
      p.rope_cache = {kpe.get() + o, rope_page, rope_off};
    } else {
      p.latent_cache = {cache.get() + o, lat_page, lat_off};
      p.rope_cache = {cache.get() + o + L, rope_page, rope_off};
    }
    p.page_size = c.page_size;
    p.num_pages = num_pages;
    p.slot_mapping = slots.get();
    p.kv_scale = kv_scale.get();
    p.error_flag = flag.get();
    p.enable_pdl = c.launch == Launch::kPdl;
    return p;
  }

  //! 0xFF bytes (NaN in T and in both fp8 formats) in every output buffer; the flag zeroed.
  void poison_outputs() {
    poison(q_out);
    poison(q_out8);
    poison(cache);
    poison(ckv);
    poison(kpe);
    KVROPE_CUDA_REQUIRE(cudaMemset(flag.get(), 0, sizeof(int)));
  }

  Snapshot<T, C> snapshot() const {
    Snapshot<T, C> s;
    s.q = q.to_host(), s.q_nope = q_nope.to_host(), s.q_out = q_out.to_host(), s.kv = kv.to_host();
    s.table = table.to_host(), s.table_f32 = table_f32.to_host(), s.q_out8 = q_out8.to_host();
    s.cache = cache.to_host(), s.ckv = ckv.to_host(), s.kpe = kpe.to_host();
    return s;
  }

  //! The reference's arguments over the host copies `s` taken before the call.
  reference::MlaHostArgs<T, C, Pos> host_args(const Snapshot<T, C>& s) const {
    const MlaConfig& c = cfg;
    const int64_t N = c.nope_dim, R = c.rotary_dim, L = c.latent_dim, o = c.offset;
    reference::MlaHostArgs<T, C, Pos> a;
    a.tokens = c.tokens, a.query_heads = c.query_heads, a.nope_dim = N, a.rotary_dim = R, a.latent_dim = L;
    a.style = c.style;
    if (!s.q.empty()) {
      a.query_pe = s.q.data() + o + (c.fused_q ? N : 0);
      a.query_pe_token_stride = q_tok, a.query_pe_head_stride = q_head;
      a.query_nope = c.fused_q ? s.q.data() + o : s.q_nope.empty() ? nullptr : s.q_nope.data() + o;
      a.query_nope_token_stride = nope_tok, a.query_nope_head_stride = nope_head;
    }
    if (!s.q_out.empty()) a.query_out = s.q_out.data() + o;
    if (!s.q_out8.empty()) a.query_out_fp8 = s.q_out8.data() + o;
    a.query_out_token_stride = out_tok, a.query_out_head_stride = out_head;
    a.write_query_nope = c.q_nope();
    a.query_scale = q_scale.get() ? &host_q_scale : nullptr;
    a.kv_c = s.kv.data() + o, a.kv_c_stride = kv_row;
    a.k_pe = s.kv.data() + o + L, a.k_pe_stride = kv_row;
    a.cos_sin_cache = s.table.empty() ? nullptr : s.table.data() + o;
    a.cos_sin_cache_f32 = s.table_f32.empty() ? nullptr : s.table_f32.data() + o;
    a.max_position = max_position;
    a.positions = host_pos.data();
    a.slot_mapping = host_slots.data();
    a.num_pages = num_pages, a.page_size = c.page_size;
    if (c.split)
      a.caches = {{s.ckv.data() + o, lat_page, lat_off}, {s.kpe.data() + o, rope_page, rope_off}};
    else
      a.caches = {{s.cache.data() + o, lat_page, lat_off}, {s.cache.data() + o + L, rope_page, rope_off}};
    a.kv_scale = kv_scale.get() ? &host_kv_scale : nullptr;
    return a;
  }

  Status launch(cudaStream_t stream = nullptr) const { return mla_append(params, stream); }

  //! Launches as cfg.launch asks (a graph: captured, instantiated, launched once) and waits.
  void launch_and_wait() {
    Status st;
    if (cfg.launch == Launch::kGraph) {
      cudaStream_t stream = nullptr;
      KVROPE_CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph = nullptr;
      KVROPE_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      st = launch(stream);
      KVROPE_CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec = nullptr;
      KVROPE_CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
      KVROPE_CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
      KVROPE_CUDA_REQUIRE(cudaStreamSynchronize(stream));
      KVROPE_CUDA_REQUIRE(cudaGraphExecDestroy(exec));
      KVROPE_CUDA_REQUIRE(cudaGraphDestroy(graph));
      KVROPE_CUDA_REQUIRE(cudaStreamDestroy(stream));
    } else {
      st = launch();
    }
    INFO("status " << to_string(st.code) << " field " << (st.field ? st.field : "-"));
    REQUIRE(st.ok());
    KVROPE_CUDA_REQUIRE(cudaGetLastError());
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  }

  //! Checks every element of every output buffer against the reference computed from `before`.
  void check(const Snapshot<T, C>& before) {
    INFO(cfg.describe());
    const Snapshot<T, C> after = snapshot();
    const reference::MlaHostArgs<T, C, Pos> in = host_args(before);
    const reference::MlaGold g = reference::cpu_mla(in);
    const MlaConfig& c = cfg;
    const int64_t NT = c.tokens, Hq = c.query_heads, N = c.nope_dim, R = c.rotary_dim, L = c.latent_dim;
    const int64_t o = c.offset;
    const float qs = in.query_scale ? *in.query_scale : 1.0f;
    [[maybe_unused]] const float ks = in.kv_scale ? *in.kv_scale : 1.0f;

    // q: each element of each row the call may write; then every element of the buffers outside them.
    Tally tq;
    std::vector<char> q_cov(after.q.size(), 0), out_cov(std::max(after.q_out.size(), after.q_out8.size()), 0);
    for (int64_t t = 0; t < NT; ++t) {
      const bool valid = reference::mla_token_valid(in, t);
      for (int64_t i = 0; i < Hq; ++i) {
        const reference::Gold* gold = &g.query[(t * Hq + i) * W];
        if (!c.q_out()) {
          // In place: q_pe's R elements; q_nope (its own buffer, or the first N of a fused row) is not written.
          const int64_t at = o + t * q_tok + i * q_head + (c.fused_q ? N : 0);
          for (int64_t d = 0; d < R; ++d) {
            q_cov[at + d] = 1;
            const T got = after.q[at + d];
            if (valid)
              tq.expect(verify::within_tolerance<T>(got, gold[N + d].value, gold[N + d].abs_sum), "q_pe", at + d,
                        to_float(got), gold[N + d].value);
            else
              tq.expect(same_bits(got, before.q[at + d]), "q_pe (invalid token)", at + d, to_float(got),
                        to_float(before.q[at + d]));
          }
          continue;
        }
        const int64_t at = o + t * out_tok + i * out_head;
        for (int64_t d = 0; d < W; ++d) {
          out_cov[at + d] = 1;
          const bool written = valid && (d >= N || c.q_nope());
          if (c.q_fp8()) {
            const uint8_t got = bits8(after.q_out8[at + d]), was = bits8(before.q_out8[at + d]);
            const double v = reference::fp8_decode(got, reference::Fp8Format::kE4M3);
            if (!written)
              tq.expect(got == was, "query_out_fp8 (unwritten)", at + d, v, was);
            else if (d < N)  // q_nope quantized as given: the reference's code
              tq.expect(got == g.query_fp8[(t * Hq + i) * W + d], "query_out_fp8 (q_nope)", at + d, v, gold[d].value);
            else
              tq.expect(verify::detail::fp8_within_tolerance<__nv_fp8_e4m3, T>(got, gold[d], qs),
                        "query_out_fp8 (RoPE(q_pe))", at + d, v, gold[d].value);
          } else {
            const T got = after.q_out[at + d];
            if (!written)
              tq.expect(same_bits(got, before.q_out[at + d]), "query_out (unwritten)", at + d, to_float(got),
                        to_float(before.q_out[at + d]));
            else if (d < N)  // a copy of q_nope, bit for bit
              tq.expect(same_bits(got, in.query_nope[t * nope_tok + i * nope_head + d]), "query_out (q_nope)", at + d,
                        to_float(got), gold[d].value);
            else
              tq.expect(verify::within_tolerance<T>(got, gold[d].value, gold[d].abs_sum), "query_out (RoPE(q_pe))",
                        at + d, to_float(got), gold[d].value);
          }
        }
      }
    }
    INFO("q: checked " << tq.checked << ", mismatches " << tq.bad << ": " << tq.first);
    CHECK(tq.bad == 0);
    expect_outside_unchanged("q", before.q, after.q, q_cov);
    expect_outside_unchanged("q_nope", before.q_nope, after.q_nope, std::vector<char>(after.q_nope.size(), 0));
    expect_outside_unchanged("kv", before.kv, after.kv, std::vector<char>(after.kv.size(), 0));
    if (c.q_fp8())
      expect_outside_unchanged("query_out_fp8", before.q_out8, after.q_out8, out_cov);
    else if (c.q_out())
      expect_outside_unchanged("query_out", before.q_out, after.q_out, out_cov);

    // The caches: each slot's L + R elements, from its writer or as before.
    Tally tc;
    const std::vector<C>& lat_after = c.split ? after.ckv : after.cache;
    const std::vector<C>& lat_before = c.split ? before.ckv : before.cache;
    const std::vector<C>& rope_after = c.split ? after.kpe : after.cache;
    const std::vector<C>& rope_before = c.split ? before.kpe : before.cache;
    std::vector<char> lat_cov(lat_after.size(), 0), rope_cov(rope_after.size(), 0);
    int64_t written_slots = 0;
    for (int64_t s = 0; s < num_slots; ++s) {
      const int64_t t = g.writer[s], page = s / c.page_size, off = s % c.page_size;
      written_slots += t >= 0;
      for (int64_t d = 0; d < L + R; ++d) {
        const bool rot = d >= L;
        const int64_t at = o + page * (rot ? rope_page : lat_page) + off * (rot ? rope_off : lat_off) +
                           (rot ? (c.split ? d - L : d) : d);
        (rot ? rope_cov : lat_cov)[at] = 1;
        const C got = (rot ? rope_after : lat_after)[at], was = (rot ? rope_before : lat_before)[at];
        const reference::Gold& gold = g.cache[s * (L + R) + d];
        const double v = reference::detail::cache_value(got);
        if (t < 0) {
          tc.expect(same_bits(got, was), "cache (unwritten slot)", at, v, reference::detail::cache_value(was));
        } else if constexpr (kIsFp8<C>) {
          const uint8_t code = bits8(got);
          if (!rot)  // kv_c quantized as given: the reference's code
            tc.expect(code == g.cache_fp8[s * (L + R) + d], "latent cache (kv_c)", at, v, gold.value);
          else
            tc.expect(verify::detail::fp8_within_tolerance<C, T>(code, gold, ks), "rope cache (RoPE(k_pe))", at, v,
                      gold.value);
        } else {
          if (!rot)  // a copy of kv_c, bit for bit
            tc.expect(same_bits(got, in.kv_c[t * kv_row + d]), "latent cache (kv_c)", at, v, gold.value);
          else
            tc.expect(verify::within_tolerance<T>(got, gold.value, gold.abs_sum), "rope cache (RoPE(k_pe))", at, v,
                      gold.value);
        }
      }
    }
    INFO("caches: checked " << tc.checked << ", mismatches " << tc.bad << ": " << tc.first);
    CHECK(tc.bad == 0);
    if (c.split) {
      expect_outside_unchanged("ckv", before.ckv, after.ckv, lat_cov);
      expect_outside_unchanged("kpe", before.kpe, after.kpe, rope_cov);
    } else {
      std::vector<char> cov(after.cache.size(), 0);
      for (size_t i = 0; i < cov.size(); ++i) cov[i] = lat_cov[i] | rope_cov[i];
      expect_outside_unchanged("cache", before.cache, after.cache, cov);
    }
    // (every call but the bad-slot ones writes some slot)
    if (c.slots != Slots::kBad && NT > 0) CHECK(written_slots > 0);

    const reference::AppendFlag want = g.error_flag;
    const int got = flag.to_host()[0];
    INFO("error flag " << got << ", required " << want.required << ", allowed " << want.allowed);
    CHECK(want.accepts(got));
  }

  //! Poisons the outputs, snapshots the inputs, launches once and checks.
  void run_and_check() {
    INFO(cfg.describe());
    poison_outputs();
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    const Snapshot<T, C> before = snapshot();
    launch_and_wait();
    check(before);
  }

  MlaPlan plan() const {
    MlaPlan p{};
    REQUIRE(plan_mla_append(params, &p).ok());
    return p;
  }
};

template <typename T, typename C>
void run_case(const MlaConfig& c) {
  if (c.pos64) {
    MlaProblem<T, C, int64_t> p(c);
    p.run_and_check();
  } else {
    MlaProblem<T, C, int32_t> p(c);
    p.run_and_check();
  }
}

// The shapes: DeepSeek-V3 / Kimi K2 (the compiled instance), a generic one on the vector path, odd ones on the
// scalar path (L not a whole number of 16-byte chunks, R not a whole number of pairs of them).
struct MlaShape {
  int64_t nope, rotary, latent;
};
constexpr MlaShape kShapes[] = {{128, 64, 512}, {64, 32, 256}, {128, 64, 511}, {24, 40, 72}};
constexpr QMode kQModes[] = {QMode::kInPlace, QMode::kOut, QMode::kOutNope, QMode::kOutFp8, QMode::kOutFp8Nope};
constexpr Slots kSlots[] = {Slots::kDistinct, Slots::kPadding, Slots::kRepeats, Slots::kBad};

void set_shape(MlaConfig& c, const MlaShape& s) {
  c.nope_dim = s.nope;
  c.rotary_dim = s.rotary;
  c.latent_dim = s.latent;
}

}  // namespace

TEMPLATE_TEST_CASE("mla append matches the float64 reference: shapes, layouts, q outputs, styles, slots", "[gpu][mla]",
                   __nv_bfloat16, __half, float) {
  using T = TestType;
  uint64_t seed = 1;
  for (const MlaShape& shape : kShapes)
    for (const bool split : {false, true})
      for (const QMode qmode : kQModes)
        for (const RotaryStyle style : {RotaryStyle::kInterleaved, RotaryStyle::kRotateHalf}) {
          MlaConfig c;
          c.seed = seed++;
          set_shape(c, shape);
          c.split = split;
          c.qmode = qmode;
          c.style = style;
          c.tokens = 5 + static_cast<int64_t>(c.seed % 37);
          c.query_heads = c.seed % 4 == 0 ? 128 : 16;
          c.fused_q = c.seed % 3 != 2;
          c.table_f32 = c.seed % 3 != 1;
          c.pos64 = c.seed % 2 == 0;
          c.page_size = c.seed % 3 == 0 ? 1 : c.seed % 3 == 1 ? 16 : 64;
          c.slots = kSlots[c.seed % 4];
          c.pad = c.seed % 5 == 0 ? 0 : 16;
          run_case<T, T>(c);
        }
}

TEMPLATE_TEST_CASE("mla append into fp8 caches: e4m3 and e5m2, kv_scale or none, saturation, every q output",
                   "[gpu][mla][fp8]", __nv_bfloat16, __half, float) {
  using T = TestType;
  uint64_t seed = 500;
  for (const MlaShape& shape : kShapes)
    for (const bool split : {false, true})
      for (const QMode qmode : kQModes) {
        MlaConfig c;
        c.seed = seed++;
        set_shape(c, shape);
        c.split = split;
        c.qmode = qmode;
        c.style = c.seed % 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
        c.tokens = 3 + static_cast<int64_t>(c.seed % 29);
        c.query_heads = c.seed % 3 == 0 ? 128 : 16;
        c.fused_q = c.seed % 2 == 0;
        c.table_f32 = c.seed % 3 != 2;
        c.pos64 = c.seed % 2 == 1;
        c.slots = kSlots[c.seed % 4];
        c.scales = c.seed % 4 != 3;
        if (c.seed % 2)
          run_case<T, __nv_fp8_e4m3>(c);
        else
          run_case<T, __nv_fp8_e5m2>(c);
      }
  // Scales small enough that many values saturate (e4m3 beyond 448, e5m2 beyond 57344), and large ones that push
  // values into the subnormals.
  for (const float magnitude : {0.004f, 1.0e-5f, 100.0f}) {
    MlaConfig c;
    c.seed = seed++;
    c.qmode = QMode::kOutFp8Nope;
    c.scale_magnitude = magnitude;
    run_case<T, __nv_fp8_e4m3>(c);
    c.split = true;
    run_case<T, __nv_fp8_e5m2>(c);
  }
}

TEST_CASE("mla append: the instance each shape takes", "[gpu][mla][plan]") {
  using T = __nv_bfloat16;
  struct Want {
    MlaShape shape;
    int64_t offset;
    int vec_width;
    bool fixed;
  };
  const Want wants[] = {{kShapes[0], 0, 8, true},
                        {kShapes[1], 0, 8, false},
                        {kShapes[2], 0, 1, false},
                        {kShapes[3], 0, 1, false},
                        {kShapes[0], 1, 1, false}};
  for (const Want& w : wants) {
    for (const bool split : {false, true})
      for (const QMode qmode : kQModes) {
        MlaConfig c;
        set_shape(c, w.shape);
        c.offset = w.offset;
        c.split = split;
        c.qmode = qmode;
        MlaProblem<T, __nv_fp8_e4m3, int64_t> p(c);
        INFO(c.describe());
        const MlaPlan plan = p.plan();
        CHECK(plan.launched);
        CHECK(plan.vec_width == w.vec_width);
        CHECK(plan.fixed_dims == w.fixed);
      }
  }
}

TEST_CASE("mla append: misaligned views take the scalar path with the same results", "[gpu][mla]") {
  uint64_t seed = 900;
  for (const MlaShape& shape : {kShapes[0], kShapes[1]})
    for (const bool split : {false, true})
      for (const QMode qmode : kQModes) {
        MlaConfig c;
        c.seed = seed++;
        set_shape(c, shape);
        c.offset = 1;
        c.pad = c.seed % 2 ? 1 : 3;
        c.split = split;
        c.qmode = qmode;
        c.style = c.seed % 2 ? RotaryStyle::kInterleaved : RotaryStyle::kRotateHalf;
        c.slots = kSlots[c.seed % 4];
        c.fused_q = c.seed % 3 != 0;
        run_case<__nv_bfloat16, __nv_bfloat16>(c);
        run_case<float, __nv_fp8_e4m3>(c);
      }
}

TEST_CASE("mla append: bad slots skip the cache, bad positions write nothing, both flagged", "[gpu][mla][slots]") {
  // Token 0: slot -1 (no cache row, q written); 1: slot past the end (flagged, q written); 2: position past
  // the table (flagged, nothing written); 3: negative position; 4 and 5: one slot, the later one's position bad
  // (so 4 writes it); 6: a valid token.
  using T = __nv_bfloat16;
  for (const QMode qmode : {QMode::kInPlace, QMode::kOutNope, QMode::kOutFp8}) {
    MlaConfig c;
    c.tokens = 7;
    c.qmode = qmode;
    MlaProblem<T, T, int64_t> p(c);
    const int64_t S = p.num_slots, M = p.max_position;
    p.host_slots = {-1, S + 3, 5, 6, 9, 9, 11};
    p.host_pos = {1, 2, M, -7, 3, M + 5, 0};
    KVROPE_CUDA_REQUIRE(cudaMemcpy(p.slots.get(), p.host_slots.data(), 7 * 8, cudaMemcpyHostToDevice));
    KVROPE_CUDA_REQUIRE(cudaMemcpy(p.pos.get(), p.host_pos.data(), 7 * 8, cudaMemcpyHostToDevice));
    p.run_and_check();
    CHECK(p.flag.to_host()[0] == (kErrorPositionIdOutOfRange | kErrorSlotOutOfRange));
    CHECK(read_error_flag(p.flag.get()).code == StatusCode::kPositionIdOutOfRange);
  }
  // Only a bad slot: the slot's bit alone.
  MlaConfig c;
  c.tokens = 3;
  MlaProblem<T, T, int32_t> p(c);
  p.host_slots = {0, p.num_slots, 2};
  KVROPE_CUDA_REQUIRE(cudaMemcpy(p.slots.get(), p.host_slots.data(), 3 * 8, cudaMemcpyHostToDevice));
  p.run_and_check();
  CHECK(p.flag.to_host()[0] == kErrorSlotOutOfRange);
}

TEST_CASE("mla append: decode and prefill sizes, Hq = 0 and 128, an empty call", "[gpu][mla]") {
  uint64_t seed = 1300;
  for (const int64_t tokens : {int64_t{1}, int64_t{4}, int64_t{700}, int64_t{3000}})
    for (const int64_t heads : {int64_t{0}, int64_t{16}, int64_t{128}}) {
      if (tokens >= 3000 && heads == 128) continue;  // (the reference's time)
      MlaConfig c;
      c.seed = seed++;
      c.tokens = tokens;
      c.query_heads = heads;
      c.qmode = kQModes[c.seed % 5];
      c.split = c.seed % 2 == 1;
      c.slots = kSlots[c.seed % 4];
      c.page_size = 64;
      run_case<__nv_bfloat16, __nv_bfloat16>(c);
      run_case<__half, __nv_fp8_e4m3>(c);
    }
  MlaConfig empty;
  empty.tokens = 0;
  MlaProblem<__nv_bfloat16, __nv_bfloat16, int64_t> p(empty);
  CHECK(!p.plan().launched);
  p.run_and_check();
}

TEST_CASE("mla append: programmatic dependent launch and graph capture give the same results", "[gpu][mla][graph]") {
  uint64_t seed = 1400;
  for (const Launch launch : {Launch::kPdl, Launch::kGraph})
    for (const MlaShape& shape : {kShapes[0], kShapes[2]}) {
      MlaConfig c;
      c.seed = seed++;
      set_shape(c, shape);
      c.launch = launch;
      c.qmode = QMode::kOutNope;
      c.slots = Slots::kRepeats;
      c.tokens = 300;
      run_case<__nv_bfloat16, __nv_bfloat16>(c);
      c.qmode = QMode::kOutFp8Nope;
      run_case<__half, __nv_fp8_e5m2>(c);
    }
}
