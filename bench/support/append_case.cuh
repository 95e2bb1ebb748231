// One case of a serve suite: its tensors (shared by its variants; one case is alive at a time), the
// AppendParams of a variant, and the check of kv_cache_rope_append against the naive two launches
// (kvrope::reference::naive_append), done on the device (support/append_check.cuh); the q-fp8 cases' fp8 q,
// which the naive launches cannot write, against the float64 reference on the host
// (kvrope::verify::check_append); the NVFP4 and mRoPE cases, which the naive launches cannot do either,
// against the float64 reference on the host too (check_reference), the untouched rows on the device.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include <kvrope/kvrope.cuh>
#include <kvrope/reference/cpu_append.hpp>

#include "verify/naive/naive_append.cuh"
#include "verify/check_append.hpp"

#include "check.cuh"
#include "device.cuh"
#include "fill.cuh"
#include "options.cuh"
#include "append_cases.hpp"
#include "append_check.cuh"
#include "runner.cuh"

namespace kvrope_bench {

// The byte the caches are filled with before a checked call: rows no token names must keep it.
constexpr unsigned char kAppendCachePattern = 0x5A;

// The outcome of a check: `failure` empty when every region is within its tolerance; `note` says how many
// elements were not bit-exact where a tolerance allowed it.
struct AppendCheck {
  std::string failure, note;
};

//! Once a case (`writer` still empty): `writer`, the last token naming each of the `num_slots` slots (-1: none),
//! uploaded, and `counts`, the check's counters. The append's and the MLA cases' checks share it.
inline void ensure_slot_writers(const std::vector<int64_t>& slots, int64_t num_slots, DeviceBuffer& writer,
                                DeviceBuffer& counts, cudaStream_t stream) {
  if (writer) return;
  std::vector<int> w(static_cast<size_t>(num_slots), -1);
  for (size_t t = 0; t < slots.size(); ++t) w[static_cast<size_t>(slots[t])] = static_cast<int>(t);
  writer = DeviceBuffer(w.size() * sizeof(int));
  // (from pageable memory: staged before the call returns)
  KVROPE_BENCH_CUDA(cudaMemcpyAsync(writer.as<void>(), w.data(), writer.bytes(), cudaMemcpyHostToDevice, stream));
  counts = DeviceBuffer(kAppendRegions * sizeof(CompareCounts));
}

//! A check's call: `data` reset, one call of `launch` (which sets `status`), synchronized. False, with the
//! failure in `out`, when the call returned an error (`op` names the entry point). The append's and the MLA
//! cases' checks share it.
template <typename Data, typename Launch>
bool call_for_check(Data& data, Launch& launch, const kvrope::Status& status, const char* op, cudaStream_t stream,
                    AppendCheck& out) {
  data.reset(stream);
  launch(stream);
  KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
  if (!status.ok()) out.failure = status_message(op, status);
  return status.ok();
}

//! The bytes of the cache rows of slots[0 .. tokens) (`cache` in bytes: H rows of row_bytes a slot), gathered
//! [tokens, H, row_bytes] on the device and copied to the host (every slot in range: the suites' cases).
inline std::vector<uint8_t> gathered_rows(kvrope::PagedCache<const uint8_t> cache, const int64_t* slots, int64_t P,
                                          int64_t H, int64_t row_bytes, int64_t tokens, int fill_blocks,
                                          cudaStream_t stream) {
  std::vector<uint8_t> rows(static_cast<size_t>(tokens * H * row_bytes));
  DeviceBuffer d(rows.size());
  gather_row_bytes<<<fill_blocks, 256, 0, stream>>>(cache, slots, P, H, row_bytes, static_cast<int64_t>(rows.size()),
                                                    d.as<uint8_t>());
  KVROPE_BENCH_CUDA(cudaGetLastError());
  KVROPE_BENCH_CUDA(cudaMemcpyAsync(rows.data(), d.as<void>(), rows.size(), cudaMemcpyDeviceToHost, stream));
  KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));  // before d is freed
  return rows;
}

//! The float64 reference's verdict added to `failure`: the error flag when raised; too few elements compared
//! (fewer than `least`, what the call `touched`: "wrote", "read or wrote"), else those beyond tolerance.
inline void add_reference_verdict(std::string& failure, int flag, const kvrope::verify::CheckResult& r, int64_t least,
                                  const char* touched) {
  if (flag != 0) failure = "error_flag = " + std::to_string(flag) + "; ";
  if (r.checked < least)
    failure += "the float64 reference compared " + std::to_string(r.checked) + " elements, fewer than the " +
               std::to_string(least) + " the call " + touched + "; ";
  else if (!r.ok())
    failure += "float64 reference: " + std::to_string(r.mismatches) + " of " + std::to_string(r.checked) +
               " beyond tolerance (first " + r.first_mismatch + "); ";
}

//! The host's part of the check of the NVFP4 and mRoPE cases (AppendCaseData::check_reference): a call of case
//! `sc` as kvrope::verify::check_append reads it, from host copies of qkv before and after the call ([T, (Hq +
//! 2 H) D]: q in place, k in place with key_in_place, else read only), of the positions ([T], or [3, T] with
//! mRoPE) and the fp32 table the call read, and of the cache rows the tokens wrote, gathered [T, H, row] in bytes
//! (row: D elements of C, NVFP4 D / 2 bytes; block scales [T, H, D / 16], NVFP4 only): a flat pool of page size
//! 1, slot t for token t (each token of the suites writes a slot of its own), whose "before" rows (the fill
//! pattern) check_append never reads since every slot is written. Scales: kAppendKeyScale, kAppendValueScale.
//! NVFP4 blocks bit for bit with `oracle`'s quotients and reciprocals where the key is shown (v; k with
//! key_in_place), else within one step.
template <typename T, typename C>
kvrope::verify::CheckResult append_check_rows(const AppendCase& sc, const std::vector<int64_t>& positions,
                                              const std::vector<float>& table, const std::vector<T>& before,
                                              const std::vector<T>& after, const std::vector<uint8_t>& key_rows,
                                              const std::vector<uint8_t>& value_rows,
                                              const std::vector<uint8_t>& key_sf_rows,
                                              const std::vector<uint8_t>& value_sf_rows, bool key_in_place,
                                              const kvrope::verify::Nvfp4Oracle& oracle) {
  constexpr bool nvfp4 = kvrope::kIsNvfp4<C>;
  const int64_t tokens = sc.tokens(), Hq = sc.query_heads, H = sc.heads, D = sc.head_dim;
  [[maybe_unused]] const int64_t width = (Hq + 2 * H) * D;  // (used: nvcc's #177-D misses braced assignments)
  const int64_t cache_row = nvfp4 ? sc.nvfp4_code_bytes() : D, sf_bytes = sc.nvfp4_scale_bytes();
  std::vector<int64_t> flat_slots(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) flat_slots[static_cast<size_t>(t)] = t;
  std::vector<uint8_t> pattern_rows(key_rows.size(), kAppendCachePattern);
  std::vector<uint8_t> pattern_sf(key_sf_rows.size(), kAppendCachePattern);
  [[maybe_unused]] const float scale_k = kAppendKeyScale, scale_v = kAppendValueScale;
  auto pool = [&](const std::vector<uint8_t>& rows) {
    return kvrope::nhd_pages(reinterpret_cast<const C*>(rows.data()), 1, H, cache_row);
  };
  [[maybe_unused]] auto sf_pool = [&](const std::vector<uint8_t>& rows) {
    return kvrope::nhd_pages(reinterpret_cast<const __nv_fp8_e4m3*>(rows.data()), 1, H, sf_bytes);
  };
  kvrope::AppendParams<T, C, int64_t> in;
  in.tokens = tokens;
  in.heads = H;
  in.query_heads = Hq;
  in.head_dim = D;
  in.rotary_dim = D;
  in.style = kvrope::RotaryStyle::kRotateHalf;
  in.query = {const_cast<T*>(before.data()), width, D};  // read only: check_append writes nothing
  in.key = {const_cast<T*>(before.data()) + Hq * D, width, D};
  in.key_in_place = key_in_place;
  in.value = {before.data() + (Hq + H) * D, width, D};
  in.positions = positions.data();
  if (sc.mrope) {
    sc.mrope_sections(in.mrope_section);
    in.position_stream_stride = tokens;
  }
  in.cos_sin_cache_f32 = table.data();
  in.max_position = sc.max_position;
  in.key_cache = kvrope::nhd_pages(reinterpret_cast<C*>(pattern_rows.data()), 1, H, cache_row);
  in.value_cache = in.key_cache;
  in.page_size = 1;
  in.num_pages = tokens;
  in.slot_mapping = flat_slots.data();
  if constexpr (kvrope::kIsQuantized<C>) {
    in.key_scale = &scale_k;
    in.value_scale = &scale_v;
  }
  kvrope::verify::AppendOutputs<T, C> outs;
  outs.query = {after.data(), width, D};
  outs.key = {after.data() + Hq * D, width, D};
  outs.value = {after.data() + (Hq + H) * D, width, D};
  outs.key_cache = pool(key_rows);
  outs.value_cache = pool(value_rows);
  if constexpr (nvfp4) {
    in.key_block_scales = kvrope::nhd_pages(reinterpret_cast<__nv_fp8_e4m3*>(pattern_sf.data()), 1, H, sf_bytes);
    in.value_block_scales = in.key_block_scales;
    outs.key_block_scales = sf_pool(key_sf_rows);
    outs.value_block_scales = sf_pool(value_sf_rows);
  }
  return kvrope::verify::check_append(in, outs, oracle);
}

template <typename T, typename C>
struct AppendCaseData : CaseDataBase {
  using Pos = int64_t;
  AppendCase sc;
  int64_t tokens = 0, width = 0, slots = 0;  // width: elements of a token's row of qkv, (Hq + 2 H) D
  int64_t cache_row = 0;                     // elements of C a cache row: D (NVFP4: D / 2 bytes of codes)
  size_t cache_elems = 0;
  int fill_blocks = 0;
  AppendTokens host;
  std::vector<float> host_table;  // the table cache as uploaded (the q-fp8 check's reference reads it)

  // qkv [T, (Hq + 2 H) D]: q, k and v as views of one projection, as engines pass them. qkv is what the calls
  // rotate (again and again while timed: values stay bounded); pristine is the input, restored for a check.
  // scales: k's, v's and q's (kAppendKeyScale, kAppendValueScale, kAppendQueryScale; NVFP4: k's and v's are the
  // global decode scales). query_fp8 [T, Hq, D]: the q-fp8 cases' query_out_fp8 (empty otherwise). key_sf,
  // value_sf: the NVFP4 caches' block scales, rows of D / 16 e4m3 bytes in the caches' layout (empty otherwise).
  DeviceBuffer qkv, pristine, positions, slot_mapping, table, key_cache, value_cache, scales, error_flag, query_fp8;
  DeviceBuffer key_sf, value_sf;
  // The naive reference's outputs (qkv after it, its cache rows gathered [T, H, D]), the writer of each slot,
  // the check's counts.
  DeviceBuffer ref_qkv, ref_key_rows, ref_value_rows, writer, counts;
  bool reference_ready = false;
  std::string reference_error;

  AppendCaseData(const AppendCase& c, const Options& opt, int blocks, cudaStream_t stream) : sc(c) {
    case_id = c.id;
    fill_blocks = blocks;
    tokens = c.tokens();
    width = (c.query_heads + 2 * c.heads) * c.head_dim;
    slots = c.pages() * c.page_size;
    cache_row = kvrope::kIsNvfp4<C> ? c.nvfp4_code_bytes() : c.head_dim;
    cache_elems = static_cast<size_t>(slots * c.heads * cache_row);
    host = append_tokens(c, opt.seed);

    const size_t qkv_bytes = static_cast<size_t>(tokens * width) * sizeof(T);
    qkv = DeviceBuffer(qkv_bytes);
    pristine = DeviceBuffer(qkv_bytes);
    positions = DeviceBuffer(host.positions.size() * sizeof(Pos));  // [T], or [3, T] with mRoPE
    slot_mapping = DeviceBuffer(static_cast<size_t>(tokens) * sizeof(int64_t));
    table = DeviceBuffer(static_cast<size_t>(c.max_position * c.head_dim) * sizeof(float));
    key_cache = DeviceBuffer(cache_elems * sizeof(C));
    value_cache = DeviceBuffer(cache_elems * sizeof(C));
    if constexpr (kvrope::kIsNvfp4<C>) {
      const size_t sf_bytes = static_cast<size_t>(slots * c.heads * c.nvfp4_scale_bytes());
      key_sf = DeviceBuffer(sf_bytes);
      value_sf = DeviceBuffer(sf_bytes);
    }
    scales = DeviceBuffer(3 * sizeof(float));
    error_flag = DeviceBuffer(sizeof(int));
    if (c.query_fp8) query_fp8 = DeviceBuffer(static_cast<size_t>(tokens * c.query_heads * c.head_dim));

    const uint64_t seed = splitmix64(opt.seed ^ (static_cast<uint64_t>(c.id) << 32) ^ 0x5E7Eull);
    fill_normal(pristine.as<T>(), tokens * width, seed, fill_blocks, stream);
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(qkv.as<T>(), pristine.as<T>(), qkv_bytes, cudaMemcpyDeviceToDevice, stream));
    fill_caches(stream);
    // Every copy on `stream` (non-blocking: the legacy stream's copies would not be ordered with its kernels).
    upload(positions, host.positions.data(), stream);
    upload(slot_mapping, host.slots.data(), stream);
    host_table = rope_table(c.max_position, c.head_dim);
    upload(table, host_table.data(), stream);
    const float s[3] = {kAppendKeyScale, kAppendValueScale, kAppendQueryScale};
    upload(scales, s, stream);
    if (c.query_fp8)
      KVROPE_BENCH_CUDA(cudaMemsetAsync(query_fp8.as<void>(), kAppendCachePattern, query_fp8.bytes(), stream));
    KVROPE_BENCH_CUDA(cudaMemsetAsync(error_flag.as<int>(), 0, sizeof(int), stream));
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  // buf.bytes() bytes from the host, on `stream` (from pageable memory: staged before the call returns).
  static void upload(const DeviceBuffer& buf, const void* src, cudaStream_t stream) {
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(buf.as<void>(), src, buf.bytes(), cudaMemcpyHostToDevice, stream));
  }

  // The table cache [max_position, R] of base 10000 (cos | sin of position * 10000^(-2i / R)), as serving
  // engines precompute it, in fp32.
  static std::vector<float> rope_table(int64_t max_position, int64_t R) {
    std::vector<float> t(static_cast<size_t>(max_position * R));
    std::vector<double> inv_freq(static_cast<size_t>(R / 2));
    for (int64_t i = 0; i < R / 2; ++i)
      inv_freq[static_cast<size_t>(i)] = std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(R));
    for (int64_t p = 0; p < max_position; ++p) {
      for (int64_t i = 0; i < R / 2; ++i) {
        const double angle = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
        t[static_cast<size_t>(p * R + i)] = static_cast<float>(std::cos(angle));
        t[static_cast<size_t>(p * R + R / 2 + i)] = static_cast<float>(std::sin(angle));
      }
    }
    return t;
  }

  kvrope::PagedCache<C> cache_of(const DeviceBuffer& buf) const { return pages_of(buf.as<C>(), cache_row); }

  // Pages of rows of `row` elements of E in the case's layout: NHD [pages, P, H, row], HND [pages, H, P, row].
  template <typename E>
  kvrope::PagedCache<E> pages_of(E* data, int64_t row) const {
    return sc.layout == AppendLayout::kNhd ? kvrope::nhd_pages(data, sc.page_size, sc.heads, row)
                                           : kvrope::hnd_pages(data, sc.page_size, sc.heads, row);
  }

  // The NVFP4 caches' block scales (rows of D / 16 bytes).
  kvrope::PagedCache<__nv_fp8_e4m3> block_scales_of(const DeviceBuffer& buf) const {
    return pages_of(buf.as<__nv_fp8_e4m3>(), sc.nvfp4_scale_bytes());
  }

  // A cache (or block-scale) buffer's rows as bytes: the strides of pages_of in bytes.
  kvrope::PagedCache<const uint8_t> byte_pages(const DeviceBuffer& buf, int64_t row_bytes) const {
    const kvrope::PagedCache<uint8_t> c = pages_of(buf.as<uint8_t>(), row_bytes);
    return {c.data, c.page_stride, c.offset_stride, c.head_stride};
  }

  // A variant's call: q rotated in place (with q_fp8, a q-fp8 case's kvrope variants: into query_out_fp8 in fp8
  // with the per-tensor query scale, q left as it was), k rotated in place only with key_in_place (never into
  // key_out), the table cache in fp32, RoPE(k) and v into the paged caches at slot_mapping, fp8 with per-tensor
  // scales, NVFP4 with global scales and the block scales beside; mRoPE cases: positions [3, T], contiguous
  // sections (AppendCase::mrope_sections).
  kvrope::AppendParams<T, C, Pos> params(bool key_in_place, bool q_fp8 = false) const {
    const int64_t Hq = sc.query_heads, H = sc.heads, D = sc.head_dim;
    T* base = qkv.as<T>();
    kvrope::AppendParams<T, C, Pos> p;
    p.tokens = tokens;
    p.heads = H;
    p.query_heads = Hq;
    p.head_dim = D;
    p.rotary_dim = D;
    p.style = kvrope::RotaryStyle::kRotateHalf;
    p.query = {base, width, D};
    p.key = {base + Hq * D, width, D};
    p.key_in_place = key_in_place;
    p.value = {base + (Hq + H) * D, width, D};
    p.positions = positions.as<const Pos>();
    if (sc.mrope) {
      sc.mrope_sections(p.mrope_section);
      p.position_stream_stride = tokens;
    }
    p.cos_sin_cache_f32 = table.as<const float>();
    p.max_position = sc.max_position;
    p.key_cache = cache_of(key_cache);
    p.value_cache = cache_of(value_cache);
    p.page_size = sc.page_size;
    p.num_pages = sc.pages();
    p.slot_mapping = slot_mapping.as<const int64_t>();
    if constexpr (kvrope::kIsQuantized<C>) {
      p.key_scale = scales.as<const float>();
      p.value_scale = scales.as<const float>() + 1;
    }
    if constexpr (kvrope::kIsNvfp4<C>) {
      p.key_block_scales = block_scales_of(key_sf);
      p.value_block_scales = block_scales_of(value_sf);
    }
    if (q_fp8 && sc.query_fp8) {
      p.query_out_fp8 = kvrope::thd(query_fp8.as<__nv_fp8_e4m3>(), Hq, D);
      p.query_scale = scales.as<const float>() + 2;
    }
    p.error_flag = error_flag.as<int>();
    return p;
  }

  void fill_caches(cudaStream_t stream) const {
    for (const DeviceBuffer* b : {&key_cache, &value_cache, &key_sf, &value_sf})
      if (b->bytes() > 0) KVROPE_BENCH_CUDA(cudaMemsetAsync(b->as<void>(), kAppendCachePattern, b->bytes(), stream));
  }

  // qkv back to the input, the caches to the pattern, the error flag to 0.
  void reset(cudaStream_t stream) const {
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(qkv.as<T>(), pristine.as<T>(), qkv.bytes(), cudaMemcpyDeviceToDevice, stream));
    fill_caches(stream);
    KVROPE_BENCH_CUDA(cudaMemsetAsync(error_flag.as<int>(), 0, sizeof(int), stream));
  }

  int read_error_flag(cudaStream_t stream) const {
    int flag = 0;
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(&flag, error_flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, stream));
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
    return flag;
  }

  // The naive reference's outputs, computed once a case (its key rotated in place, q in place in T: the naive
  // launches have no fp8 q; a q-fp8 case's fp8 q is checked against the CPU reference instead): empty, or why
  // it failed.
  const std::string& reference(cudaStream_t stream) {
    if (reference_ready) return reference_error;
    reference_ready = true;
    reset(stream);
    const kvrope::Status st = kvrope::reference::naive_append(params(true, false), stream);
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
    if (!st.ok()) return reference_error = status_message("naive_append", st);
    if (const int flag = read_error_flag(stream); flag != 0)
      return reference_error = "naive_append raised error_flag = " + std::to_string(flag);
    ref_qkv = DeviceBuffer(qkv.bytes());
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(ref_qkv.as<T>(), qkv.as<T>(), qkv.bytes(), cudaMemcpyDeviceToDevice, stream));
    const size_t row_bytes = static_cast<size_t>(tokens * sc.heads * sc.head_dim) * sizeof(C);
    ref_key_rows = DeviceBuffer(row_bytes);
    ref_value_rows = DeviceBuffer(row_bytes);
    const int64_t n = tokens * sc.heads * sc.head_dim;
    gather_cache_rows<C><<<fill_blocks, 256, 0, stream>>>(const_cache(key_cache), slot_mapping.as<const int64_t>(),
                                                          sc.page_size, sc.heads, sc.head_dim, n, ref_key_rows.as<C>());
    gather_cache_rows<C><<<fill_blocks, 256, 0, stream>>>(const_cache(value_cache), slot_mapping.as<const int64_t>(),
                                                          sc.page_size, sc.heads, sc.head_dim, n,
                                                          ref_value_rows.as<C>());
    KVROPE_BENCH_CUDA(cudaGetLastError());
    ensure_writer(stream);
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
    return reference_error;
  }

  // The writer of each slot (the last token naming it; -1: none) and the check's counts, made once a case.
  void ensure_writer(cudaStream_t stream) { ensure_slot_writers(host.slots, slots, writer, counts, stream); }

  kvrope::PagedCache<const C> const_cache(const DeviceBuffer& buf) const {
    const kvrope::PagedCache<C> c = cache_of(buf);
    return {c.data, c.page_stride, c.offset_stride, c.head_stride};
  }

  // One call of `launch` (which sets `status`) from the reset state, compared with the naive reference
  // (rounding_distance): q within 2 ulps of T; k unchanged, or within 2 ulps with key_in_place; v and the
  // value rows bit-exact; the key rows within 1 ulp of C (both round RoPE(k), evaluated in another order);
  // every other cache element untouched. With q_fp8 (the launch writes query_out_fp8): q bit-exact unchanged,
  // and the fp8 q checked on the host (check_query_fp8). The inputs are restored afterwards.
  // The NVFP4 and mRoPE cases (which the naive launches cannot do) go to check_reference instead.
  template <typename Launch>
  AppendCheck check(Launch&& launch, const kvrope::Status& status, bool key_in_place, bool q_fp8, cudaStream_t stream) {
    if constexpr (kvrope::kIsNvfp4<C>) {
      (void)q_fp8;
      return check_reference(launch, status, key_in_place, stream);
    } else {
      if (sc.mrope) return check_reference(launch, status, key_in_place, stream);
      return check_naive(launch, status, key_in_place, q_fp8, stream);
    }
  }

  template <typename Launch>
  AppendCheck check_naive(Launch&& launch, const kvrope::Status& status, bool key_in_place, bool q_fp8,
                          cudaStream_t stream) {
    AppendCheck out;
    if (const std::string& e = reference(stream); !e.empty()) {
      out.failure = "no reference: " + e;
      return out;
    }
    reset(stream);
    if (q_fp8)  // the pattern: whatever the call leaves unwritten shows
      KVROPE_BENCH_CUDA(cudaMemsetAsync(query_fp8.as<void>(), kAppendCachePattern, query_fp8.bytes(), stream));
    launch(stream);
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
    if (!status.ok()) {
      out.failure = status_message("kv_cache_rope_append", status);
      return out;
    }
    const int flag = read_error_flag(stream);
    const CompareCounts zero[kAppendRegions] = {};
    upload(counts, zero, stream);
    const int64_t Hq = sc.query_heads, H = sc.heads, D = sc.head_dim;
    CompareCounts* c = counts.as<CompareCounts>();
    // q: the naive reference's rotated q within 2 ulps, or with q_fp8 the input bit for bit (left as it was).
    compare_qkv<T><<<fill_blocks, 256, 0, stream>>>(qkv.as<const T>(), (q_fp8 ? pristine : ref_qkv).as<const T>(),
                                                    (key_in_place ? ref_qkv : pristine).as<const T>(),
                                                    pristine.as<const T>(), tokens * width, width, Hq * D, (Hq + H) * D,
                                                    q_fp8 ? 0 : 2, key_in_place ? 2 : 0, c);
    const uint32_t pattern = sizeof(C) == 1 ? kAppendCachePattern : (kAppendCachePattern * 0x0101u);
    compare_cache<C><<<fill_blocks, 256, 0, stream>>>(const_cache(key_cache), sc.page_size, H, D, slots,
                                                      writer.as<const int>(), ref_key_rows.as<const C>(), pattern, 1,
                                                      c + kRegionKeyRows, c + kRegionKeyOther);
    compare_cache<C><<<fill_blocks, 256, 0, stream>>>(const_cache(value_cache), sc.page_size, H, D, slots,
                                                      writer.as<const int>(), ref_value_rows.as<const C>(), pattern, 0,
                                                      c + kRegionValueRows, c + kRegionValueOther);
    KVROPE_BENCH_CUDA(cudaGetLastError());
    CompareCounts got[kAppendRegions];
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(got, c, sizeof(got), cudaMemcpyDeviceToHost, stream));
    // The fp8 q as the call left it (reset leaves query_fp8 alone).
    std::vector<__nv_fp8_e4m3> q8;
    if (q_fp8) {
      q8.resize(query_fp8.bytes());
      KVROPE_BENCH_CUDA(
          cudaMemcpyAsync(q8.data(), query_fp8.as<void>(), query_fp8.bytes(), cudaMemcpyDeviceToHost, stream));
    }
    reset(stream);
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));

    if (flag != 0) out.failure = "error_flag = " + std::to_string(flag) + "; ";
    if (q_fp8) out.failure += check_query_fp8(q8, stream);
    for (int r = 0; r < kAppendRegions; ++r) {
      const CompareCounts& g = got[r];
      if (g.bad > 0) {
        out.failure += std::string(append_region_name(r)) + ": " + std::to_string(g.bad) + " of " +
                       std::to_string(g.elements) + " beyond tolerance (max " + distance_text(g.max_dist) + ", first " +
                       place_text(r, g.first_bad) + "); ";
      } else if (g.not_exact > 0) {
        out.note += std::string(append_region_name(r)) + ": " + std::to_string(g.not_exact) + " of " +
                    std::to_string(g.elements) + " not bit-exact (max " + distance_text(g.max_dist) + "); ";
      }
    }
    return out;
  }

  // The q-fp8 cases' fp8 q `got` (a host copy of query_fp8 after the call) against the float64 reference,
  // kvrope::verify::check_append: each element the code quantize() gives for some q in T within the
  // tolerance of RoPE(q) (docs/spec.md §1.7), divided by the query scale. Only q's rows are checked there (the
  // device check covers the rest): an AppendParams without KV heads or pages, over host copies of the input
  // q, the positions, the table cache, the scale, and of query_fp8 before the call (the pattern). Empty, or
  // the failure with its first element.
  std::string check_query_fp8(const std::vector<__nv_fp8_e4m3>& got, cudaStream_t stream) const {
    const int64_t Hq = sc.query_heads, D = sc.head_dim;
    std::vector<T> q(static_cast<size_t>(tokens * width));  // qkv as given (q's columns are read)
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(q.data(), pristine.as<void>(), pristine.bytes(), cudaMemcpyDeviceToHost, stream));
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
    std::vector<__nv_fp8_e4m3> before(got.size());
    std::memset(static_cast<void*>(before.data()), kAppendCachePattern, before.size());
    const float query_scale = kAppendQueryScale;
    kvrope::AppendParams<T, C, Pos> in;
    in.tokens = tokens;
    in.heads = 0;
    in.query_heads = Hq;
    in.head_dim = D;
    in.rotary_dim = D;
    in.style = kvrope::RotaryStyle::kRotateHalf;
    in.query = {q.data(), width, D};
    in.query_out_fp8 = kvrope::thd(before.data(), Hq, D);
    in.query_scale = &query_scale;
    in.positions = host.positions.data();
    in.cos_sin_cache_f32 = host_table.data();
    in.max_position = sc.max_position;
    in.page_size = sc.page_size;
    in.num_pages = 0;
    kvrope::verify::AppendOutputs<T, C> out;
    out.query_out_fp8 = {got.data(), Hq * D, D};
    const kvrope::verify::CheckResult r = kvrope::verify::check_append(in, out);
    if (r.checked != tokens * Hq * D)  // the reference skipped rows: the check would prove nothing
      return "query_out_fp8: the reference compared " + std::to_string(r.checked) + " of " +
             std::to_string(tokens * Hq * D) + " elements; ";
    if (r.ok()) return "";
    return "query_out_fp8: " + std::to_string(r.mismatches) + " of " + std::to_string(r.checked) +
           " beyond tolerance (first " + r.first_mismatch + "); ";
  }

  // The check of the NVFP4 and mRoPE cases: one call of `launch` (which sets `status`) from the reset state,
  // then (the inputs restored afterwards)
  // - on the device, every cache row no token writes (NVFP4: its block scales too) still the fill pattern
  //   (compare_untouched_rows);
  // - on the host, against the float64 reference (kvrope::verify::check_append, docs/spec.md §1.7): q rotated
  //   within tolerance, k unchanged (or rotated within tolerance with key_in_place), v unchanged, and the cache
  //   rows the tokens wrote, gathered into a flat pool [T, H, row] (slot t for token t: each token of the
  //   suites writes its own slot): bf16, the key within tolerance (and bit-equal to k with key_in_place) and v
  //   bit-exact; NVFP4, each block (scale byte and codes) bit for bit with the reference fed the GPU's own
  //   quotient and reciprocal (nvfp4_block_scale_answers) where the call shows the key it quantized (v, and k
  //   with key_in_place), else within one step (check_append's rule). Positions as the call read them ([3, T]
  //   with mRoPE). Empty `failure`, or what failed with its first element.
  template <typename Launch>
  AppendCheck check_reference(Launch&& launch, const kvrope::Status& status, bool key_in_place, cudaStream_t stream) {
    AppendCheck out;
    const int64_t Hq = sc.query_heads, H = sc.heads, D = sc.head_dim, P = sc.page_size;
    constexpr bool nvfp4 = kvrope::kIsNvfp4<C>;
    const int64_t row_bytes = cache_row * static_cast<int64_t>(sizeof(C)), sf_bytes = sc.nvfp4_scale_bytes();
    ensure_writer(stream);
    if (!call_for_check(*this, launch, status, "kv_cache_rope_append", stream, out)) return out;
    const int flag = read_error_flag(stream);

    // The device's part: the rows no token names, as filled.
    const CompareCounts zero[kAppendRegions] = {};
    upload(counts, zero, stream);
    CompareCounts* c = counts.as<CompareCounts>();
    const int* w = writer.as<const int>();
    const uint8_t pattern = kAppendCachePattern;
    compare_untouched_rows<<<fill_blocks, 256, 0, stream>>>(byte_pages(key_cache, row_bytes), row_bytes, P, H, slots, w,
                                                            pattern, c + kRegionKeyOther);
    compare_untouched_rows<<<fill_blocks, 256, 0, stream>>>(byte_pages(value_cache, row_bytes), row_bytes, P, H, slots,
                                                            w, pattern, c + kRegionValueOther);
    if constexpr (nvfp4) {
      compare_untouched_rows<<<fill_blocks, 256, 0, stream>>>(byte_pages(key_sf, sf_bytes), sf_bytes, P, H, slots, w,
                                                              pattern, c + kRegionKeyOther);
      compare_untouched_rows<<<fill_blocks, 256, 0, stream>>>(byte_pages(value_sf, sf_bytes), sf_bytes, P, H, slots, w,
                                                              pattern, c + kRegionValueOther);
    }
    // The rows the tokens wrote, gathered [T, H, row] (bytes), and their block scales.
    const int64_t* slot_of = slot_mapping.as<const int64_t>();
    auto gather = [&](const DeviceBuffer& buf, int64_t bytes) {
      return gathered_rows(byte_pages(buf, bytes), slot_of, P, H, bytes, tokens, fill_blocks, stream);
    };
    const std::vector<uint8_t> key_rows = gather(key_cache, row_bytes), value_rows = gather(value_cache, row_bytes);
    std::vector<uint8_t> key_sf_rows, value_sf_rows;
    if constexpr (nvfp4) {
      key_sf_rows = gather(key_sf, sf_bytes);
      value_sf_rows = gather(value_sf, sf_bytes);
    }
    KVROPE_BENCH_CUDA(cudaGetLastError());
    CompareCounts got[kAppendRegions];
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(got, c, sizeof(got), cudaMemcpyDeviceToHost, stream));
    std::vector<T> before(static_cast<size_t>(tokens * width)), after(before.size());
    KVROPE_BENCH_CUDA(
        cudaMemcpyAsync(before.data(), pristine.as<void>(), pristine.bytes(), cudaMemcpyDeviceToHost, stream));
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(after.data(), qkv.as<void>(), qkv.bytes(), cudaMemcpyDeviceToHost, stream));
    reset(stream);
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));

    // The host's part (append_check_rows).
    kvrope::verify::Nvfp4Oracle oracle;
    if constexpr (nvfp4)
      oracle = [this, stream](const std::vector<std::array<float, 2>>& asked) { return nvfp4_answers(asked, stream); };
    const kvrope::verify::CheckResult r =
        append_check_rows<T, C>(sc, host.positions, host_table, before, after, key_rows, value_rows, key_sf_rows,
                                value_sf_rows, key_in_place, oracle);

    // Every q, k and v element, and at least one comparison a cache row: else the check proved nothing.
    add_reference_verdict(out.failure, flag, r, tokens * (Hq + 2 * H) * D + 2 * tokens * H, "wrote");
    for (const int region : {static_cast<int>(kRegionKeyOther), static_cast<int>(kRegionValueOther)}) {
      const CompareCounts& g = got[region];
      if (g.bad > 0)
        out.failure += std::string(append_region_name(region)) + ": " + std::to_string(g.bad) +
                       " bytes of rows no token names changed; ";
    }
    return out;
  }

  // The oracle's answers (verify::Nvfp4Oracle): each asked (amax, global scale)'s quotient and reciprocal as the
  // GPU computes them.
  std::vector<kvrope::reference::Nvfp4Approx> nvfp4_answers(const std::vector<std::array<float, 2>>& asked,
                                                            cudaStream_t stream) const {
    std::vector<kvrope::reference::Nvfp4Approx> answers(asked.size());
    if (asked.empty()) return answers;
    const size_t bytes = asked.size() * 2 * sizeof(float);
    DeviceBuffer d_asked(bytes), d_answers(bytes);
    std::vector<float> flat(2 * asked.size());
    for (size_t i = 0; i < asked.size(); ++i) {
      flat[2 * i] = asked[i][0];
      flat[2 * i + 1] = asked[i][1];
    }
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(d_asked.as<void>(), flat.data(), bytes, cudaMemcpyHostToDevice, stream));
    nvfp4_block_scale_answers<<<fill_blocks, 256, 0, stream>>>(
        d_asked.as<const float>(), static_cast<int64_t>(asked.size()), d_answers.as<float>());
    KVROPE_BENCH_CUDA(cudaGetLastError());
    KVROPE_BENCH_CUDA(cudaMemcpyAsync(flat.data(), d_answers.as<void>(), bytes, cudaMemcpyDeviceToHost, stream));
    KVROPE_BENCH_CUDA(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < asked.size(); ++i) answers[i] = {flat[2 * i], flat[2 * i + 1]};
    return answers;
  }

  static std::string distance_text(unsigned int d) {
    return d == 0xFFFFFFFFu ? std::string("NaN") : std::to_string(d) + " ulp";
  }

  // Where element `i` of a region is: token, head, element (qkv), or slot, head, element (caches).
  std::string place_text(int region, unsigned long long i) const {
    const int64_t D = sc.head_dim, H = sc.heads, at = static_cast<int64_t>(i);
    if (region <= kRegionV) return "token " + std::to_string(at / width) + " column " + std::to_string(at % width);
    return "slot " + std::to_string(at / (D * H)) + " head " + std::to_string((at / D) % H) + " element " +
           std::to_string(at % D);
  }
};

}  // namespace kvrope_bench
