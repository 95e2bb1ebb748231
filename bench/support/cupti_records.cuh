// CUPTI activity collection. CUPTI hands over filled buffers through a callback (possibly from its
// own thread); we keep the [start, end] of every kernel, memcpy and memset record.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include <cupti.h>

#include "check.cuh"

namespace kvrope_bench::cupti {

struct Span {
  uint64_t start;
  uint64_t end;
  bool harness;  // a kernel of the clock's own machinery (L2 flush, primer), never part of a call
};

inline bool is_harness_kernel(const char* name) {
  return name != nullptr && (std::strstr(name, "harness_l2_flush_kernel") != nullptr ||
                             std::strstr(name, "harness_primer_kernel") != nullptr);
}

inline std::mutex g_mutex;
inline std::vector<Span> g_spans;
// False under --clock=events (a profiler such as ncu or nsys holds the one CUPTI subscription).
inline bool g_enabled = false;
inline std::vector<uint8_t*> g_free_buffers;
constexpr size_t kBufferBytes = size_t{2} << 20;

// Touched once here: CUPTI asks for a buffer at the first activity after each flush, that is at the
// timed call, where page faults would land in the CUDA-event time. Delivered buffers are pooled.
inline uint8_t* new_buffer() {
  auto* buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));  // records are 8-byte aligned
  if (buffer == nullptr) {
    std::fprintf(stderr, "kvrope_bench: out of host memory for a CUPTI buffer\n");
    std::abort();
  }
  std::memset(buffer, 0, kBufferBytes);
  return buffer;
}

inline void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_free_buffers.empty()) {
      *buffer = g_free_buffers.back();
      g_free_buffers.pop_back();
    } else {
      *buffer = nullptr;
    }
  }
  if (*buffer == nullptr) *buffer = new_buffer();
  *size = kBufferBytes;
  *max_records = 0;
}

inline void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::vector<Span> spans;
  CUpti_Activity* record = nullptr;
  for (;;) {
    const CUptiResult res = cuptiActivityGetNextRecord(buffer, valid_bytes, &record);
    if (res == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
    KVROPE_BENCH_CUPTI(res);
    Span span{0, 0, false};
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        span = {k->start, k->end, is_harness_kernel(k->name)};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        span = {m->start, m->end, false};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        span = {m->start, m->end, false};
        break;
      }
      default: break;
    }
    // Start and end both 0: CUPTI could not time this one.
    if (span.start != 0 || span.end != 0) spans.push_back(span);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_spans.insert(g_spans.end(), spans.begin(), spans.end());
  g_free_buffers.push_back(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

// Tracing slows every launch down (and CUPTI's per-flush setup lands on the next launch), so the
// CUDA-event times a caller would see are measured with tracing off.
inline void set_tracing(bool on) {
  if (!g_enabled) return;
  for (CUpti_ActivityKind kind : kKinds) {
    KVROPE_BENCH_CUPTI(on ? cuptiActivityEnable(kind) : cuptiActivityDisable(kind));
  }
}

// Before the CUDA context exists.
inline void init() {
  g_enabled = true;
  for (int i = 0; i < 8; ++i) g_free_buffers.push_back(new_buffer());
  KVROPE_BENCH_CUPTI(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  set_tracing(true);
}

// Delivers every completed record (call after a device synchronize) and returns the spans
// collected since the last take().
inline std::vector<Span> flush_and_take(bool forced = false) {
  KVROPE_BENCH_CUPTI(cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0));
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<Span> spans;
  spans.swap(g_spans);
  return spans;
}

}  // namespace kvrope_bench::cupti
