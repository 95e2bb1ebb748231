// Device queries the launchers share: a per-thread cache of host-side queries, kernel attributes, occupancy.
#pragma once

#include <cuda_runtime_api.h>

#include <tuple>

#include "../../core/status.cuh"

namespace kvrope::detail {

// A per-thread cache of a host-side query (each costs microseconds): the value for `key`, computed by
// query(&value) on a miss; the 8 newest keys are kept. One cache per call site.
template <typename Key, typename Value, typename Query>
Status cached_query(const Key& key, Value* out, Query&& query) {
  struct Entry {
    Key key;
    Value value;
  };
  thread_local Entry cache[8] = {};
  thread_local int used = 0, next = 0;
  for (int i = 0; i < used; ++i)
    if (cache[i].key == key) {
      *out = cache[i].value;
      return {};
    }
  if (Status s = query(out); !s) return s;
  cache[next] = Entry{key, *out};
  next = (next + 1) % 8;
  used = used < 8 ? used + 1 : 8;
  return {};
}

// Whether `kernel` runs sm_90+ code: a build with only older PTX runs on Hopper through the JIT with
// the register copy, so the device's compute capability alone does not tell.
template <typename Kernel>
Status kernel_has_sm90_code(Kernel kernel, int device, bool* out) {
  return cached_query(std::make_tuple(reinterpret_cast<const void*>(kernel), device), out, [&](bool* sm90) {
    cudaFuncAttributes attr{};
    if (Status s = cuda_status(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes"); !s) return s;
    *sm90 = attr.ptxVersion >= 90;
    return Status{};
  });
}

// Blocks of `kernel` resident a SM at this shape. The first query of a kernel on a device allows it
// `allowed_shared` bytes of dynamic shared memory (the most any of its launches asks; 0: the default).
template <typename Kernel>
Status resident_blocks(Kernel kernel, int device, int block, int shared_bytes, int allowed_shared, int* out) {
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, block, shared_bytes);
  return cached_query(key, out, [&](int* blocks) {
    if (allowed_shared > 0)
      if (Status s =
              cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, allowed_shared),
                          "cudaFuncSetAttribute");
          !s)
        return s;
    return cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, block, shared_bytes),
                       "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  });
}

//! SMs of `device`, asked once a thread.
inline Status multiprocessors(int device, int* out) {
  return cached_query(device, out, [&](int* sms) {
    return cuda_status(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  });
}

inline Status device_attribute(cudaDeviceAttr attr, int device, int* out) {
  return cuda_status(cudaDeviceGetAttribute(out, attr, device), "cudaDeviceGetAttribute");
}

}  // namespace kvrope::detail
