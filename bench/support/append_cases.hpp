// The cases of the serve suites (--suite=serve-decode|serve-prefill; docs/benchmarks.md, "Serve suites"):
// generated here rather than read from a table. bench/flashinfer_compare.py builds the same cases (ids,
// page tables, positions) with the same generator; keep the two in step.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvrope_bench {

enum class AppendCache { kBf16, kFp8E4m3, kNvfp4 };
// NHD and HND: pages [pages, P, H, D] and [pages, H, P, D]; kLatentRow: the MLA cases' one cache of rows [L + R]
// (vLLM's concat_and_cache_mla layout, [pages, P, L + R]).
enum class AppendLayout { kNhd, kHnd, kLatentRow };

inline const char* append_cache_name(AppendCache c) {
  return c == AppendCache::kBf16 ? "bf16" : c == AppendCache::kFp8E4m3 ? "fp8_e4m3" : "nvfp4";
}
inline const char* append_layout_name(AppendLayout l) {
  return l == AppendLayout::kNhd ? "NHD" : l == AppendLayout::kHnd ? "HND" : "L+R";
}
// The cache column of the tables and labels: the cache's type, with "+q8" where q is written in fp8 too and
// "+mrope" where the positions are mRoPE's [3, T].
inline const char* append_cache_label(AppendCache c, bool query_fp8, bool mrope = false) {
  if (query_fp8) return "fp8_e4m3+q8";
  if (mrope) return c == AppendCache::kBf16 ? "bf16+mrope" : "mrope";
  return append_cache_name(c);
}

// The groups of cases a serve suite's summary keeps apart: the cases its geomeans have always covered (bf16 and
// fp8 caches, the q-fp8 cases), and each group appended since, with summary lines of its own (so that the
// first group's lines compare with runs from before the others existed).
enum class AppendGroup { kBase, kNvfp4, kMrope, kMla };

// The MLA cases (docs/spec.md §6.6, kvrope::mla_append): DeepSeek-V2/V3's and Kimi K2's latent rows, L = 512
// (kv_c) and R = 64 (k_pe, q_pe; interleaved pairs, DeepSeek's checkpoints), at Hq = 16 (DeepSeek-V3's 128 heads
// over 8 ranks) and 128 (all of them). bf16 cases: q [T, Hq, N + R] with N = 128 (the query as projected, before
// the absorption of W_UK: vLLM's layout), q_pe rotated in place. q-fp8 cases (fp8 e4m3 cache): q [T, Hq, N + R]
// with N = L = 512 (q_nope absorbed, as attention reads it), written whole to query_out_fp8 [T, Hq, N + R] (q_nope
// quantized beside RoPE(q_pe): FlashInfer's fp8 MLA kernel's work), q left as it was.
constexpr int64_t kMlaQueryHeads[] = {16, 128};
constexpr int64_t kMlaLatentDim = 512, kMlaRotaryDim = 64;
constexpr int64_t kMlaNopeDim = 128, kMlaNopeDimFp8 = 512;
// The fp8 latent cache's per-tensor scale (stored = fp8_satfinite(x / scale), both parts): unlike q's
// (kAppendQueryScale), so that a swap shows; N(0, 1) rows / 0.015 stay inside e4m3's 448.
constexpr float kMlaKvScale = 0.015f;

struct AppendCase {
  int id = 0;
  bool decode = true;
  int64_t seqs = 0;            // sequences of the ragged batch
  int64_t tokens_per_seq = 0;  // new tokens of each sequence (1 for decode)
  int64_t s_max = 0;           // slots each sequence owns: s_max / page_size pages
  int64_t query_heads = 0;     // Hq
  int64_t heads = 0;           // H, KV heads
  int64_t head_dim = 0;        // D = R (rotate-half over the whole head)
  int64_t page_size = 16;
  int64_t max_position = 0;  // rows of the fp32 table cache
  AppendCache cache = AppendCache::kBf16;
  AppendLayout layout = AppendLayout::kNhd;
  // The q-fp8 cases (fp8 caches only): kvrope writes RoPE(q) to AppendParams::query_out_fp8 [T, Hq, D] as
  // fp8_satfinite(x / kAppendQueryScale), what fp8 attention reads, q left as it was; else q is rotated in place.
  bool query_fp8 = false;
  // The mRoPE cases (bf16 caches only): positions [3, T] (temporal, height, width; append_tokens), pairs split
  // in Qwen2-VL's contiguous sections scaled to R (mrope_sections: {16, 24, 24} at R = 128); `twin` is the id of
  // the same case with ordinary positions [T].
  bool mrope = false;
  int twin = 0;
  // The MLA cases (mla; kMlaQueryHeads and the rest above): one latent "head" a token, heads 1, head_dim R; rows
  // [L + R] of kv_c and RoPE(k_pe) in one cache (layout kLatentRow); cache kBf16 (q_pe in place), or kFp8E4m3
  // with query_fp8 (q written to query_out_fp8 in e4m3, kAppendQueryScale; the cache under kMlaKvScale).
  bool mla = false;
  int64_t latent_dim = 0;  // L
  int64_t nope_dim = 0;    // N: q_nope's dims, beside q_pe's R in a row of q

  int64_t tokens() const { return seqs * tokens_per_seq; }
  int64_t pages_per_seq() const { return s_max / page_size; }
  int64_t pages() const { return seqs * pages_per_seq(); }
  int64_t cache_elem_bytes() const { return cache == AppendCache::kBf16 ? 2 : 1; }  // bf16, fp8 (not NVFP4)
  int64_t query_out_elem_bytes() const { return query_fp8 ? 1 : 2; }                // the rotated q as written
  const char* cache_label() const {
    if (mla) return query_fp8 ? "mla_fp8+q8" : "mla_bf16";
    return append_cache_label(cache, query_fp8, mrope);
  }
  AppendGroup group() const {
    if (mla) return AppendGroup::kMla;
    return cache == AppendCache::kNvfp4 ? AppendGroup::kNvfp4 : mrope ? AppendGroup::kMrope : AppendGroup::kBase;
  }
  int64_t rotary_dim() const { return head_dim; }  // R (= D: rotate-half over the whole head; MLA: q_pe's, k_pe's)
  // An NVFP4 row in bytes: D / 2 of codes (two e2m1 a byte) and its block scales, D / 16 (one e4m3 a block of 16).
  int64_t nvfp4_code_bytes() const { return head_dim / 2; }
  int64_t nvfp4_scale_bytes() const { return head_dim / 16; }
  // Qwen2-VL's mrope_section {16, 24, 24} (of R / 2 = 64 pairs) scaled to this case's R = D: s0 = R / 8,
  // s1 = 3 R / 16, s2 the rest of R / 2.
  void mrope_sections(int64_t (&s)[3]) const {
    s[0] = head_dim / 8;
    s[1] = 3 * head_dim / 16;
    s[2] = head_dim / 2 - s[0] - s[1];
  }
  // "8x512", "T=256": the shape, for tables.
  std::string shape() const {
    return decode ? "T=" + std::to_string(seqs) : std::to_string(seqs) + "x" + std::to_string(tokens_per_seq);
  }
};

constexpr int64_t kAppendSmax = 4096;  // a sequence's slots (prefill: at least its tokens)
constexpr int64_t kAppendDecodeBatches[] = {1, 8, 32, 128, 256, 1024};
constexpr std::pair<int64_t, int64_t> kAppendPrefillShapes[] = {{8, 512}, {1, 2048}, {4, 1024}, {1, 8192}};
constexpr int64_t kAppendQueryHeads[] = {32, 64};
// The fp8 caches' per-tensor scales (stored = fp8_satfinite(x / scale)): k and v differ, so that a swap shows.
constexpr float kAppendKeyScale = 0.0125f, kAppendValueScale = 0.015f;
// The q-fp8 cases' per-tensor query scale (query_out_fp8 = fp8_satfinite(RoPE(q) / scale)): unlike k's and v's,
// so that a swap shows; N(0, 1) rows / 0.02 stay well inside e4m3's 448.
constexpr float kAppendQueryScale = 0.02f;

//! Every case of a serve suite, numbered from 1: shapes in the order above, then Hq (32, 64), the cache (bf16,
//! fp8 e4m3), the layout (NHD, HND). H = 8 and D = 128 unless heads / head_dim (> 0) override them. Then, after
//! all of them (so that the ids above never change), every fp8-cache case again in the same order with q written
//! in fp8 (query_fp8): decode 49-72, prefill 33-48. Then the NVFP4 caches (shapes, Hq, layout in the same order:
//! decode 73-96, prefill 49-64), then every bf16-cache case of the first pass again with mRoPE positions (mrope,
//! twin its id: decode 97-120, prefill 65-80). Then the MLA cases (mla): shapes in the order above, then Hq (16, 128),
//! the cache (bf16, fp8 e4m3 with q in fp8): decode 121-144, prefill 81-96; their sizes are fixed (--heads and
//! --head_dim leave them).
inline std::vector<AppendCase> append_case_table(bool decode, int64_t heads = 0, int64_t head_dim = 0) {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  if (decode) {
    for (int64_t b : kAppendDecodeBatches) shapes.emplace_back(b, 1);
  } else {
    for (const auto& s : kAppendPrefillShapes) shapes.push_back(s);
  }
  std::vector<AppendCase> cases;
  // The next case of `seqs` sequences of `len` tokens: its id, its shape, its cache's length.
  auto shaped = [&](int64_t seqs, int64_t len) {
    AppendCase c;
    c.id = static_cast<int>(cases.size()) + 1;
    c.decode = decode;
    c.seqs = seqs;
    c.tokens_per_seq = len;
    c.s_max = len > kAppendSmax ? (len + c.page_size - 1) / c.page_size * c.page_size : kAppendSmax;
    c.max_position = c.s_max;
    return c;
  };
  for (const auto& [seqs, len] : shapes) {
    for (int64_t hq : kAppendQueryHeads) {
      for (AppendCache cache : {AppendCache::kBf16, AppendCache::kFp8E4m3}) {
        for (AppendLayout layout : {AppendLayout::kNhd, AppendLayout::kHnd}) {
          AppendCase c = shaped(seqs, len);
          c.query_heads = hq;
          c.heads = heads > 0 ? heads : 8;
          c.head_dim = head_dim > 0 ? head_dim : 128;
          c.cache = cache;
          c.layout = layout;
          cases.push_back(c);
        }
      }
    }
  }
  // The q-fp8 cases: the fp8-cache cases again, q written in fp8 (FlashInfer's fused fp8 kernel's work).
  const size_t first_pass = cases.size();
  for (size_t i = 0; i < first_pass; ++i) {
    if (cases[i].cache != AppendCache::kFp8E4m3) continue;
    AppendCase c = cases[i];
    c.id = static_cast<int>(cases.size()) + 1;
    c.query_fp8 = true;
    cases.push_back(c);
  }
  // The NVFP4 cases: the bf16-cache cases' shapes, Hq and layouts with NVFP4 caches.
  for (size_t i = 0; i < first_pass; ++i) {
    if (cases[i].cache != AppendCache::kBf16) continue;
    AppendCase c = cases[i];
    c.id = static_cast<int>(cases.size()) + 1;
    c.cache = AppendCache::kNvfp4;
    cases.push_back(c);
  }
  // The mRoPE cases: the bf16-cache cases again, positions [3, T], each beside its twin in the summary.
  for (size_t i = 0; i < first_pass; ++i) {
    if (cases[i].cache != AppendCache::kBf16) continue;
    AppendCase c = cases[i];
    c.id = static_cast<int>(cases.size()) + 1;
    c.mrope = true;
    c.twin = cases[i].id;
    cases.push_back(c);
  }
  // The MLA cases: the same shapes, page tables and positions (append_tokens), one latent row a token.
  for (const auto& [seqs, len] : shapes) {
    for (int64_t hq : kMlaQueryHeads) {
      for (const bool fp8 : {false, true}) {
        AppendCase c = shaped(seqs, len);
        c.query_heads = hq;
        c.heads = 1;
        c.head_dim = kMlaRotaryDim;
        c.cache = fp8 ? AppendCache::kFp8E4m3 : AppendCache::kBf16;
        c.layout = AppendLayout::kLatentRow;
        c.query_fp8 = fp8;
        c.mla = true;
        c.latent_dim = kMlaLatentDim;
        c.nope_dim = fp8 ? kMlaNopeDimFp8 : kMlaNopeDim;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

//! Least bytes an MLA call moves (docs/spec.md §6.6), a token: Hq query heads of q_nope (N) and q_pe (R), kv_c
//! (L) and k_pe (R) in 2 bytes, the cache's element ce (2 bf16, 1 fp8), q's written element qe (1: the q-fp8
//! cases):
//!   q_pe read                                       2 Hq R
//!   q in place (bf16 cases): q_pe written           2 Hq R
//!   q out (q-fp8 cases): q_nope read, rows written  2 Hq N + qe Hq (N + R)
//!   kv_c and k_pe read                              2 (L + R)
//!   the latent row written                          ce (L + R)
//!   one fp32 row of the table cache (cos | sin)     4 R
//!   the position and the slot (int64)               8 + 8
//! (the scales, a float each a call, are not counted). Hq 16: 6,672 bf16, 29,648 q-fp8; Hq 128: 35,344, 223,184.
inline double mla_bytes(const AppendCase& c) {
  const double hq = static_cast<double>(c.query_heads), r = static_cast<double>(c.rotary_dim());
  const double n = static_cast<double>(c.nope_dim), l = static_cast<double>(c.latent_dim);
  const double ce = static_cast<double>(c.cache_elem_bytes()), qe = static_cast<double>(c.query_out_elem_bytes());
  const double q = 2 * hq * r + (c.query_fp8 ? 2 * hq * n + qe * hq * (n + r) : 2 * hq * r);
  const double per_token = q + 2 * (l + r) + ce * (l + r) + 4 * r + 16;
  return per_token * static_cast<double>(c.tokens());
}

//! Least bytes a call moves (docs/spec.md §6.5), q, k and v of 2 bytes: q read and written (Hq D, written in 2
//! bytes, or 1 for the q-fp8 cases), k and v read (2 H D), the cache rows written (2 H D in the cache's element;
//! NVFP4: 2 H (D / 2 + D / 16), the codes and the block scales), one fp32 row of the table cache (4 D; with
//! mRoPE the R / 2 pairs' cos and sin come from three rows, as many bytes), the position and the slot (8 + 8;
//! mRoPE: three positions, 24 + 8) a token; key_written (k rotated in place) adds H D. The MLA cases': mla_bytes.
inline double append_bytes(const AppendCase& c, bool key_written) {
  if (c.mla) return mla_bytes(c);  // no k to write back: key_written changes nothing
  const double hq = static_cast<double>(c.query_heads), h = static_cast<double>(c.heads);
  const double d = static_cast<double>(c.head_dim), ce = static_cast<double>(c.cache_elem_bytes());
  const double qe = static_cast<double>(c.query_out_elem_bytes());
  const double cache_rows = c.cache == AppendCache::kNvfp4
                                ? 2 * h * static_cast<double>(c.nvfp4_code_bytes() + c.nvfp4_scale_bytes())
                                : ce * (2 * h * d);
  const double per_token = (2 + qe) * (hq * d) + 2 * (2 * h * d) + cache_rows + 4 * d + 16 + (c.mrope ? 16 : 0) +
                           (key_written ? 2 * h * d : 0);
  return per_token * static_cast<double>(c.tokens());
}

//! The generator both the bench and flashinfer_compare.py use: splitmix64 steps, below(n) = next() % n.
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

//! A case's page table and tokens: the pages 0..pages()-1 shuffled (Fisher-Yates, a seed per shape) and
//! dealt out in order, pages_per_seq() a sequence, so that slots do not grow with the token as a real
//! allocator's do not; decode writes each sequence at a random length below s_max, prefill at 0..L-1.
//! The mRoPE cases' positions [3, T] (stream j of token t at j T + t): the temporal stream is the token's
//! position p (its twin's), the height stream p / 2, the width stream max_position - 1 - p, so that a token's
//! pairs read three table rows (all in [0, max_position)). No draw of the generator: the page table, positions
//! and slots are the twin's.
struct AppendTokens {
  std::vector<int64_t> page_table;  // [seqs, pages_per_seq]
  std::vector<int64_t> positions;   // [tokens]: the position in its sequence, also the table row (mRoPE: [3, T])
  std::vector<int64_t> slots;       // [tokens]: page_table[b][pos / P] * P + pos % P
};

inline AppendTokens append_tokens(const AppendCase& c, uint64_t seed) {
  SplitMix rng{seed + 1000003ull * static_cast<uint64_t>(c.seqs) + static_cast<uint64_t>(c.tokens_per_seq)};
  const int64_t pages = c.pages(), pps = c.pages_per_seq(), P = c.page_size;
  AppendTokens out;
  out.page_table.resize(static_cast<size_t>(pages));
  for (int64_t i = 0; i < pages; ++i) out.page_table[static_cast<size_t>(i)] = i;
  for (int64_t i = pages - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(out.page_table[static_cast<size_t>(i)], out.page_table[static_cast<size_t>(j)]);
  }
  for (int64_t b = 0; b < c.seqs; ++b) {
    for (int64_t i = 0; i < c.tokens_per_seq; ++i) {
      const int64_t pos = c.decode ? static_cast<int64_t>(rng.below(static_cast<uint64_t>(c.s_max))) : i;
      out.positions.push_back(pos);
      out.slots.push_back(out.page_table[static_cast<size_t>(b * pps + pos / P)] * P + pos % P);
    }
  }
  if (c.mrope) {  // streams 1 and 2 after stream 0 (the positions above)
    const size_t T = out.positions.size();
    for (size_t t = 0; t < T; ++t) out.positions.push_back(out.positions[t] / 2);
    for (size_t t = 0; t < T; ++t) out.positions.push_back(c.max_position - 1 - out.positions[t]);
  }
  return out;
}

}  // namespace kvrope_bench
