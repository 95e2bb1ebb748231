// The clock: one timed call under the protocol (docs/spec.md §5.3): L2 flushed and the device
// synchronized before the call, its GPU span from CUPTI activity records, CUDA events beside it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include <cuda_runtime.h>

#include "check.cuh"
#include "cupti_records.cuh"
#include "device.cuh"
#include "l2_flush.cuh"

namespace kvrope_bench {

// Launched between the drain of the flush's records and the timed call, so that CUPTI's per-flush
// setup (a new activity buffer, ...) happens here and not inside the call's CUDA-event span.
__global__ void harness_primer_kernel() {}

struct Sample {
  double cupti_us = 0;  // first start to last end over the GPU activities of the call
  double event_us = 0;  // CUDA events recorded on the stream around the call (tracing on)
  int activities = 0;   // kernels + memcpys + memsets of the call
};

class GpuClock {
 public:
  // flush_reads: --flush=read (a diagnostic); primer: false only for --primer=0 (a diagnostic).
  GpuClock(cudaStream_t stream, const DeviceInfo& device, bool flush_reads, bool primer)
      : stream_(stream),
        flush_(std::max<size_t>(2 * device.l2_bytes, 1 << 20)),
        blocks_(device.fill_blocks()),
        flush_reads_(flush_reads),
        primer_(primer) {
    // Written once here, so that a flush by reads reads defined bytes.
    KVROPE_BENCH_CUDA(cudaMemset(flush_.as<void>(), 0x5a, flush_.bytes()));
    KVROPE_BENCH_CUDA(cudaEventCreate(&start_));
    KVROPE_BENCH_CUDA(cudaEventCreate(&stop_));
  }
  GpuClock(const GpuClock&) = delete;
  GpuClock& operator=(const GpuClock&) = delete;
  ~GpuClock() {
    KVROPE_BENCH_CUDA(cudaEventDestroy(start_));
    KVROPE_BENCH_CUDA(cudaEventDestroy(stop_));
  }

  cudaStream_t stream() const { return stream_; }
  size_t flush_bytes() const { return flush_.bytes(); }
  bool flush_reads() const { return flush_reads_; }

  // prepare(stream) runs before the flush (untimed, and evicted from L2); call(stream) is timed.
  // Returns activities == 0 when the call recorded no GPU work.
  template <typename Prepare, typename Call>
  Sample time(Prepare&& prepare, Call&& call) {
    if (!cupti::g_enabled) {  // --clock=events: the event time stands in for the span
      const double us = time_events(prepare, call);
      return {us, us, 1};
    }
    prepare_and_flush(prepare);

    // Drain the records of everything before the call. The flush kernel is the last of them, so the
    // end of its record is a fence: the call's activities start after it, late stragglers end before.
    uint64_t fence = 0;
    bool flush_seen = false;
    for (int attempt = 0; attempt < 2 && !flush_seen; ++attempt) {
      for (const auto& s : cupti::flush_and_take(attempt > 0)) {
        fence = std::max(fence, s.end);
        flush_seen = flush_seen || s.harness;
      }
    }
    if (!flush_seen) {
      std::fprintf(stderr, "kvrope_bench: CUPTI delivered no record of the L2 flush kernel\n");
      std::abort();
    }
    // CUPTI's setup after a flush lands on the primer, not on the call; its record is dropped by name.
    if (primer_) {
      harness_primer_kernel<<<1, 32, 0, stream_>>>();
      KVROPE_BENCH_CUDA(cudaGetLastError());
      KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
    }

    const double event_us = event_timed(call);

    Sample sample;
    uint64_t first = UINT64_MAX, last = 0;
    for (int attempt = 0; attempt < 2 && sample.activities == 0; ++attempt) {
      for (const auto& s : cupti::flush_and_take(attempt > 0)) {
        if (s.start < fence || s.harness) continue;
        first = std::min(first, s.start);
        last = std::max(last, s.end);
        ++sample.activities;
      }
    }
    sample.event_us = event_us;
    sample.cupti_us = sample.activities > 0 && last >= first ? 1e-3 * static_cast<double>(last - first) : 0.0;
    return sample;
  }

  template <typename Call>
  Sample time(Call&& call) {
    return time([](cudaStream_t) {}, std::forward<Call>(call));
  }

  // The same protocol with CUPTI tracing off (cupti::set_tracing(false) first): only the CUDA-event
  // time around the call, in us, launch overhead included.
  template <typename Prepare, typename Call>
  double time_events(Prepare&& prepare, Call&& call) {
    prepare_and_flush(prepare);
    return event_timed(call);
  }

 private:
  // prepare(stream), then the L2 flush, then a device synchronization.
  template <typename Prepare>
  void prepare_and_flush(Prepare&& prepare) {
    prepare(stream_);
    const int64_t n = static_cast<int64_t>(flush_.bytes() / sizeof(uint4));
    harness_l2_flush_kernel<<<blocks_, 256, 0, stream_>>>(flush_.as<uint4>(), n, ++salt_, flush_reads_);
    KVROPE_BENCH_CUDA(cudaGetLastError());
    KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
  }

  // call(stream) between two CUDA events, synchronized; returns the event time in us.
  template <typename Call>
  double event_timed(Call&& call) {
    KVROPE_BENCH_CUDA(cudaEventRecord(start_, stream_));
    call(stream_);
    KVROPE_BENCH_CUDA(cudaEventRecord(stop_, stream_));
    KVROPE_BENCH_CUDA(cudaDeviceSynchronize());
    float event_ms = 0;
    KVROPE_BENCH_CUDA(cudaEventElapsedTime(&event_ms, start_, stop_));
    return 1e3 * static_cast<double>(event_ms);
  }

  cudaStream_t stream_;
  DeviceBuffer flush_;
  int blocks_;
  bool flush_reads_;
  bool primer_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  uint32_t salt_ = 0;
};

}  // namespace kvrope_bench
