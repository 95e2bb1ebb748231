// The case table: bench/sol_execbench_062_cases.csv, read at run time by its header's column names.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace kvrope_bench {

struct LeaderboardCase {
  int id = 0;
  int64_t heads = 0;      // H (num_kv_heads)
  int64_t head_dim = 0;   // D
  int64_t batch = 0;      // B
  int64_t seq_len = 0;    // S, new tokens
  int64_t cache_len = 0;  // S_max
  double b200_scoring_baseline_ms = 0;
  double b200_sol_bound_ms = 0;
  std::string dtype;      // the optional column dtype (bf16, fp16, fp32); empty: --dtype's
  std::string positions;  // the optional column positions (arange, random, wrap); empty: --positions'
};

inline bool valid_dtype(const std::string& d) { return d == "bf16" || d == "fp16" || d == "fp32"; }
inline bool valid_positions(const std::string& p) { return p == "arange" || p == "random" || p == "wrap"; }

// cache_position of a case: arange(S); S distinct random rows of S_max in random order (neither
// contiguous nor sorted); or one run of S rows starting S/2 before the cache's end, so that it wraps.
inline std::vector<int64_t> make_positions(const std::string& pattern, int64_t S, int64_t Smax, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(S));
  if (pattern == "random") {
    std::vector<int64_t> rows(static_cast<size_t>(Smax));
    std::iota(rows.begin(), rows.end(), int64_t{0});
    std::mt19937_64 rng(seed);
    std::shuffle(rows.begin(), rows.end(), rng);
    std::copy(rows.begin(), rows.begin() + S, p.begin());
  } else if (pattern == "wrap") {
    for (int64_t t = 0; t < S; ++t) p[static_cast<size_t>(t)] = (Smax - S / 2 + t) % Smax;
  } else {
    std::iota(p.begin(), p.end(), int64_t{0});
  }
  return p;
}

// A size field of a case (a member pointer through an alias: nvcc's host code otherwise trips -Wparentheses).
using CaseField = int64_t LeaderboardCase::*;

inline std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line);
  std::string cell;
  while (std::getline(in, cell, ',')) {
    const size_t b = cell.find_first_not_of(" \t\r"), e = cell.find_last_not_of(" \t\r");
    cells.push_back(b == std::string::npos ? std::string() : cell.substr(b, e - b + 1));
  }
  return cells;
}

[[noreturn]] inline void bad_table(const std::string& path, int line, const std::string& why) {
  std::fprintf(stderr, "kvrope_bench: %s:%d: %s\n", path.c_str(), line, why.c_str());
  std::exit(2);
}

// Every row of the table; exits with a message when the file or a row is malformed.
inline std::vector<LeaderboardCase> read_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) bad_table(path, 0, "cannot open the case table (--cases_csv=PATH)");
  std::string line;
  if (!std::getline(in, line)) bad_table(path, 1, "empty file");
  const std::vector<std::string> header = split_csv_line(line);
  const char* names[] = {"case",
                         "num_kv_heads",
                         "head_dim",
                         "batch_size",
                         "new_seq_len",
                         "max_seq_len",
                         "b200_scoring_baseline_ms",
                         "b200_sol_bound_ms"};
  int col[8];
  for (int c = 0; c < 8; ++c) {
    col[c] = -1;
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == names[c]) col[c] = static_cast<int>(i);
    if (col[c] < 0) bad_table(path, 1, std::string("no column ") + names[c]);
  }
  int dtype_col = -1, positions_col = -1;  // optional columns
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == "dtype") dtype_col = static_cast<int>(i);
    if (header[i] == "positions") positions_col = static_cast<int>(i);
  }
  std::vector<LeaderboardCase> cases;
  for (int row = 2; std::getline(in, line); ++row) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<std::string> cells = split_csv_line(line);
    double v[8];
    for (int c = 0; c < 8; ++c) {
      const std::string cell = static_cast<size_t>(col[c]) < cells.size() ? cells[col[c]] : std::string();
      char* end = nullptr;
      v[c] = std::strtod(cell.c_str(), &end);
      if (cell.empty() || *end != '\0') bad_table(path, row, std::string("bad ") + names[c] + " '" + cell + "'");
      if (c < 6 && (v[c] != static_cast<double>(static_cast<int64_t>(v[c])) || v[c] < (c == 4 ? 0 : 1)))
        bad_table(path, row,
                  std::string(names[c]) + (c == 4 ? " must be an integer >= 0" : " must be an integer >= 1"));
    }
    LeaderboardCase lc;
    lc.id = static_cast<int>(v[0]);
    lc.heads = static_cast<int64_t>(v[1]);
    lc.head_dim = static_cast<int64_t>(v[2]);
    lc.batch = static_cast<int64_t>(v[3]);
    lc.seq_len = static_cast<int64_t>(v[4]);
    lc.cache_len = static_cast<int64_t>(v[5]);
    lc.b200_scoring_baseline_ms = v[6];
    lc.b200_sol_bound_ms = v[7];
    auto optional_cell = [&](int c) { return c >= 0 && static_cast<size_t>(c) < cells.size() ? cells[c] : ""; };
    lc.dtype = optional_cell(dtype_col);
    lc.positions = optional_cell(positions_col);
    if (!lc.dtype.empty() && !valid_dtype(lc.dtype)) bad_table(path, row, "dtype is bf16, fp16 or fp32");
    if (!lc.positions.empty() && !valid_positions(lc.positions))
      bad_table(path, row, "positions are arange, random or wrap");
    for (const LeaderboardCase& other : cases)
      if (other.id == lc.id) bad_table(path, row, "case " + std::to_string(lc.id) + " appears twice");
    cases.push_back(lc);
  }
  if (cases.empty()) bad_table(path, 2, "no case");
  return cases;
}

}  // namespace kvrope_bench
