// Diagnostics of the fused kernel's timeline (bench/kvrope_probe_trace, never in a library build).
#pragma once

#include <cstring>

namespace kvrope::detail {

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
__device__ __forceinline__ void trace_at(int event, unsigned long long value) {
  const int warp = static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
  if ((threadIdx.x & 31) != 0 || warp >= kTraceWarps) return;
  if (event != kTraceRole) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(value));
  kvrope_trace[warp][event] = value;
}
// The global timer once `dep` (any value of up to 8 bytes) has arrived in its register: the read is
// predicated on a test of it, so it waits for the load that produces it.
template <typename V>
__device__ __forceinline__ void trace_after(int event, const V& dep) {
  unsigned long long word = 0;
  memcpy(&word, &dep, sizeof(V) < 8 ? sizeof(V) : 8);
  const int warp = static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
  if ((threadIdx.x & 31) != 0 || warp >= kTraceWarps) return;
  unsigned long long t;
  asm volatile(
      "{\n .reg .pred p;\n setp.eq.u64 p, %1, 0x7ff0123456789abc;\n @p mov.u64 %0, 1;\n"
      " @!p mov.u64 %0, %%globaltimer;\n}"
      : "=l"(t)
      : "l"(word)
      : "memory");
  kvrope_trace[warp][event] = t;
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
