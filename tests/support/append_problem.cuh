// GPU test fixture of the append (docs/spec.md §6): a configuration drawn or written by a test, its device
// buffers (random normal inputs, outputs and caches poisoned with 0xFF bytes), the launch (direct or
// replayed from a CUDA graph), and the check of everything the call left against the float64 reference:
// every output row (verify::check_append; NVFP4 blocks bit for bit given the GPU's own quotients and
// reciprocals, gpu_nvfp4_oracle), every element outside the rows (padding, the gaps of a fused qkv buffer)
// unchanged, the error flag.
#pragma once

#include <kvrope/append.cuh>
#include <kvrope/reference/cpu_append.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/gpu_problem.cuh"
#include "verify/append_launchers.cuh"
#include "verify/check_append.hpp"

namespace kvrope::testing {

// One (amax, global scale) a thread: the block scale's quotient and reciprocal as the GPU computes them
// (detail::nvfp4_block_scale, the kernels' own instructions). A template: one definition in every test that
// includes this header.
template <int kUnused = 0>
__global__ void nvfp4_block_scales(const float* asked, int n, float* answers) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const detail::Nvfp4Scale s = detail::nvfp4_block_scale(asked[2 * i], asked[2 * i + 1]);
  answers[2 * i] = s.quotient;
  answers[2 * i + 1] = s.inv;
}

//! The GPU's quotients and reciprocals for check_append's NVFP4 blocks (verify::Nvfp4Oracle), from the device.
inline verify::Nvfp4Oracle gpu_nvfp4_oracle() {
  return [](const std::vector<std::array<float, 2>>& asked) {
    std::vector<reference::Nvfp4Approx> out(asked.size());
    if (asked.empty()) return out;
    const int n = static_cast<int>(asked.size());
    DeviceBuffer<float> d_asked(2 * asked.size()), d_answers(2 * asked.size());
    KVROPE_CUDA_REQUIRE(cudaMemcpy(d_asked.get(), asked.data(), 8 * asked.size(), cudaMemcpyHostToDevice));
    nvfp4_block_scales<><<<(n + 255) / 256, 256>>>(d_asked.get(), n, d_answers.get());
    KVROPE_CUDA_REQUIRE(cudaGetLastError());
    const std::vector<float> answers = d_answers.to_host();
    for (size_t i = 0; i < asked.size(); ++i) out[i] = {answers[2 * i], answers[2 * i + 1]};
    return out;
  };
}

enum class KeyWrite { kOut, kInPlace, kNone };  // key_out, key in place, or the caches only
// How tokens name slots (and, for the first two, their positions):
//   kSequences: a ragged batch of sequences, each after a context already cached, pages from a shuffled
//               page table; positions = context + i (vLLM's prefill and decode).
//   kRun:       one sequence in consecutive slots (the slots strictly increase: no repeat check).
//   kPermutation: distinct random slots, random positions.
//   kPadding:   distinct slots, the last quarter and every 7th token negative (padding).
//   kRepeats:   slots drawn from a third of the tokens' count: many repeats (the last valid one wins).
//   kOutOfRange: distinct slots, every 5th at or far above num_pages * P.
enum class SlotPattern { kSequences, kRun, kPermutation, kPadding, kRepeats, kOutOfRange };
enum class CacheKind { kNHD, kHND };
enum class Scales { kNone, kTensor, kHead };

inline const char* name(KeyWrite k) {
  const char* names[] = {"key_out", "key_in_place", "no_key_out"};
  return names[static_cast<int>(k)];
}
inline const char* name(SlotPattern s) {
  const char* names[] = {"sequences", "run", "permutation", "padding", "repeats", "out_of_range"};
  return names[static_cast<int>(s)];
}
inline const char* name(Scales s) {
  const char* names[] = {"no_scale", "scale", "scale_per_head"};
  return names[static_cast<int>(s)];
}

struct AppendConfig {
  int64_t tokens = 16, heads = 2, query_heads = 4, head_dim = 64, rotary_dim = 0;
  RotaryStyle style = RotaryStyle::kRotateHalf;
  int64_t page_size = 16;
  bool contiguous = false;  // kSequences: one page a sequence of P = S_max (a contiguous per-sequence cache)
  CacheKind k_cache = CacheKind::kNHD, v_cache = CacheKind::kNHD;
  int64_t k_pad = 0, v_pad = 0;  // extra elements after each cache row: the two caches' strides differ
  int64_t sf_pad = 0;            // NVFP4: extra bytes after each block-scale row (both caches')
  bool fused_qkv = false;        // q, k, v views of one qkv [T, (Hq + 2 H) D + token_pad]
  bool query_out = false;
  bool query_fp8 =
      false;  // q written to query_out_fp8 (excludes query_out); its scale drawn as the caches' (kNone: null)
  KeyWrite key = KeyWrite::kOut;
  bool q_norm = false, k_norm = false, plus_one = false;
  float eps = 1e-6f;
  bool table_f32 = true;
  SlotPattern slots = SlotPattern::kSequences;
  bool bad_positions = false;  // some positions at -1, max_position and beyond
  int64_t offset = 0;          // elements every pointer is moved by (odd: misaligned, the scalar path)
  int64_t token_pad = 0;       // extra elements after each token of q, k, v and the outputs
  Scales scales = Scales::kNone;
  float scale_magnitude = 1.0f;  // scales drawn in [0.3, 3] times this (small: fp8 saturates)
  bool pdl = false;              // enable_pdl: a programmatic dependent launch
  int64_t mrope[3] = {0, 0, 0};  // mRoPE sections (all zero: none): positions [3, T], three streams
  bool mrope_interleaved = false;
  int64_t stream_pad = 0;  // mRoPE: the stream stride is T + stream_pad (-T: 0, one stream read as all three)
  uint64_t seed = 1;

  bool has_mrope() const { return mrope[0] != 0 || mrope[1] != 0 || mrope[2] != 0; }

  std::string describe() const {
    std::ostringstream os;
    os << "T=" << tokens << " H=" << heads << " Hq=" << query_heads << " D=" << head_dim << " R=" << rotary_dim
       << (style == RotaryStyle::kInterleaved ? " interleaved" : " rotate-half") << " P=" << page_size
       << (contiguous ? " contiguous" : "") << " k_cache=" << (k_cache == CacheKind::kNHD ? "NHD" : "HND") << "+"
       << k_pad << " v_cache=" << (v_cache == CacheKind::kNHD ? "NHD" : "HND") << "+" << v_pad << " sf_pad=" << sf_pad
       << (fused_qkv ? " fused_qkv" : "")
       << (query_fp8   ? " query_out_fp8"
           : query_out ? " query_out"
                       : " q_in_place")
       << " " << name(key) << (q_norm ? " q_norm" : "") << (k_norm ? " k_norm" : "") << (plus_one ? " plus_one" : "")
       << " eps=" << eps << (table_f32 ? " table_f32" : " table_T") << " slots=" << name(slots)
       << (bad_positions ? " bad_positions" : "") << " offset=" << offset << " token_pad=" << token_pad << " "
       << name(scales) << "x" << scale_magnitude << (pdl ? " pdl" : "");
    if (has_mrope())
      os << " mrope=" << mrope[0] << "," << mrope[1] << "," << mrope[2]
         << (mrope_interleaved ? " interleaved" : " contiguous") << " stream_stride=" << tokens + stream_pad;
    os << " seed=" << seed;
    return os.str();
  }
};

//! The slots, positions and cache geometry of a configuration.
struct SlotPlan {
  std::vector<int64_t> slots, positions;
  int64_t page_size = 1, num_pages = 0, max_position = 1;
};

inline SlotPlan plan_slots(const AppendConfig& c, std::mt19937_64& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t T = c.tokens;
  SlotPlan s;
  s.slots.assign(static_cast<size_t>(T), -1);
  s.positions.assign(static_cast<size_t>(T), 0);
  if (c.slots == SlotPattern::kSequences || c.slots == SlotPattern::kRun) {
    const int64_t B = c.slots == SlotPattern::kRun || T <= 1 ? 1 : uniform(1, std::min<int64_t>(T, 8));
    std::vector<int64_t> cuts{0, T};  // B lengths summing to T, each positive
    while (static_cast<int64_t>(cuts.size()) < B + 1) {
      const int64_t cut = uniform(1, std::max<int64_t>(T - 1, 1));
      if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end()) cuts.push_back(cut);
    }
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> context(static_cast<size_t>(B)), length(static_cast<size_t>(B));
    int64_t longest = 1;
    for (int64_t b = 0; b < B; ++b) {
      context[b] = uniform(0, 40);
      length[b] = cuts[b + 1] - cuts[b];
      longest = std::max(longest, context[b] + length[b]);
    }
    s.page_size = c.contiguous ? longest : c.page_size;
    const int64_t P = s.page_size;
    std::vector<int64_t> first_page(static_cast<size_t>(B));
    int64_t pages = 0;
    for (int64_t b = 0; b < B; ++b) first_page[b] = pages, pages += (context[b] + length[b] + P - 1) / P;
    s.num_pages = pages + 2;  // two pages no token writes
    std::vector<int64_t> page_table(static_cast<size_t>(s.num_pages));
    std::iota(page_table.begin(), page_table.end(), 0);
    if (c.slots == SlotPattern::kSequences) std::shuffle(page_table.begin(), page_table.end(), rng);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < length[b]; ++i) {
        const int64_t t = cuts[b] + i, pos = context[b] + i;
        s.positions[t] = pos;
        s.slots[t] = page_table[first_page[b] + pos / P] * P + pos % P;
      }
    s.max_position = longest + 3;
  } else {
    s.page_size = c.page_size;
    s.num_pages = (T + T / 4 + 1 + s.page_size - 1) / s.page_size + 1;
    const int64_t slots = s.num_pages * s.page_size;
    s.max_position = T + 5;
    for (auto& p : s.positions) p = uniform(0, s.max_position - 1);
    std::vector<int64_t> all(static_cast<size_t>(slots));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), T, s.slots.begin());
    for (int64_t t = 0; t < T; ++t) {
      if (c.slots == SlotPattern::kPadding && (t >= T - T / 4 || t % 7 == 3)) s.slots[t] = -1 - t % 3;
      if (c.slots == SlotPattern::kRepeats) s.slots[t] = uniform(0, std::max<int64_t>(T / 3, 1) - 1);
      if (c.slots == SlotPattern::kOutOfRange && t % 5 == 2)
        s.slots[t] = t % 3 == 0 ? slots : t % 3 == 1 ? slots + 7 : int64_t{1} << 40;
    }
    if (c.slots == SlotPattern::kRepeats && T > 1) s.slots[T - 1] = s.slots[0];
  }
  if (c.bad_positions)
    for (int64_t t = 0; t < T; ++t)
      if (t % 6 == 1) s.positions[t] = t % 4 == 1 ? -1 : t % 4 == 3 ? s.max_position : s.max_position + 1000;
  return s;
}

//! With mRoPE, positions [3, T] laid out `stride` apart (0: one stream read as all three), gaps holding -3 (a
//! position out of range: a wrong stride shows). Stream 0 is `s.positions`; streams 1 and 2 hold its value
//! (a text token) or a random one in range (an image or video token). A token whose stream-0 position is out
//! of range (bad_positions) moves that value to stream t / 6 % 3 and gets valid ones in the others.
inline std::vector<int64_t> mrope_positions(const SlotPlan& s, int64_t stride, std::mt19937_64& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t T = static_cast<int64_t>(s.positions.size());
  if (stride == 0) return s.positions;
  std::vector<int64_t> out(static_cast<size_t>(2 * stride + T), -3);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = s.positions[t];
    const bool bad = p < 0 || p >= s.max_position;
    for (int j = 0; j < 3; ++j) {
      int64_t v = j == 0 || uniform(0, 2) == 0 ? p : uniform(0, s.max_position - 1);
      if (bad) v = j == t / 6 % 3 ? p : uniform(0, s.max_position - 1);
      out[j * stride + t] = v;
    }
  }
  return out;
}

//! Host copies of a problem's buffers (before or after a call).
template <typename T, typename C>
struct AppendSnapshot {
  std::vector<T> q, k, v, qkv, q_out, k_out, table, q_weight, k_weight;
  std::vector<float> table_f32;
  std::vector<C> kc, vc;
  std::vector<__nv_fp8_e4m3> q_out8, ks, vs;  // (ks, vs: NVFP4's block scales)
};

//! The same view over a host copy of the device buffer it points into (null stays null).
template <typename View, typename U>
View rebase(View view, const DeviceBuffer<U>& buf, std::vector<U>& host) {
  if (view.data != nullptr) view.data = host.data() + (view.data - buf.get());
  return view;
}
template <typename U>
const U* rebase_ptr(const U* p, const DeviceBuffer<U>& buf, std::vector<U>& host) {
  return p ? host.data() + (p - buf.get()) : nullptr;
}

// Marks in `covered` the elements of `rows` rows of `len` elements at base + sum_i index_i stride_i.
inline void mark_rows(std::vector<char>& covered, int64_t base, std::initializer_list<std::pair<int64_t, int64_t>> dims,
                      int64_t len) {
  std::vector<std::pair<int64_t, int64_t>> d(dims);
  std::vector<int64_t> idx(d.size(), 0);
  for (auto& e : d)
    if (e.first == 0) return;
  for (;;) {
    int64_t o = base;
    for (size_t i = 0; i < d.size(); ++i) o += idx[i] * d[i].second;
    for (int64_t e = 0; e < len; ++e) covered[static_cast<size_t>(o + e)] = 1;
    size_t i = d.size();
    while (i > 0 && ++idx[i - 1] == d[i - 1].first) idx[--i] = 0;
    if (i == 0) return;
  }
}

// Every element no row covers is bit-identical before and after the call.
template <typename U>
void expect_outside_unchanged(const char* name, const std::vector<U>& before, const std::vector<U>& after,
                              const std::vector<char>& covered) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < before.size(); ++i)
    if (!covered[i] && std::memcmp(&before[i], &after[i], sizeof(U)) != 0 && bad++ == 0)
      first = static_cast<int64_t>(i);
  INFO(name << ": " << bad << " elements outside every row changed, the first at " << first);
  CHECK(bad == 0);
}

template <typename T, typename C, typename Pos>
struct AppendProblem {
  AppendConfig cfg;
  SlotPlan plan;
  int64_t R = 0;
  DeviceBuffer<T> q, k, v, qkv, q_out, k_out, table, q_weight, k_weight;
  DeviceBuffer<float> table_f32, k_scale, v_scale, q_scale;
  DeviceBuffer<C> kc, vc;
  DeviceBuffer<__nv_fp8_e4m3> q_out8, ks, vs;  // (ks, vs: NVFP4's block scales)
  DeviceBuffer<Pos> pos;
  DeviceBuffer<int64_t> slots;
  DeviceBuffer<int> flag;
  std::vector<Pos> host_pos;
  std::vector<float> host_k_scale, host_v_scale, host_q_scale;
  AppendParams<T, C, Pos> params;  // over the device buffers

  const DeviceBuffer<T>& q_buf() const { return cfg.fused_qkv ? qkv : q; }
  const DeviceBuffer<T>& k_buf() const { return cfg.fused_qkv ? qkv : k; }
  const DeviceBuffer<T>& v_buf() const { return cfg.fused_qkv ? qkv : v; }
  int64_t token_row(int64_t heads) const { return heads * cfg.head_dim + cfg.token_pad; }
  int64_t qkv_row() const { return token_row(cfg.query_heads + 2 * cfg.heads); }
  // A cache row's elements of C (NVFP4: D / 2 bytes), then `pad` more; a block-scale row's D / 16 bytes.
  int64_t cache_row_len(int64_t pad) const { return (kIsNvfp4<C> ? cfg.head_dim / 2 : cfg.head_dim) + pad; }
  int64_t scale_row_len() const { return cfg.head_dim / 16 + cfg.sf_pad; }
  int64_t stream_stride() const { return cfg.has_mrope() ? cfg.tokens + cfg.stream_pad : 0; }

  template <typename U>
  PagedCache<U> paged_view(U* data, CacheKind kind, int64_t row) const {
    const int64_t P = plan.page_size, H = cfg.heads;
    if (data == nullptr) return {};
    return kind == CacheKind::kNHD ? PagedCache<U>{data + cfg.offset, P * H * row, H * row, row}
                                   : PagedCache<U>{data + cfg.offset, H * P * row, row, P * row};
  }
  PagedCache<C> cache_view(C* data, CacheKind kind, int64_t pad) const {
    return paged_view(data, kind, cache_row_len(pad));
  }
  size_t paged_size(int64_t row) const {
    return static_cast<size_t>(cfg.offset + plan.num_pages * plan.page_size * cfg.heads * row);
  }
  size_t cache_size(int64_t pad) const { return paged_size(cache_row_len(pad)); }

  explicit AppendProblem(const AppendConfig& c) : cfg(c) {
    const int64_t N = c.tokens, H = c.heads, Hq = c.query_heads, D = c.head_dim, o = c.offset;
    std::mt19937_64 rng(c.seed);
    plan = plan_slots(c, rng);
    R = effective_rotary_dim(c.rotary_dim, D);
    auto tokens_of = [&](int64_t heads) { return static_cast<size_t>(N ? o + N * token_row(heads) : 0); };
    if (c.fused_qkv) {
      qkv = DeviceBuffer<T>(static_cast<size_t>(N ? o + N * qkv_row() : 0));
    } else {
      q = DeviceBuffer<T>(Hq ? tokens_of(Hq) : 0);
      k = DeviceBuffer<T>(H ? tokens_of(H) : 0);
      v = DeviceBuffer<T>(H ? tokens_of(H) : 0);
    }
    if (c.query_fp8)
      q_out8 = DeviceBuffer<__nv_fp8_e4m3>(Hq ? tokens_of(Hq) : 0);
    else if (c.query_out)
      q_out = DeviceBuffer<T>(Hq ? tokens_of(Hq) : 0);
    if (c.query_fp8 && Hq > 0 && c.scales != Scales::kNone) {  // (no q rows: no fp8 q, so no scale)
      host_q_scale.push_back(std::uniform_real_distribution<float>(0.3f, 3.0f)(rng) * c.scale_magnitude);
      q_scale = DeviceBuffer<float>(1);
      KVROPE_CUDA_REQUIRE(cudaMemcpy(q_scale.get(), host_q_scale.data(), 4, cudaMemcpyHostToDevice));
    }
    if (c.key == KeyWrite::kOut) k_out = DeviceBuffer<T>(H ? tokens_of(H) : 0);
    kc = DeviceBuffer<C>(H ? cache_size(c.k_pad) : 0);
    vc = DeviceBuffer<C>(H ? cache_size(c.v_pad) : 0);
    if constexpr (kIsNvfp4<C>) {
      ks = DeviceBuffer<__nv_fp8_e4m3>(H ? paged_size(scale_row_len()) : 0);
      vs = DeviceBuffer<__nv_fp8_e4m3>(H ? paged_size(scale_row_len()) : 0);
    }
    const size_t table_len = static_cast<size_t>(o + plan.max_position * R);
    if (c.table_f32)
      table_f32 = DeviceBuffer<float>(table_len);
    else
      table = DeviceBuffer<T>(table_len);
    if (c.q_norm) q_weight = DeviceBuffer<T>(static_cast<size_t>(o + D));
    if (c.k_norm) k_weight = DeviceBuffer<T>(static_cast<size_t>(o + D));
    const std::vector<int64_t> positions = c.has_mrope() ? mrope_positions(plan, stream_stride(), rng) : plan.positions;
    host_pos.assign(positions.begin(), positions.end());
    pos = DeviceBuffer<Pos>(host_pos.size());
    slots = DeviceBuffer<int64_t>(static_cast<size_t>(N));
    flag = DeviceBuffer<int>(1);
    if (N) {
      KVROPE_CUDA_REQUIRE(
          cudaMemcpy(pos.get(), host_pos.data(), host_pos.size() * sizeof(Pos), cudaMemcpyHostToDevice));
      KVROPE_CUDA_REQUIRE(cudaMemcpy(slots.get(), plan.slots.data(), N * sizeof(int64_t), cudaMemcpyHostToDevice));
    }
    if constexpr (kIsQuantized<C>) {
      if (c.scales != Scales::kNone) {
        const int64_t n = c.scales == Scales::kHead ? H : 1;
        std::uniform_real_distribution<float> u(0.3f, 3.0f);
        for (int64_t i = 0; i < n; ++i) host_k_scale.push_back(u(rng) * c.scale_magnitude);
        for (int64_t i = 0; i < n; ++i) host_v_scale.push_back(u(rng) * c.scale_magnitude);
        k_scale = DeviceBuffer<float>(static_cast<size_t>(n));
        v_scale = DeviceBuffer<float>(static_cast<size_t>(n));
        KVROPE_CUDA_REQUIRE(cudaMemcpy(k_scale.get(), host_k_scale.data(), n * 4, cudaMemcpyHostToDevice));
        KVROPE_CUDA_REQUIRE(cudaMemcpy(v_scale.get(), host_v_scale.data(), n * 4, cudaMemcpyHostToDevice));
      }
    }
    params = make_params();
    fill_inputs(c.seed * 1000003u);
  }

  AppendParams<T, C, Pos> make_params() {
    const int64_t H = cfg.heads, Hq = cfg.query_heads, D = cfg.head_dim, o = cfg.offset;
    AppendParams<T, C, Pos> p;
    p.tokens = cfg.tokens;
    p.heads = H;
    p.query_heads = Hq;
    p.head_dim = D;
    p.rotary_dim = cfg.rotary_dim;
    p.style = cfg.style;
    auto view = [&](const DeviceBuffer<T>& buf, int64_t token_stride, int64_t first) {
      return buf.get() ? TokenHeads<T>{buf.get() + o + first, token_stride, D} : TokenHeads<T>{};
    };
    if (cfg.fused_qkv) {
      p.query = Hq ? view(qkv, qkv_row(), 0) : TokenHeads<T>{};
      p.key = view(qkv, qkv_row(), Hq * D);
      p.value = view(qkv, qkv_row(), (Hq + H) * D);
    } else {
      p.query = view(q, token_row(Hq), 0);
      p.key = view(k, token_row(H), 0);
      p.value = view(v, token_row(H), 0);
    }
    if (H == 0) {
      p.key = {};
      p.value = {};
    }
    p.query_out = view(q_out, token_row(Hq), 0);
    if (q_out8.get()) p.query_out_fp8 = {q_out8.get() + o, token_row(Hq), D};
    p.query_scale = q_scale.get();
    p.key_out = view(k_out, token_row(H), 0);
    p.key_in_place = cfg.key == KeyWrite::kInPlace;
    p.positions = pos.get();
    p.cos_sin_cache = table.get() ? table.get() + o : nullptr;
    p.cos_sin_cache_f32 = table_f32.get() ? table_f32.get() + o : nullptr;
    p.max_position = plan.max_position;
    p.query_norm_weight = q_weight.get() ? q_weight.get() + o : nullptr;
    p.key_norm_weight = k_weight.get() ? k_weight.get() + o : nullptr;
    p.norm_eps = cfg.eps;
    p.norm_weight_plus_one = cfg.plus_one;
    p.key_cache = cache_view(kc.get(), cfg.k_cache, cfg.k_pad);
    p.value_cache = cache_view(vc.get(), cfg.v_cache, cfg.v_pad);
    p.key_block_scales = paged_view(ks.get(), cfg.k_cache, scale_row_len());
    p.value_block_scales = paged_view(vs.get(), cfg.v_cache, scale_row_len());
    p.page_size = plan.page_size;
    p.num_pages = plan.num_pages;
    p.slot_mapping = slots.get();
    p.key_scale = k_scale.get();
    p.value_scale = v_scale.get();
    p.scale_per_head = cfg.scales == Scales::kHead;
    p.error_flag = flag.get();
    p.enable_pdl = cfg.pdl;
    for (int j = 0; j < 3; ++j) p.mrope_section[j] = cfg.mrope[j];
    p.mrope_interleaved = cfg.mrope_interleaved;
    p.position_stream_stride = stream_stride();
    return p;
  }

  //! New random normal inputs (same buffers): q, k, v (or qkv), the table cache, the norm weights.
  void fill_inputs(uint64_t seed) {
    for (DeviceBuffer<T>* b : {&q, &k, &v, &qkv, &table, &q_weight, &k_weight}) fill_random(*b, ++seed);
    fill_random(table_f32, ++seed);
  }
  //! 0xFF bytes (NaN in T and in both fp8 formats) in every output and cache; the flag zeroed.
  void poison_outputs() {
    poison(q_out);
    poison(q_out8);
    poison(k_out);
    poison(kc);
    poison(vc);
    poison(ks);
    poison(vs);
    KVROPE_CUDA_REQUIRE(cudaMemset(flag.get(), 0, sizeof(int)));
  }
  AppendSnapshot<T, C> snapshot() const {
    AppendSnapshot<T, C> s;
    s.q = q.to_host(), s.k = k.to_host(), s.v = v.to_host(), s.qkv = qkv.to_host();
    s.q_out = q_out.to_host(), s.k_out = k_out.to_host(), s.q_out8 = q_out8.to_host();
    s.table = table.to_host(), s.table_f32 = table_f32.to_host();
    s.q_weight = q_weight.to_host(), s.k_weight = k_weight.to_host();
    s.kc = kc.to_host(), s.vc = vc.to_host();
    s.ks = ks.to_host(), s.vs = vs.to_host();
    return s;
  }

  std::vector<T>& host_of(AppendSnapshot<T, C>& s, const DeviceBuffer<T>& buf) const {
    if (&buf == &qkv) return s.qkv;
    if (&buf == &q) return s.q;
    if (&buf == &k) return s.k;
    return s.v;
  }

  //! The call's parameters over a snapshot's host copies (the reference's input, from `before`).
  AppendParams<T, C, Pos> host_params(AppendSnapshot<T, C>& s) {
    AppendParams<T, C, Pos> p = params;
    p.query = rebase(p.query, q_buf(), host_of(s, q_buf()));
    p.key = rebase(p.key, k_buf(), host_of(s, k_buf()));
    p.value = rebase(p.value, v_buf(), host_of(s, v_buf()));
    p.query_out = rebase(p.query_out, q_out, s.q_out);
    p.query_out_fp8 = rebase(p.query_out_fp8, q_out8, s.q_out8);
    p.query_scale = host_q_scale.empty() ? nullptr : host_q_scale.data();
    p.key_out = rebase(p.key_out, k_out, s.k_out);
    p.cos_sin_cache = rebase_ptr(p.cos_sin_cache, table, s.table);
    p.cos_sin_cache_f32 = rebase_ptr(p.cos_sin_cache_f32, table_f32, s.table_f32);
    p.query_norm_weight = rebase_ptr(p.query_norm_weight, q_weight, s.q_weight);
    p.key_norm_weight = rebase_ptr(p.key_norm_weight, k_weight, s.k_weight);
    p.key_cache = rebase(p.key_cache, kc, s.kc);
    p.value_cache = rebase(p.value_cache, vc, s.vc);
    p.key_block_scales = rebase(p.key_block_scales, ks, s.ks);
    p.value_block_scales = rebase(p.value_block_scales, vs, s.vs);
    p.positions = host_pos.data();
    p.slot_mapping = plan.slots.data();
    p.key_scale = host_k_scale.empty() ? nullptr : host_k_scale.data();
    p.value_scale = host_v_scale.empty() ? nullptr : host_v_scale.data();
    p.error_flag = nullptr;
    return p;
  }

  //! Launches the call on `stream` (no synchronization).
  Status launch(cudaStream_t stream = nullptr) const { return AppendLaunchers<T, C, Pos>::append(params, stream); }

  //! Checks what the call left on the device against the reference computed from `before`.
  void check(AppendSnapshot<T, C>& before) {
    INFO(cfg.describe());
    AppendSnapshot<T, C> after = snapshot();
    const AppendParams<T, C, Pos> in = host_params(before);
    const AppendParams<T, C, Pos> now = host_params(after);
    verify::AppendOutputs<T, C> out;
    out.query = now.query;
    out.query_out = now.query_out;
    out.query_out_fp8 = now.query_out_fp8;
    out.key = now.key;
    out.key_out = now.key_out;
    out.value = now.value;
    out.key_cache = {now.key_cache.data, now.key_cache.page_stride, now.key_cache.offset_stride,
                     now.key_cache.head_stride};
    out.value_cache = {now.value_cache.data, now.value_cache.page_stride, now.value_cache.offset_stride,
                       now.value_cache.head_stride};
    out.key_block_scales = {now.key_block_scales.data, now.key_block_scales.page_stride,
                            now.key_block_scales.offset_stride, now.key_block_scales.head_stride};
    out.value_block_scales = {now.value_block_scales.data, now.value_block_scales.page_stride,
                              now.value_block_scales.offset_stride, now.value_block_scales.head_stride};
    const verify::CheckResult r = verify::check_append(in, out, gpu_nvfp4_oracle());
    INFO("checked " << r.checked << ", mismatches " << r.mismatches << ": " << r.first_mismatch);
    CHECK(r.ok());
    const int64_t N = cfg.tokens, H = cfg.heads, Hq = cfg.query_heads, D = cfg.head_dim;
    CHECK((r.checked > 0 || N == 0 || H + Hq == 0));

    // Nothing outside the rows changed: padding after tokens and cache rows, the fused buffer's gaps (and
    // v, which has no output rows, not at all).
    struct Rows {
      const T* data;
      int64_t token_stride, head_stride, heads;
    };
    auto rows = [](const auto& view, int64_t heads) {
      return Rows{view.data, view.token_stride, view.head_stride, heads};
    };
    auto covered = [&](const DeviceBuffer<T>& buf, std::initializer_list<Rows> views) {
      std::vector<char> cov(buf.size(), 0);
      for (const Rows& r : views)
        if (r.data) mark_rows(cov, r.data - buf.get(), {{N, r.token_stride}, {r.heads, r.head_stride}}, D);
      return cov;
    };
    if (cfg.fused_qkv) {
      expect_outside_unchanged("qkv", before.qkv, after.qkv,
                               covered(qkv, {rows(params.query, Hq), rows(params.key, H), rows(params.value, H)}));
    } else {
      expect_outside_unchanged("query", before.q, after.q, covered(q, {rows(params.query, Hq)}));
      expect_outside_unchanged("key", before.k, after.k, covered(k, {rows(params.key, H)}));
      expect_outside_unchanged("value", before.v, after.v, covered(v, {}));
    }
    expect_outside_unchanged("query_out", before.q_out, after.q_out, covered(q_out, {rows(params.query_out, Hq)}));
    expect_outside_unchanged("key_out", before.k_out, after.k_out, covered(k_out, {rows(params.key_out, H)}));
    {
      std::vector<char> cov(q_out8.size(), 0);
      if (params.query_out_fp8.data)
        mark_rows(cov, params.query_out_fp8.data - q_out8.get(),
                  {{N, params.query_out_fp8.token_stride}, {Hq, params.query_out_fp8.head_stride}}, D);
      expect_outside_unchanged("query_out_fp8", before.q_out8, after.q_out8, cov);
    }
    for (int which = 0; which < 2; ++which) {
      const PagedCache<C>& c = which ? params.value_cache : params.key_cache;
      const DeviceBuffer<C>& buf = which ? vc : kc;
      std::vector<char> cov(buf.size(), 0);
      if (c.data)
        mark_rows(cov, c.data - buf.get(),
                  {{plan.num_pages, c.page_stride}, {plan.page_size, c.offset_stride}, {H, c.head_stride}},
                  cache_row_len(0));
      expect_outside_unchanged(which ? "value_cache" : "key_cache", which ? before.vc : before.kc,
                               which ? after.vc : after.kc, cov);
      const PagedCache<__nv_fp8_e4m3>& sf = which ? params.value_block_scales : params.key_block_scales;
      const DeviceBuffer<__nv_fp8_e4m3>& sf_buf = which ? vs : ks;
      std::vector<char> sf_cov(sf_buf.size(), 0);
      if (sf.data)
        mark_rows(sf_cov, sf.data - sf_buf.get(),
                  {{plan.num_pages, sf.page_stride}, {plan.page_size, sf.offset_stride}, {H, sf.head_stride}}, D / 16);
      expect_outside_unchanged(which ? "value_block_scales" : "key_block_scales", which ? before.vs : before.ks,
                               which ? after.vs : after.ks, sf_cov);
    }

    const reference::AppendFlag want = reference::expected_append_flag(in);
    const int got = flag.to_host()[0];
    INFO("error flag " << got << ", required " << want.required << ", allowed " << want.allowed);
    CHECK(want.accepts(got));
  }

  //! Poisons the outputs, snapshots the inputs, launches once and checks.
  void run_and_check() {
    INFO(cfg.describe());
    poison_outputs();
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    AppendSnapshot<T, C> before = snapshot();
    const Status st = launch();
    INFO("status " << to_string(st.code) << " field " << (st.field ? st.field : "-"));
    REQUIRE(st.ok());
    KVROPE_CUDA_REQUIRE(cudaGetLastError());
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    check(before);
  }
};

//! Builds, runs and checks one configuration (`C` may be kvrope::nvfp4_e2m1x2: NVFP4 caches).
template <typename T, typename C, typename Pos>
void run_append_case(const AppendConfig& c) {
  AppendProblem<T, C, Pos> p(c);
  p.run_and_check();
}

}  // namespace kvrope::testing
