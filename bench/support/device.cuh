// Device memory owners, host arrays and what the bench records of the GPU.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "check.cuh"

namespace kvrope_bench {

// Owns one cudaMalloc allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) KVROPE_BENCH_CUDA(cudaMalloc(&ptr_, bytes));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) KVROPE_BENCH_CUDA(cudaFree(ptr_));
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void swap(DeviceBuffer& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Uninitialized host array (the big cases' caches are half a gigabyte; zeroing them is waste).
template <typename T>
class HostArray {
 public:
  HostArray() = default;
  explicit HostArray(size_t n) : data_(static_cast<T*>(std::malloc(std::max<size_t>(n, 1) * sizeof(T)))), n_(n) {
    if (!data_) {
      std::fprintf(stderr, "kvrope_bench: out of host memory (%zu bytes)\n", n * sizeof(T));
      std::abort();
    }
  }
  T* data() const { return data_.get(); }
  size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t n_ = 0;
};

template <typename T>
HostArray<T> to_host(const DeviceBuffer& buf) {
  HostArray<T> host(buf.bytes() / sizeof(T));
  KVROPE_BENCH_CUDA(cudaMemcpy(host.data(), buf.as<T>(), buf.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

struct DeviceInfo {
  int device = 0;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t global_bytes = 0;
  int sm_clock_khz = 0;   // peak, as CUDA reports it (0: not reported)
  int mem_clock_khz = 0;  // peak, as CUDA reports it (0: not reported)
  int mem_bus_bits = 0;
  int driver_version = 0, runtime_version = 0;
  int fill_blocks() const { return std::max(1, sm_count) * 8; }  // grid of the fill and flush kernels
};

inline DeviceInfo query_device() {
  DeviceInfo d;
  KVROPE_BENCH_CUDA(cudaGetDevice(&d.device));
  cudaDeviceProp prop{};
  KVROPE_BENCH_CUDA(cudaGetDeviceProperties(&prop, d.device));
  d.name = prop.name;
  d.major = prop.major;
  d.minor = prop.minor;
  d.sm_count = prop.multiProcessorCount;
  d.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  d.global_bytes = prop.totalGlobalMem;
  // The clock attributes may be unsupported on some drivers; they are informational only.
  if (cudaDeviceGetAttribute(&d.sm_clock_khz, cudaDevAttrClockRate, d.device) != cudaSuccess) d.sm_clock_khz = 0;
  if (cudaDeviceGetAttribute(&d.mem_clock_khz, cudaDevAttrMemoryClockRate, d.device) != cudaSuccess)
    d.mem_clock_khz = 0;
  if (cudaDeviceGetAttribute(&d.mem_bus_bits, cudaDevAttrGlobalMemoryBusWidth, d.device) != cudaSuccess)
    d.mem_bus_bits = 0;
  (void)cudaGetLastError();  // clear a failed attribute query
  KVROPE_BENCH_CUDA(cudaDriverGetVersion(&d.driver_version));
  KVROPE_BENCH_CUDA(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

}  // namespace kvrope_bench
