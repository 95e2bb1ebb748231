// One MLA case of a serve suite (append_cases.hpp, AppendCase::mla; kvrope::mla_append, docs/spec.md §6.6): its
// tensors, the MlaAppendParams of its call, and its check against the float64 reference (verify/check_mla.hpp):
// the cache rows no token names scanned on the device for the fill pattern, the rows the tokens wrote gathered
// there, and those rows, q (rotated in place, or written to query_out_fp8) and the inputs checked on the host.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <kvrope/mla_append.cuh>
#include <kvrope/reference/cpu_mla.hpp>

#include "verify/check_mla.hpp"

#include "append_case.cuh"  // AppendCheck, kAppendCachePattern, AppendCaseData::rope_table
#include "append_cases.hpp"
#include "append_check.cuh"
#include "check.cuh"
#include "device.cuh"
#include "fill.cuh"
#include "options.cuh"
#include "runner.cuh"

namespace kvrope_bench {

//! The host's part of an MLA case's check (MlaCaseData::check): a call of case `sc` as kvrope::verify::check_mla
//! reads it, from host copies of q [T, Hq, N + R] and kv [T, L + R] (kv_c, then k_pe) before and after the call,
//! of query_out_fp8 after it ([T, Hq, N + R] codes; the q-fp8 cases, else empty), of the positions and the fp32
//! table the call read, and of the cache rows the tokens wrote, gathered [T, L + R] (elements of C, as bytes): a
//! flat pool of page size 1, slot t for token t (each token of the suites writes a slot of its own), whose
//! "before" rows (the fill pattern) check_mla never reads since every slot is written. Scales: kMlaKvScale,
//! kAppendQueryScale.
template <typename T, typename C>
kvrope::verify::CheckResult mla_check_rows(const AppendCase& sc, const std::vector<int64_t>& positions,
                                           const std::vector<float>& table, const std::vector<T>& q_before,
                                           const std::vector<T>& q_after, const std::vector<T>& kv_before,
                                           const std::vector<T>& kv_after, const std::vector<uint8_t>& q8_after,
                                           const std::vector<uint8_t>& rows) {
  const int64_t tokens = sc.tokens(), Hq = sc.query_heads, N = sc.nope_dim, R = sc.rotary_dim(), L = sc.latent_dim;
  const int64_t W = N + R;
  std::vector<int64_t> flat_slots(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) flat_slots[static_cast<size_t>(t)] = t;
  std::vector<uint8_t> pattern_rows(rows.size(), kAppendCachePattern), pattern_q8(q8_after.size(), kAppendCachePattern);
  const float kv_scale = kMlaKvScale, q_scale = kAppendQueryScale;
  kvrope::reference::MlaHostArgs<T, C, int64_t> in;
  in.tokens = tokens;
  in.query_heads = Hq;
  in.nope_dim = N;
  in.rotary_dim = R;
  in.latent_dim = L;
  in.style = kvrope::RotaryStyle::kInterleaved;
  in.query_pe = q_before.data() + N;
  in.query_pe_token_stride = in.query_nope_token_stride = Hq * W;
  in.query_pe_head_stride = in.query_nope_head_stride = W;
  in.query_nope = q_before.data();
  if (sc.query_fp8) {
    in.query_out_fp8 = reinterpret_cast<const __nv_fp8_e4m3*>(pattern_q8.data());
    in.query_out_token_stride = Hq * W;
    in.query_out_head_stride = W;
    in.write_query_nope = true;
    in.query_scale = &q_scale;
  }
  in.kv_c = kv_before.data();
  in.kv_c_stride = L + R;
  in.k_pe = kv_before.data() + L;
  in.k_pe_stride = L + R;
  in.cos_sin_cache_f32 = table.data();
  in.max_position = sc.max_position;
  in.positions = positions.data();
  in.slot_mapping = flat_slots.data();
  in.num_pages = tokens;
  in.page_size = 1;
  in.caches = kvrope::reference::mla_concat_caches(reinterpret_cast<const C*>(pattern_rows.data()), 1, L, R);
  if constexpr (kvrope::kIsFp8<C>) in.kv_scale = &kv_scale;
  kvrope::verify::MlaOutputs<T, C> out;
  out.query_pe = q_after.data() + N;
  out.query_nope = q_after.data();
  if (sc.query_fp8) out.query_out_fp8 = reinterpret_cast<const __nv_fp8_e4m3*>(q8_after.data());
  out.kv_c = kv_after.data();
  out.k_pe = kv_after.data() + L;
  out.caches = kvrope::reference::mla_concat_caches(reinterpret_cast<const C*>(rows.data()), 1, L, R);
  return kvrope::verify::check_mla(in, out);
}

template <typename T, typename C>
struct MlaCaseData : CaseDataBase {
  using Pos = int64_t;
  AppendCase sc;
  int64_t tokens = 0, slots = 0;
  int64_t q_width = 0;  // elements of a token's row of q, Hq (N + R)
  int64_t row = 0;      // elements of C a latent row, L + R (also kv's row: kv_c then k_pe)
  int fill_blocks = 0;
  AppendTokens host;
  std::vector<float> host_table;  // the table cache as uploaded (the check's reference reads it)

  // q [T, Hq, N + R] (q_nope, then q_pe: bf16 cases rotate q_pe in place, again and again while timed, values
  // staying bounded) and kv [T, L + R] (kv_c and k_pe as views of one projection, read only), with their inputs
  // (q_pristine, kv_pristine: restored for a check); the cache [pages, P, L + R] (vLLM's concat_and_cache_mla
  // layout: kvrope::mla_concat_latent / mla_concat_rope); scales: kMlaKvScale, kAppendQueryScale; query_fp8
  // [T, Hq, N + R]: the q-fp8 cases' query_out_fp8 (empty otherwise).
  DeviceBuffer q, q_pristine, kv, kv_pristine, positions, slot_mapping, table, cache, scales, error_flag, query_fp8;
  DeviceBuffer writer, counts;  // the writer of each slot, the check's counts (made at the first check)

  MlaCaseData(const AppendCase& c, const Options& opt, int blocks, cudaStream_t stream) : sc(c) {
    case_id = c.id;
    fill_blocks = blocks;
    tokens = c.tokens();
    slots = c.pages() * c.page_size;
    q_width = c.query_heads * (c.nope_dim + c.rotary_dim());
    row = c.latent_dim + c.rotary_dim();
    host = append_tokens(c, opt.seed);

    const size_t q_bytes = static_cast<size_t>(tokens * q_width) * sizeof(T);
    const size_t kv_bytes = static_cast<size_t>(tokens * row) * sizeof(T);
    q = DeviceBuffer(q_bytes);
    q_pristine = DeviceBuffer(q_bytes);
    kv = DeviceBuffer(kv_bytes);
    kv_pristine = DeviceBuffer(kv_bytes);
    positions = DeviceBuffer(host.positions.size() * sizeof(Pos));
    slot_mapping = DeviceBuffer(static_cast<size_t>(tokens) * sizeof(int64_t));
    table = DeviceBuffer(static_cast<size_t>(c.max_position * c.rotary_dim()) * sizeof(float));
    cache = DeviceBuffer(static_cast<size_t>(slots * row) * sizeof(C));
    scales = DeviceBuffer(2 * sizeof(float));
    error_flag = DeviceBuffer(sizeof(int));
    if (c.query_fp8) query_fp8 = DeviceBuffer(static_cast<size_t>(tokens * q_width));

    const uint64_t seed = splitmix64(opt.seed ^ (static_cast<uint64_t>(c.id) << 32) ^ 0x3A1Aull);
    fill_normal(q_pristine.as<T>(), tokens * q_width, seed, fill_blocks, stream);
    fill_normal(kv_pristine.as<T>(), tokens * row, splitmix64(seed), fill_blocks, stream);
    reset(stream);
    upload(positions, host.positions.data(), stream);
    upload(slot_mapping, host.slots.data(), stream);
    host_table = AppendCaseData<T, T>::rope_table(c.max_position, c.rotary_dim());
    upload(table, host_table.data(), stream);
    const float s[2] = {kMlaKvScale, kAppendQueryScale};
    upload(scales, s, stream);
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  static void upload(const DeviceBuffer& buf, const void* src, cudaStream_t stream) {
    AppendCaseData<T, T>::upload(buf, src, stream);
  }

  // The call: q_pe (the last R of each row of q) rotated with the fp32 table at the positions (interleaved
  // pairs), in place, or with q_fp8 (the q-fp8 cases) into query_out_fp8 beside q_nope, both quantized under
  // kAppendQueryScale; [kv_c | RoPE(k_pe)] to the slot's row of the cache, fp8 under kMlaKvScale.
  kvrope::MlaAppendParams<T, C, Pos> params() const {
    const int64_t Hq = sc.query_heads, N = sc.nope_dim, R = sc.rotary_dim(), L = sc.latent_dim, W = N + R;
    kvrope::MlaAppendParams<T, C, Pos> p;
    p.tokens = tokens;
    p.query_heads = Hq;
    p.nope_dim = N;
    p.rotary_dim = R;
    p.latent_dim = L;
    p.style = kvrope::RotaryStyle::kInterleaved;
    p.query_pe = {q.as<T>() + N, Hq * W, W};
    if (sc.query_fp8) {
      p.query_nope = {q.as<const T>(), Hq * W, W};
      p.query_out_fp8 = kvrope::thd(query_fp8.as<__nv_fp8_e4m3>(), Hq, W);
      p.write_query_nope = true;
      p.query_scale = scales.as<const float>() + 1;
    }
    p.kv_c = kv.as<const T>();
    p.kv_c_stride = row;
    p.k_pe = kv.as<const T>() + L;
    p.k_pe_stride = row;
    p.positions = positions.as<const Pos>();
    p.cos_sin_cache_f32 = table.as<const float>();
    p.max_position = sc.max_position;
    p.latent_cache = kvrope::mla_concat_latent(cache.as<C>(), sc.page_size, L, R);
    p.rope_cache = kvrope::mla_concat_rope(cache.as<C>(), sc.page_size, L, R);
    p.page_size = sc.page_size;
    p.num_pages = sc.pages();
    p.slot_mapping = slot_mapping.as<const int64_t>();
    if constexpr (kvrope::kIsFp8<C>) p.kv_scale = scales.as<const float>();
    p.error_flag = error_flag.as<int>();
    return p;
  }

  // q and kv back to their inputs, the cache (and query_fp8) to the pattern, the error flag to 0.
  void reset(cudaStream_t stream) const {
    KVROPE_BENCH_CUDA(
        cudaMemcpyAsync(q.as<void>(), q_pristine.as<void>(), q.bytes(), cudaMemcpyDeviceToDevice, stream));
    KVROPE_BENCH_CUDA(
        cudaMemcpyAsync(kv.as<void>(), kv_pristine.as<void>(), kv.bytes(), cudaMemcpyDeviceToDevice, stream));
    for (const DeviceBuffer* b : {&cache, &query_fp8})
      if (b->bytes() > 0) KVROPE_BENCH_CUDA(cudaMemsetAsync(b->as<void>(), kAppendCachePattern, b->bytes(), stream));
    KVROPE_BENCH_CUDA(cudaMemsetAsync(error_flag.as<int>(), 0, sizeof(int), stream));
  }

  int read_error_flag(cudaStream_t stream) const {
    int flag = 0;
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(&flag, error_flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, stream));
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
    return flag;
  }

  // The cache's rows as bytes, one "head" of row (L + R) sizeof(C) bytes a slot.
  kvrope::PagedCache<const uint8_t> cache_bytes() const {
    const int64_t b = row * static_cast<int64_t>(sizeof(C));
    return {cache.as<const uint8_t>(), sc.page_size * b, b, 0};
  }

  template <typename U>
  std::vector<U> to_host(const DeviceBuffer& buf, cudaStream_t stream) const {
    std::vector<U> h(buf.bytes() / sizeof(U));
    if (!h.empty())
      KVROPE_BENCH_CUDA(cudaMemcpyAsync(h.data(), buf.as<void>(), buf.bytes(), cudaMemcpyDeviceToHost, stream));
    return h;
  }

  // The check: one call of `launch` (which sets `status`) from the reset state, then (the inputs restored
  // afterwards)
  // - on the device, every cache row no token writes still the fill pattern (compare_untouched_rows);
  // - on the host, against the float64 reference (mla_check_rows, kvrope::verify::check_mla; docs/spec.md §1.7):
  //   q_pe rotated within tolerance and q_nope unchanged (bf16 cases), or q unchanged and query_out_fp8 the
  //   codes of q_nope and of a RoPE(q_pe) within tolerance (q-fp8 cases); kv unchanged; the rows the tokens
  //   wrote, gathered into a flat pool [T, L + R]: kv_c a copy (fp8: its code), RoPE(k_pe) within tolerance
  //   (fp8: the code of a value within it); and the error flag 0.
  // Empty `failure`, or what failed with its first element.
  template <typename Launch>
  AppendCheck check(Launch&& launch, const kvrope::Status& status, cudaStream_t stream) {
    AppendCheck out;
    const int64_t P = sc.page_size, row_bytes = row * static_cast<int64_t>(sizeof(C));
    ensure_slot_writers(host.slots, slots, writer, counts, stream);
    if (!call_for_check(*this, launch, status, "mla_append", stream, out)) return out;
    const int flag = read_error_flag(stream);

    // The device's part: the rows no token names, as filled; the rows the tokens wrote, gathered [T, L + R].
    const CompareCounts zero[kAppendRegions] = {};
    upload(counts, zero, stream);
    CompareCounts* c = counts.as<CompareCounts>();
    compare_untouched_rows<<<fill_blocks, 256, 0, stream>>>(
        cache_bytes(), row_bytes, P, 1, slots, writer.as<const int>(), kAppendCachePattern, c + kRegionKeyOther);
    const std::vector<uint8_t> rows =
        gathered_rows(cache_bytes(), slot_mapping.as<const int64_t>(), P, 1, row_bytes, tokens, fill_blocks, stream);
    CompareCounts got[kAppendRegions];
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(got, c, sizeof(got), cudaMemcpyDeviceToHost, stream));
    const std::vector<T> q_before = to_host<T>(q_pristine, stream), q_after = to_host<T>(q, stream);
    const std::vector<T> kv_before = to_host<T>(kv_pristine, stream), kv_after = to_host<T>(kv, stream);
    const std::vector<uint8_t> q8_after = to_host<uint8_t>(query_fp8, stream);
    reset(stream);
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));

    const kvrope::verify::CheckResult r =
        mla_check_rows<T, C>(sc, host.positions, host_table, q_before, q_after, kv_before, kv_after, q8_after, rows);
    // Every element of q (and of query_out_fp8), of kv and of the rows written: else the check proved nothing.
    add_reference_verdict(
        out.failure, flag, r,
        tokens * (sc.query_heads * (sc.nope_dim + sc.rotary_dim()) * (sc.query_fp8 ? 2 : 1) + 2 * row),
        "read or wrote");
    if (got[kRegionKeyOther].bad > 0)
      out.failure += "cache: " + std::to_string(got[kRegionKeyOther].bad) + " bytes of rows no token names changed; ";
    return out;
  }
};

}  // namespace kvrope_bench
