// Host tests of the benchmark's case tables (bench/*.csv through bench/support/cases.hpp): every suite's
// table parses with the rows its docs promise, and the position patterns are what their names say; the serve
// suites' generated cases (bench/support/append_cases.hpp) come in their groups' id ranges.
#include <algorithm>
#include <set>
#include <string>

#include "append_cases.hpp"
#include "cases.hpp"
#include "support/catch.hpp"

using kvrope_bench::LeaderboardCase;

namespace {

std::vector<LeaderboardCase> table(const char* name) {
  return kvrope_bench::read_cases(std::string(KVROPE_BENCH_DIR) + "/" + name);
}

}  // namespace

TEST_CASE("each suite's table repeats the leaderboard's 16 shapes with its own H, D, dtype or positions",
          "[host][bench]") {
  const std::vector<LeaderboardCase> base = table("sol_execbench_062_cases.csv");
  REQUIRE(base.size() == 16);
  struct Suite {
    const char* file;
    size_t rows;
  };
  for (const Suite& s : {Suite{"suite_positions.csv", 32}, Suite{"suite_heads.csv", 64},
                         Suite{"suite_head_dims.csv", 64}, Suite{"suite_dtypes.csv", 32}}) {
    INFO(s.file);
    const std::vector<LeaderboardCase> rows = table(s.file);
    REQUIRE(rows.size() == s.rows);
    for (size_t i = 0; i < rows.size(); ++i) {
      const LeaderboardCase& r = rows[i];
      const LeaderboardCase& b = base[i % 16];
      CHECK(r.id == static_cast<int>(i) + 1);
      CHECK((r.batch == b.batch && r.seq_len == b.seq_len && r.cache_len == b.cache_len));
    }
  }
  const std::vector<LeaderboardCase> heads = table("suite_heads.csv"), dims = table("suite_head_dims.csv");
  const std::vector<LeaderboardCase> pos = table("suite_positions.csv"), dtypes = table("suite_dtypes.csv");
  for (size_t i = 0; i < 64; ++i) {
    CHECK(heads[i].heads == std::vector<int64_t>{1, 2, 4, 32}[i / 16]);
    CHECK(heads[i].head_dim == 128);
    CHECK(dims[i].head_dim == std::vector<int64_t>{64, 80, 96, 256}[i / 16]);
    CHECK(dims[i].heads == 8);
  }
  for (size_t i = 0; i < 32; ++i) {
    CHECK(pos[i].positions == (i < 16 ? "random" : "wrap"));
    CHECK(dtypes[i].dtype == (i < 16 ? "fp16" : "fp32"));
    CHECK(pos[i].dtype.empty());
  }
  CHECK(base[0].dtype.empty());
  CHECK(base[0].positions.empty());
}

TEST_CASE("position patterns: arange, distinct random rows, one run that wraps", "[host][bench]") {
  const int64_t S = 700, Smax = 1024;
  const std::vector<int64_t> a = kvrope_bench::make_positions("arange", S, Smax, 1);
  for (int64_t t = 0; t < S; ++t) CHECK(a[t] == t);
  const std::vector<int64_t> r = kvrope_bench::make_positions("random", S, Smax, 1);
  CHECK(std::set<int64_t>(r.begin(), r.end()).size() == static_cast<size_t>(S));
  CHECK(*std::max_element(r.begin(), r.end()) < Smax);
  CHECK(!std::is_sorted(r.begin(), r.end()));
  const std::vector<int64_t> w = kvrope_bench::make_positions("wrap", S, Smax, 1);
  CHECK(w.front() == Smax - S / 2);
  CHECK(w.back() == S / 2 - 1 + (S % 2));  // past the end: rows 0, 1, ...
  for (int64_t t = 1; t < S; ++t) CHECK(w[t] == (w[t - 1] + 1) % Smax);
}

TEST_CASE("serve suites: the groups in id order, the MLA cases last with their byte counts", "[host][bench]") {
  using kvrope_bench::AppendCase;
  using kvrope_bench::AppendGroup;
  struct Suite {
    bool decode;
    size_t base, nvfp4, mrope, mla;
  };
  for (const Suite& s : {Suite{true, 72, 24, 24, 24}, Suite{false, 48, 16, 16, 16}}) {
    INFO((s.decode ? "serve-decode" : "serve-prefill"));
    const std::vector<AppendCase> cases = kvrope_bench::append_case_table(s.decode);
    REQUIRE(cases.size() == s.base + s.nvfp4 + s.mrope + s.mla);
    const size_t first_mla = s.base + s.nvfp4 + s.mrope;
    for (size_t i = 0; i < cases.size(); ++i) {
      const AppendCase& c = cases[i];
      CHECK(c.id == static_cast<int>(i) + 1);
      const AppendGroup want = i < s.base             ? AppendGroup::kBase
                               : i < s.base + s.nvfp4 ? AppendGroup::kNvfp4
                               : i < first_mla        ? AppendGroup::kMrope
                                                      : AppendGroup::kMla;
      CHECK(c.group() == want);
      if (!c.mla) {
        CHECK((c.heads == 8 && c.head_dim == 128 && c.latent_dim == 0));
        continue;
      }
      // Shapes, then Hq 16 and 128, then bf16 (q_pe in place) and fp8 (q to fp8): 4 cases a shape.
      const size_t j = i - first_mla;
      const AppendCase& base = cases[(j / 4) * 8];  // the first case of the shape (8 a shape in the first pass)
      CHECK((c.seqs == base.seqs && c.tokens_per_seq == base.tokens_per_seq && c.s_max == base.s_max));
      CHECK(c.query_heads == (j % 4 < 2 ? 16 : 128));
      CHECK(c.query_fp8 == (j % 2 == 1));
      CHECK(c.cache == (c.query_fp8 ? kvrope_bench::AppendCache::kFp8E4m3 : kvrope_bench::AppendCache::kBf16));
      CHECK((c.latent_dim == 512 && c.rotary_dim() == 64 && c.heads == 1));
      CHECK(c.nope_dim == (c.query_fp8 ? 512 : 128));
      CHECK(std::string(c.cache_label()) == (c.query_fp8 ? "mla_fp8+q8" : "mla_bf16"));
      const double per_token = kvrope_bench::append_bytes(c, false) / static_cast<double>(c.tokens());
      CHECK(per_token == (c.query_heads == 16 ? (c.query_fp8 ? 29648 : 6672) : (c.query_fp8 ? 223184 : 35344)));
      CHECK(kvrope_bench::append_bytes(c, true) == kvrope_bench::append_bytes(c, false));
    }
  }
}
