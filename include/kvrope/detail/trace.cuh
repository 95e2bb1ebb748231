// Diagnostics of the fused kernel's timeline (bench/kvrope_probe_trace, never in a library build).
#pragma once

#include <cstring>

namespace kvrope::detail {

//! The global timer (ns) once `word` has arrived in its register: the read is predicated on a test
//! of it, so it waits for the load that produces it (diagnostics: the trace below, bench/startup_study).
__device__ __forceinline__ unsigned long long globaltimer_after(unsigned long long word) {
  unsigned long long t;
  asm volatile(
      "{\n .reg .pred p;\n setp.eq.u64 p, %1, 0x7ff0123456789abc;\n @p mov.u64 %0, 1;\n"
      " @!p mov.u64 %0, %%globaltimer;\n}"
      : "=l"(t)
      : "l"(word)
      : "memory");
  return t;
}

// Diagnostics (bench/kvrope_probe, never in a library build): with -DKVROPE_TRACE, lane 0 of every
// warp of the first kTraceWarps writes the global timer (ns) at its milestones (kTraceEvents).
#ifdef KVROPE_TRACE
inline constexpr int kTraceWarps = 4096;
enum TraceEvent {
  kTraceEntry,      // kernel entry
  kTraceMask,       // the first bitmask built (token warps: their share of it added)
  kTraceDone,       // the warp's work done (copy warp: its bulk stores complete)
  kTraceRole,       // not a time: 1 token warp, 2 copy warp
  kTraceStart,      // token warp: first item done; copy warp: speculative loads issued
  kTraceFirstData,  // copy warp: the first chunk landed in shared memory
  kTraceLastStore,  // copy warp: the last store issued
  kTracePosition,   // token warp: its first item's position arrived
  kTraceRowsIssued, // token warp: its first item's first row loads issued
  kTraceRows,       // token warp: its first item's first rows arrived
  kTraceEvents
};
__device__ unsigned long long kvrope_trace[kTraceWarps][kTraceEvents];
// This warp's record of `event` (lane 0 of a traced warp), or null.
__device__ __forceinline__ unsigned long long* trace_slot(int event) {
  const int warp = static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
  return (threadIdx.x & 31) == 0 && warp < kTraceWarps ? &kvrope_trace[warp][event] : nullptr;
}
__device__ __forceinline__ void trace_at(int event, unsigned long long value) {
  unsigned long long* slot = trace_slot(event);
  if (slot == nullptr) return;
  if (event != kTraceRole) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(value));
  *slot = value;
}
// The global timer once `dep` (any value of up to 8 bytes) has arrived in its register.
template <typename V>
__device__ __forceinline__ void trace_after(int event, const V& dep) {
  unsigned long long word = 0;
  memcpy(&word, &dep, sizeof(V) < 8 ? sizeof(V) : 8);
  if (unsigned long long* slot = trace_slot(event)) *slot = globaltimer_after(word);
}
#define KVROPE_TRACE_AT(event, value) ::kvrope::detail::trace_at(::kvrope::detail::event, value)
#define KVROPE_TRACE_DEP(cond, event, dep) \
  do {                                     \
    if (cond) ::kvrope::detail::trace_after(::kvrope::detail::event, dep); \
  } while (0)
#else
#define KVROPE_TRACE_AT(event, value) ((void)0)
#define KVROPE_TRACE_DEP(cond, event, dep) ((void)0)
#endif

}  // namespace kvrope::detail
