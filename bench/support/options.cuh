// kvrope_bench's own options (docs/benchmarks.md, "Flags"); Google Benchmark's --benchmark_* flags
// pass through untouched.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "verify/launch_policy.cuh"

#include "cases.hpp"

#ifndef KVROPE_BENCH_CASES_CSV  // CMake passes the source tree's table
#define KVROPE_BENCH_CASES_CSV "bench/sol_execbench_062_cases.csv"
#endif
#ifndef KVROPE_BENCH_DECODE_CASES_CSV  // the table of --suite=decode
#define KVROPE_BENCH_DECODE_CASES_CSV "bench/forward_decode_cases.csv"
#endif
#ifndef KVROPE_BENCH_SUITES_DIR  // where the tables of --suite=positions, heads, head-dims, dtypes are
#define KVROPE_BENCH_SUITES_DIR "bench"
#endif

namespace kvrope_bench {

enum class Variant { kNaive, kFused, kInPlace };
constexpr Variant kAllVariants[] = {Variant::kNaive, Variant::kFused, Variant::kInPlace};

inline const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kNaive: return "naive";
    case Variant::kFused: return "fused";
    case Variant::kInPlace: return "inplace";
  }
  return "?";
}

// --suite: the backward on the leaderboard's cases (the default) or on another table of cases
// (positions, heads, head-dims, dtypes), a forward suite, or a serve suite (the serving forward).
enum class Suite {
  kLeaderboard,
  kPositions,
  kHeads,
  kHeadDims,
  kDtypes,
  kForward,
  kDecode,
  kStyles,
  kServeDecode,
  kServePrefill
};
constexpr Suite kAllSuites[] = {Suite::kLeaderboard, Suite::kPositions,   Suite::kHeads,  Suite::kHeadDims,
                                Suite::kDtypes,      Suite::kForward,     Suite::kDecode, Suite::kStyles,
                                Suite::kServeDecode, Suite::kServePrefill};

inline const char* suite_name(Suite s) {
  switch (s) {
    case Suite::kLeaderboard: return "leaderboard";
    case Suite::kPositions: return "positions";
    case Suite::kHeads: return "heads";
    case Suite::kHeadDims: return "head-dims";
    case Suite::kDtypes: return "dtypes";
    case Suite::kForward: return "forward";
    case Suite::kDecode: return "decode";
    case Suite::kStyles: return "styles";
    case Suite::kServeDecode: return "serve-decode";
    case Suite::kServePrefill: return "serve-prefill";
  }
  return "?";
}

// Whether a suite times the forward op (else the backward's variants: fused, inplace, naive).
inline bool forward_suite(Suite s) { return s == Suite::kForward || s == Suite::kDecode || s == Suite::kStyles; }

// Whether a suite times the serving forward, kv_cache_rope_append (docs/spec.md §6), on the cases of
// support/append_cases.hpp (generated, no table).
inline bool append_suite(Suite s) { return s == Suite::kServeDecode || s == Suite::kServePrefill; }

// The case table a suite reads unless --cases_csv names another (bench/suite_*.csv: per-case H, D, and
// the optional columns dtype and positions).
inline const char* suite_cases_csv(Suite s) {
  switch (s) {
    case Suite::kPositions: return KVROPE_BENCH_SUITES_DIR "/suite_positions.csv";
    case Suite::kHeads: return KVROPE_BENCH_SUITES_DIR "/suite_heads.csv";
    case Suite::kHeadDims: return KVROPE_BENCH_SUITES_DIR "/suite_head_dims.csv";
    case Suite::kDtypes: return KVROPE_BENCH_SUITES_DIR "/suite_dtypes.csv";
    case Suite::kDecode: return KVROPE_BENCH_DECODE_CASES_CSV;
    default: return KVROPE_BENCH_CASES_CSV;
  }
}

// The variants of the forward suites: the fused forward and its naive reference (forward, decode), and the
// fused forward in three rotary conventions (styles): rotate-half and interleaved with R = D, rotate-half R = D/2.
enum class FwdVariant { kFwd, kFwdNaive, kHalf, kInterleaved, kHalfR64 };

inline const char* fwd_variant_name(FwdVariant v) {
  switch (v) {
    case FwdVariant::kFwd: return "fwd";
    case FwdVariant::kFwdNaive: return "fwd_naive";
    case FwdVariant::kHalf: return "half";
    case FwdVariant::kInterleaved: return "interleaved";
    case FwdVariant::kHalfR64: return "half_r64";
  }
  return "?";
}

// The variants of the serve suites: kv_cache_rope_append with k read only (FlashInfer's fused kernels'
// work) and with k rotated in place (vLLM's), and the naive two launches (which rotate k in place). pair and
// pair_pdl, only when --variants names them: a bandwidth-bound kernel writing qkv (as the QKV projection
// before the append), then kvrope, without and with enable_pdl (a programmatic dependent launch).
enum class AppendVariant { kKvrope, kKvropeKeyInPlace, kPair, kPairPdl, kNaive };

inline const char* append_variant_name(AppendVariant v) {
  switch (v) {
    case AppendVariant::kKvrope: return "kvrope";
    case AppendVariant::kKvropeKeyInPlace: return "kvrope_kip";
    case AppendVariant::kPair: return "pair";
    case AppendVariant::kPairPdl: return "pair_pdl";
    case AppendVariant::kNaive: return "naive";
  }
  return "?";
}

// A tuning flag: the LaunchPolicy field it sets (an int, a 0/1 switch or a real) and its least value.
// (Member pointers through aliases: nvcc's host code otherwise trips -Wparentheses.)
using Policy = kvrope::experimental::LaunchPolicy;
using PolicyInt = int Policy::*;
using PolicyBool = bool Policy::*;
using PolicyReal = double Policy::*;
struct TuningFlag {
  const char* name;
  PolicyInt count;
  PolicyBool on;
  PolicyReal real;
  double min;
};

inline const TuningFlag* tuning_flag(const std::string& key) {
  using P = Policy;
  static const TuningFlag flags[] = {
      {"--block", &P::block_threads, nullptr, nullptr, 32},
      {"--blocks_per_sm", &P::blocks_per_sm, nullptr, nullptr, 1},
      {"--token_weight", nullptr, nullptr, &P::token_warp_weight, 0},
      {"--bulk", nullptr, &P::bulk_copy, nullptr, 0},
      {"--bulk_stages", &P::bulk_stages, nullptr, nullptr, 2},
      {"--bulk_slack", &P::bulk_store_slack, nullptr, nullptr, 1},
      {"--bulk_chunk", &P::bulk_chunk_bytes, nullptr, nullptr, 4096},
      {"--bulk_min_chunks", &P::bulk_min_chunks_per_block, nullptr, nullptr, 0},
      {"--bulk_spec", &P::bulk_speculate_chunks, nullptr, nullptr, 0},
      {"--spec_rounds", &P::bulk_speculate_mask_rounds, nullptr, nullptr, 1},
      {"--share_min", &P::bulk_share_min_chunks_per_block, nullptr, nullptr, 0},
      {"--decode_mib", &P::decode_copy_max_mib, nullptr, nullptr, 0},
      {"--decode_block", &P::decode_block_threads, nullptr, nullptr, 64},
  };
  for (const TuningFlag& f : flags)
    if (key == f.name) return &f;
  return nullptr;
}

struct Options {
  std::vector<int> cases;  // empty: every row of the table
  std::string cases_csv = KVROPE_BENCH_CASES_CSV;
  std::string positions = "arange";  // arange, random or wrap; a table's positions column overrides it
  std::string dtype = "bf16";        // a table's dtype column overrides it
  int64_t head_dim = 0;              // 0: the table's
  int64_t heads = 0;                 // 0: the table's
  int64_t iters = 100;
  int64_t warmup = 3;
  bool check = true;
  bool cupti = true;  // --clock=events: CUDA events only, for runs under a profiler (ncu, nsys)
  bool primer = true;
  bool naive_first = false;  // --naive_first=1: each case's naive reference first
  bool flush_reads = false;  // --flush=read: the diagnostic flush by reads (clean lines in L2)
  bool workspace = true;     // the fused variant gets a workspace (BackwardParams::workspace)
  std::vector<Variant> variants{kAllVariants, kAllVariants + 3};
  Suite suite = Suite::kLeaderboard;
  std::vector<FwdVariant> fwd_variants;        // --variants of a forward suite (after parsing: the suite's, selected)
  std::vector<AppendVariant> append_variants;  // --variants of a serve suite (after parsing: selected)
  std::string json_path = "kvrope_bench_results.json";
  uint64_t seed = 20261129;
  int64_t host_calls = 2000;  // serve suites: calls of the host-time measurement (0: none)
  bool list_cases = false;    // --list_cases: print the selected cases and exit (no device needed)
  // The tuning flags given, in order. None: the plain launcher (the device's own policy).
  std::vector<std::pair<const TuningFlag*, double>> tuning;
  bool tuned() const { return !tuning.empty(); }
};

// A case's dtype and positions: its table's columns, else the options'.
inline const std::string& dtype_of(const LeaderboardCase& lc, const Options& o) {
  return lc.dtype.empty() ? o.dtype : lc.dtype;
}
inline const std::string& positions_of(const LeaderboardCase& lc, const Options& o) {
  return lc.positions.empty() ? o.positions : lc.positions;
}

// The order of the variants within a case: the naive reference last (or first, with --naive_first).
// Run just before them it slowed the in-place variant by 3 % (docs/performance-log.md #19).
inline const Variant (&variant_order(const Options& opt))[3] {
  static constexpr Variant naive_last[] = {Variant::kFused, Variant::kInPlace, Variant::kNaive};
  return opt.naive_first ? kAllVariants : naive_last;
}

// Whether --variants asked for v.
inline bool selected(const Options& opt, Variant v) {
  return std::find(opt.variants.begin(), opt.variants.end(), v) != opt.variants.end();
}

// The variants of a forward suite in the order they run within a case: fwd_naive last (first with --naive_first).
inline std::vector<FwdVariant> fwd_variant_order(const Options& opt) {
  using V = FwdVariant;
  if (opt.suite == Suite::kStyles) return {V::kHalf, V::kInterleaved, V::kHalfR64};
  if (!forward_suite(opt.suite)) return {};
  return opt.naive_first ? std::vector<V>{V::kFwdNaive, V::kFwd} : std::vector<V>{V::kFwd, V::kFwdNaive};
}

inline bool fwd_selected(const Options& opt, FwdVariant v) {
  return std::find(opt.fwd_variants.begin(), opt.fwd_variants.end(), v) != opt.fwd_variants.end();
}

// The variants of a serve suite in the order they run within a case: naive last (first with --naive_first).
inline std::vector<AppendVariant> append_variant_order(const Options& opt) {
  using V = AppendVariant;
  return opt.naive_first ? std::vector<V>{V::kNaive, V::kKvrope, V::kKvropeKeyInPlace, V::kPair, V::kPairPdl}
                         : std::vector<V>{V::kKvrope, V::kKvropeKeyInPlace, V::kPair, V::kPairPdl, V::kNaive};
}

inline bool append_selected(const Options& opt, AppendVariant v) {
  return std::find(opt.append_variants.begin(), opt.append_variants.end(), v) != opt.append_variants.end();
}

// The policy of the tuned calls: the device's default with the flags' fields changed.
inline Policy tuned_policy(const Options& opt, int cc_major) {
  Policy p = kvrope::experimental::default_policy(cc_major);
  for (const auto& [flag, v] : opt.tuning) {
    if (flag->count) p.*flag->count = static_cast<int>(v);
    if (flag->on) p.*flag->on = v != 0;
    if (flag->real) p.*flag->real = v;
  }
  return p;
}

inline void print_usage() {
  std::printf(
      "kvrope_bench options (besides Google Benchmark's --benchmark_*):\n"
      "  --suite=NAME                leaderboard (default): the backward on the case table; positions, heads,\n"
      "                              head-dims, dtypes: the backward on " KVROPE_BENCH_SUITES_DIR
      "/suite_NAME.csv\n"
      "                              (head-dims: suite_head_dims.csv; rows with their own H, D, dtype, positions);\n"
      "                              forward: the forward on the case table, fwd and fwd_naive; decode: the\n"
      "                              forward on " KVROPE_BENCH_DECODE_CASES_CSV
      ";\n"
      "                              styles: the forward on the case table, half, interleaved, half_r64;\n"
      "                              serve-decode, serve-prefill: the serving forward (kv_cache_rope_append) on\n"
      "                              generated paged-cache cases, kvrope, kvrope_kip, naive)\n"
      "  --cases=1,4,8-12            subset of the case table, ids and ranges (default: all; serve suites: their\n"
      "                              case ids)\n"
      "  --cases_csv=PATH            the case table (default " KVROPE_BENCH_CASES_CSV
      ")\n"
      "  --variants=fused,inplace,naive  (default: all three; each case's naive reference runs last, see "
      "--naive_first)\n"
      "                              forward and decode: fwd,fwd_naive; styles: half,interleaved,half_r64;\n"
      "                              serve-decode and serve-prefill: kvrope,kvrope_kip,naive (default), pair,pair_pdl\n"
      "  --dtype=bf16|fp16|fp32      (default bf16)\n"
      "  --heads=N --head_dim=N      override the table's H and D (8 and 128 in every row)\n"
      "  --positions=arange|random|wrap  cache_position = arange(S); S distinct random rows of S_max in random\n"
      "                              order; or one run of S rows that wraps past the cache's end\n"
      "  --iters=N                   timed calls per case and variant (default 100; the protocol wants >= 50)\n"
      "  --warmup=N                  untimed calls before the timed ones (default 3)\n"
      "  --workspace=0|1             pass the fused variant a workspace (default 1; 0: each block copies a fixed "
      "share;\n"
      "                              leaderboard suite only)\n"
      "  --clock=events              time with CUDA events only (no CUPTI): for runs under ncu or nsys\n"
      "  --no_check                  skip the check against the CPU float64 reference (serve suites: against\n"
      "                              the naive reference, once a case and kvrope variant)\n"
      "  --seed=N                    seed of the random inputs\n"
      "  --flush=write|read          the L2 flush writes its buffer (default: the protocol's) or reads it\n"
      "                              (diagnostic: no dirty lines for the call to write back)\n"
      "  --naive_first=1             each case's naive reference before its fused variants (default: after;\n"
      "                              run just before, it slowed the in-place variant)\n"
      "  --primer=0                  no primer kernel between the flush and the call (diagnostic: CUPTI's\n"
      "                              per-flush setup then lands on the call's first launch)\n"
      "  --kvrope_json=PATH          per-case results (default kvrope_bench_results.json)\n"
      "  --host_calls=N              serve suites: the host time of one kv_cache_rope_append call and of an\n"
      "                              empty kernel's launch, median of N calls each (default 2000; 0: skip)\n"
      "  --list_cases                print the suite's cases (--cases selects) with their bytes and exit; no GPU\n"
      "                              needed (serve suites: every group, MLA included)\n"
      "Tuning (kvrope::experimental::LaunchPolicy; any of them: the device's default_policy with those fields;\n"
      "leaderboard suite only):\n"
      "  --block=N                   block_threads (fused kernel block)\n"
      "  --blocks_per_sm=N           blocks_per_sm (resident fused blocks per SM)\n"
      "  --token_weight=X            token_warp_weight (register copy: the warp split; 0 or less: the default)\n"
      "  --bulk=0|1                  bulk_copy (0: the register copy path)\n"
      "  --bulk_stages=N             bulk_stages (32 KiB stages of the bulk-copy ring)\n"
      "  --bulk_slack=N              bulk_store_slack (stores still reading their stage)\n"
      "  --bulk_chunk=BYTES          bulk_chunk_bytes (most bytes of a chunk of the bulk copy)\n"
      "  --bulk_min_chunks=N         bulk_min_chunks_per_block (0: 32 KiB chunks always)\n"
      "  --bulk_spec=N               bulk_speculate_chunks (chunks loaded before the bitmask)\n"
      "  --spec_rounds=N             bulk_speculate_mask_rounds (speculate when the bitmask takes <= N rounds)\n"
      "  --share_min=N               bulk_share_min_chunks_per_block (share chunks above N a block)\n"
      "  --decode_mib=N              decode_copy_max_mib (S = 1 out of place: the decode kernel up to N MiB)\n"
      "  --decode_block=N            decode_block_threads (the decode kernel's block)\n");
}

[[noreturn]] inline void bad_option(const std::string& arg, const char* why) {
  std::fprintf(stderr, "kvrope_bench: %s: %s\n", arg.c_str(), why);
  print_usage();
  std::exit(2);
}

inline int64_t parse_int(const std::string& arg, const std::string& text, int64_t lo) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == nullptr || *end != '\0' || v < lo) bad_option(arg, "expected an integer");
  return v;
}

inline std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// Reads our flags and removes them from argv, so benchmark::Initialize sees only its own.
inline Options parse_options(int* argc, char** argv) {
  Options opt;
  int kept = 1;
  std::string variants_arg, backward_only, append_only;
  bool cases_csv_given = false;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? std::string() : arg.substr(eq + 1);
    if (key == "--cases") {
      opt.cases.clear();
      for (const auto& p : split_commas(value)) {  // (ids, or ranges A-B)
        const size_t dash = p.find('-', 1);
        const int64_t first = parse_int(arg, p.substr(0, dash), 1);
        const int64_t last = dash == std::string::npos ? first : parse_int(arg, p.substr(dash + 1), first);
        for (int64_t id = first; id <= last; ++id) opt.cases.push_back(static_cast<int>(id));
      }
    } else if (key == "--cases_csv") {
      if (value.empty()) bad_option(arg, "expected a path");
      opt.cases_csv = value;
      cases_csv_given = true;
    } else if (key == "--variants") {
      variants_arg = arg;  // read once the suite is known
    } else if (key == "--suite") {
      const auto* s =
          std::find_if(std::begin(kAllSuites), std::end(kAllSuites), [&](Suite x) { return value == suite_name(x); });
      if (s == std::end(kAllSuites))
        bad_option(arg,
                   "suites are leaderboard, positions, heads, head-dims, dtypes, forward, decode, styles, "
                   "serve-decode, serve-prefill");
      opt.suite = *s;
    } else if (key == "--dtype") {
      if (!valid_dtype(value)) bad_option(arg, "dtype is bf16, fp16 or fp32");
      opt.dtype = value;
    } else if (key == "--positions") {
      if (!valid_positions(value)) bad_option(arg, "positions are arange, random or wrap");
      opt.positions = value;
    } else if (key == "--head_dim") {
      opt.head_dim = parse_int(arg, value, 2);
      if (opt.head_dim % 2 != 0) bad_option(arg, "head_dim must be even");
    } else if (key == "--heads") {
      opt.heads = parse_int(arg, value, 1);
    } else if (key == "--iters") {
      opt.iters = parse_int(arg, value, 1);
    } else if (key == "--warmup") {
      opt.warmup = parse_int(arg, value, 0);
    } else if (key == "--seed") {
      opt.seed = static_cast<uint64_t>(parse_int(arg, value, 0));
    } else if (key == "--flush") {
      if (value != "write" && value != "read") bad_option(arg, "the flush is write or read");
      opt.flush_reads = value == "read";
    } else if (key == "--naive_first") {
      opt.naive_first = parse_int(arg, value, 0) != 0;
    } else if (key == "--primer") {
      opt.primer = parse_int(arg, value, 0) != 0;
    } else if (key == "--workspace") {
      opt.workspace = parse_int(arg, value, 0) != 0;
      backward_only = arg;
    } else if (const TuningFlag* flag = tuning_flag(key)) {
      backward_only = arg;
      if (flag->real) {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0') bad_option(arg, "expected a number");
        if (v > 0) opt.tuning.emplace_back(flag, v);  // 0 or less leaves the default
      } else {
        opt.tuning.emplace_back(flag, static_cast<double>(parse_int(arg, value, static_cast<int64_t>(flag->min))));
      }
    } else if (key == "--no_check") {
      opt.check = false;
    } else if (key == "--clock") {
      if (value != "cupti" && value != "events") bad_option(arg, "expected cupti or events");
      opt.cupti = value == "cupti";
    } else if (key == "--host_calls") {
      opt.host_calls = parse_int(arg, value, 0);
      append_only = arg;
    } else if (key == "--list_cases") {
      opt.list_cases = true;
    } else if (key == "--kvrope_json") {
      if (value.empty()) bad_option(arg, "expected a path");
      opt.json_path = value;
    } else {
      if (key == "--help" || key == "-h") print_usage();
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  const size_t eq = variants_arg.find('=');
  const std::string variants = eq == std::string::npos ? std::string() : variants_arg.substr(eq + 1);
  if (!cases_csv_given) opt.cases_csv = suite_cases_csv(opt.suite);
  if (!append_only.empty() && !append_suite(opt.suite)) bad_option(append_only, "a flag of the serve suites only");
  if (!forward_suite(opt.suite) && !append_suite(opt.suite)) {
    if (!variants_arg.empty()) {
      opt.variants.clear();
      for (const auto& p : split_commas(variants)) {
        const auto* v = std::find_if(std::begin(kAllVariants), std::end(kAllVariants),
                                     [&](Variant x) { return p == variant_name(x); });
        if (v == std::end(kAllVariants)) bad_option(variants_arg, "variants are fused, inplace, naive");
        opt.variants.push_back(*v);
      }
    }
    if (opt.variants.empty()) bad_option("--variants", "no variant selected");
    return opt;
  }
  if (!backward_only.empty()) bad_option(backward_only, "a flag of the backward suites only");
  if (append_suite(opt.suite)) {
    if (opt.dtype != "bf16") bad_option("--dtype=" + opt.dtype, "the serve suites run bf16 q, k and v");
    const std::vector<AppendVariant> append_order = append_variant_order(opt);
    opt.append_variants.clear();  // default: all but the PDL pair
    if (variants_arg.empty())
      for (AppendVariant v : append_order)
        if (v != AppendVariant::kPair && v != AppendVariant::kPairPdl) opt.append_variants.push_back(v);
    for (const auto& p : variants_arg.empty() ? std::vector<std::string>{} : split_commas(variants)) {
      const auto v = std::find_if(append_order.begin(), append_order.end(),
                                  [&](AppendVariant x) { return p == append_variant_name(x); });
      if (v == append_order.end())
        bad_option(variants_arg, "variants of this suite are kvrope, kvrope_kip, pair, pair_pdl, naive");
      opt.append_variants.push_back(*v);
    }
    if (opt.append_variants.empty()) bad_option("--variants", "no variant selected");
    return opt;
  }
  const std::vector<FwdVariant> order = fwd_variant_order(opt);
  std::string names;
  for (FwdVariant v : order) names += std::string(names.empty() ? "" : ", ") + fwd_variant_name(v);
  opt.fwd_variants = variants_arg.empty() ? order : std::vector<FwdVariant>{};
  for (const auto& p : variants_arg.empty() ? std::vector<std::string>{} : split_commas(variants)) {
    const auto v = std::find_if(order.begin(), order.end(), [&](FwdVariant x) { return p == fwd_variant_name(x); });
    if (v == order.end()) bad_option(variants_arg, ("variants of this suite are " + names).c_str());
    opt.fwd_variants.push_back(*v);
  }
  if (opt.fwd_variants.empty()) bad_option("--variants", "no variant selected");
  return opt;
}

}  // namespace kvrope_bench
