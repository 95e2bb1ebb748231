// The --kvrope_json report: device, config, calibration, cases[] with every per-call time, the
// geometric and arithmetic means (docs/benchmarks.md, "Output").
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "results.cuh"
#include "backward_report.cuh"

namespace kvrope_bench {

inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

inline std::string json_bool(bool b) { return b ? "true" : "false"; }

inline std::string json_array(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_number(v[i]);
  return out + "]";
}

// Every field of the policy the tuned calls ran with, so that a results file says exactly what ran.
inline std::string policy_json(const Policy& p) {
  auto n = [](int v) { return std::to_string(v); };
  return "{\"block_threads\": " + n(p.block_threads) + ", \"blocks_per_sm\": " + n(p.blocks_per_sm) +
         ", \"bulk_copy\": " + json_bool(p.bulk_copy) + ", \"bulk_stages\": " + n(p.bulk_stages) +
         ", \"bulk_store_slack\": " + n(p.bulk_store_slack) + ", \"bulk_chunk_bytes\": " + n(p.bulk_chunk_bytes) +
         ", \"bulk_min_chunks_per_block\": " + n(p.bulk_min_chunks_per_block) +
         ", \"bulk_speculate_chunks\": " + n(p.bulk_speculate_chunks) +
         ", \"bulk_speculate_mask_rounds\": " + n(p.bulk_speculate_mask_rounds) +
         ", \"bulk_share_min_chunks_per_block\": " + n(p.bulk_share_min_chunks_per_block) +
         ", \"token_warp_weight\": " + json_number(p.token_warp_weight) +
         ", \"decode_copy_max_mib\": " + n(p.decode_copy_max_mib) +
         ", \"decode_block_threads\": " + n(p.decode_block_threads) + "}";
}

// The cases' common H or D, or "per case" where they differ.
inline std::string json_dim(const Run& run, CaseField field) {
  const int64_t v = common_value(run.cases, field);
  return v > 0 ? std::to_string(v) : json_string("per case");
}

// One kind of means (geometric or arithmetic), keyed as in "geomean"; ratios only with the geometric.
inline std::string json_means(const Summary& s, bool geo, bool ratios) {
  auto v = [&](const Means& m) { return json_number(geo ? m.geometric() : m.arithmetic()); };
  std::string j = "{\"cases\": " + std::to_string(s.cases) + ", \"naive_us\": " + v(s.naive) +
                  ", \"fused_us\": " + v(s.fused) + ", \"inplace_us\": " + v(s.inplace) +
                  ", \"floor_us\": " + v(s.floor) + ", \"inplace_floor_us\": " + v(s.inplace_floor) +
                  ", \"naive_event_us\": " + v(s.naive_event) + ", \"fused_event_us\": " + v(s.fused_event) +
                  ", \"inplace_event_us\": " + v(s.inplace_event);
  if (ratios)
    j += ", \"fused_over_floor\": " + v(s.fused_x_floor) + ", \"inplace_over_inplace_floor\": " + v(s.inplace_x_floor) +
         ", \"naive_over_fused\": " + v(s.naive_x_fused) + ", \"naive_over_inplace\": " + v(s.naive_x_inplace);
  return j + "}";
}

// The "device" member, with its trailing ",\n".
inline std::string device_json(const DeviceInfo& d) {
  return "  \"device\": {\"name\": " + json_string(d.name) + ", \"compute_capability\": \"" + std::to_string(d.major) +
         "." + std::to_string(d.minor) + "\", \"sm_count\": " + std::to_string(d.sm_count) +
         ", \"l2_bytes\": " + std::to_string(d.l2_bytes) + ", \"global_bytes\": " + std::to_string(d.global_bytes) +
         ", \"sm_clock_khz\": " + std::to_string(d.sm_clock_khz) +
         ", \"mem_clock_khz\": " + std::to_string(d.mem_clock_khz) +
         ", \"mem_bus_bits\": " + std::to_string(d.mem_bus_bits) +
         ", \"driver_version\": " + std::to_string(d.driver_version) +
         ", \"runtime_version\": " + std::to_string(d.runtime_version) + "},\n";
}

// The protocol in words, for config's "clock".
inline std::string clock_text(const Run& run) {
  return "CUPTI: first start to last end of the call's kernels, memcpys and memsets; L2 (" +
         std::to_string(run.flush_bytes) +
         (run.options.flush_reads ? " bytes read: --flush=read, not the protocol's" : " bytes written") +
         ") flushed and device synchronized before each call; statistic: median";
}

// The start of the "config" member every suite writes, "suite" to "clock"; the caller adds its own
// fields and closes it. `variants`: the JSON strings of the variants, comma-separated.
inline std::string config_json_start(const Run& run, const std::string& variants) {
  const Options& o = run.options;
  return "  \"config\": {\"suite\": " + json_string(suite_name(o.suite)) +
         ", \"dtype\": " + json_string(dtype_text(run)) + ", \"heads\": " + json_dim(run, &LeaderboardCase::heads) +
         ", \"head_dim\": " + json_dim(run, &LeaderboardCase::head_dim) + ", \"positions\": \"" + positions_text(run) +
         "\", \"position_type\": \"int64\", \"iters\": " + std::to_string(o.iters) +
         ", \"warmup\": " + std::to_string(o.warmup) + ", \"check\": " + json_bool(o.check) +
         ", \"seed\": " + std::to_string(o.seed) + ", \"primer\": " + json_bool(o.primer) +
         ", \"naive_first\": " + json_bool(o.naive_first) + ", \"flush\": \"" + (o.flush_reads ? "read" : "write") +
         "\", \"variants\": [" + variants + "], \"clock\": " + json_string(clock_text(run));
}

// The start of a case's object in "cases": its id and sizes.
inline std::string case_json_start(int id, const LeaderboardCase& lc) {
  return "    {\"case\": " + std::to_string(id) + ", \"batch\": " + std::to_string(lc.batch) +
         ", \"seq_len\": " + std::to_string(lc.seq_len) + ", \"cache_len\": " + std::to_string(lc.cache_len) +
         ", \"heads\": " + std::to_string(lc.heads) + ", \"head_dim\": " + std::to_string(lc.head_dim);
}

// The "calibration" member, with its trailing ",\n".
inline std::string calibration_json(const Calibration& c) {
  return "  \"calibration\": {\"copy_bytes\": " + std::to_string(c.copy_bytes) +
         ", \"copy_median_us\": " + json_number(c.copy_median_us) +
         ", \"copy_bandwidth_TBps\": " + json_number(c.bandwidth_bytes_per_us * 1e-6) +
         ", \"copy_calls\": " + std::to_string(c.copy_calls) +
         ", \"empty_kernel_us\": " + json_number(c.empty_kernel_us) +
         ", \"empty_kernel_event_us\": " + json_number(c.empty_kernel_event_us) +
         ", \"empty_calls\": " + std::to_string(c.empty_calls) + "},\n";
}

// A variant's statistics and bytes, without its closing brace (the caller adds its own members first).
inline std::string variant_stats_json(const VariantResult& r, double bytes, double floor) {
  return "\"median_us\": " + json_number(r.median_us) + ", \"event_median_us\": " + json_number(r.event_median_us) +
         ", \"event_traced_median_us\": " + json_number(r.event_traced_median_us) +
         ", \"min_us\": " + json_number(r.min_us) + ", \"mean_us\": " + json_number(r.mean_us) +
         ", \"p90_us\": " + json_number(r.p90_us) + ", \"max_us\": " + json_number(r.max_us) +
         ", \"bytes\": " + json_number(bytes) + ", \"TBps\": " + json_number(bytes / r.median_us * 1e-6) +
         ", \"floor_us\": " + json_number(floor) + ", \"x_floor\": " + json_number(r.median_us / floor) +
         ", \"activities\": " + json_number(r.activities) + ", \"checked\": " + json_bool(r.checked);
}

// A variant's per-call times, closing its object.
inline std::string variant_times_json(const VariantResult& r) {
  return ",\n         \"times_us\": " + json_array(r.cupti_us) +
         ",\n         \"event_times_us\": " + json_array(r.event_us) +
         ",\n         \"event_traced_times_us\": " + json_array(r.event_traced_us) + "}";
}

inline void write_text_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "kvrope_bench: cannot write %s\n", path.c_str());
    return;
  }
  std::printf("wrote %s\n", path.c_str());
}

inline void write_json(const Run& run, const Summary& s, const std::string& path) {
  const Options& o = run.options;
  const DeviceInfo& d = run.device;
  std::string j = "{\n";
  j += device_json(d);
  std::string variants;
  for (Variant v : variant_order(o))  // in the order they ran within a case
    if (selected(o, v)) variants += std::string(variants.empty() ? "" : ", ") + "\"" + variant_name(v) + "\"";
  j += config_json_start(run, variants) + ", \"fused_workspace\": " + json_bool(o.workspace) + ", \"launch_tuning\": " +
       (o.tuned() ? policy_json(tuned_policy(o, d.major)) : std::string("\"default_tuning\"")) +
       ", \"cases_csv\": " + json_string(o.cases_csv) + "},\n";
  j += calibration_json(run.calibration);
  j += "  \"cases\": [";
  bool first_case = true;
  for (const auto& [id, cr] : run.results) {
    j += first_case ? "\n" : ",\n";
    first_case = false;
    j += case_json_start(id, cr.lc) + ", \"bytes\": " + json_number(cr.bytes.out_of_place) +
         ", \"inplace_bytes\": " + json_number(cr.bytes.in_place) + ", \"floor_us\": " + json_number(cr.floor_us) +
         ", \"inplace_floor_us\": " + json_number(cr.inplace_floor_us) +
         ", \"b200_scoring_baseline_ms\": " + json_number(cr.lc.b200_scoring_baseline_ms) +
         ", \"b200_sol_bound_ms\": " + json_number(cr.lc.b200_sol_bound_ms) + ",\n     \"variants\": {";
    bool first_variant = true;
    for (const auto& [v, r] : cr.variants) {
      const bool ip = v == Variant::kInPlace;
      const double bytes = ip ? cr.bytes.in_place : cr.bytes.out_of_place;
      const double floor = ip ? cr.inplace_floor_us : cr.floor_us;
      j += first_variant ? "\n" : ",\n";
      first_variant = false;
      j += std::string("       \"") + variant_name(v) + "\": {" + variant_stats_json(r, bytes, floor);
      if (const VariantResult* n = find_variant(cr, Variant::kNaive); n != nullptr && v != Variant::kNaive) {
        j += ", \"speedup_vs_naive\": " + json_number(n->median_us / r.median_us);
      }
      j += variant_times_json(r);
    }
    j += "}}";
  }
  j += "\n  ],\n";
  j += "  \"geomean\": " + json_means(s, true, true) + ",\n";
  j += "  \"arithmetic_mean\": " + json_means(s, false, false) + ",\n";
  j += "  \"leaderboard\": {\"statistic\": \"geometric mean\", \"entry_us\": " + json_number(kLeaderboardEntryUs) +
       ", \"sol_bound_geomean_us\": " + json_number(s.sol_bound.geometric()) +
       ", \"sol_bound_mean_us\": " + json_number(s.sol_bound.arithmetic()) + "}\n}\n";
  write_text_file(path, j);
}

}  // namespace kvrope_bench
