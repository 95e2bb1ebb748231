// Host tests of the benchmark's case tables (bench/*.csv through bench/support/cases.hpp): every suite's
// table parses with the rows its docs promise, and the position patterns are what their names say.
#include <algorithm>
#include <set>

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
